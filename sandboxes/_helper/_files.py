"""The dispatch of every native file op in the exec helper (`_native`'s writes, `_reads`' reads
and downloads, `_uploads`, `_search`, `_listing`; `_listdir` and `_usage`, whose modules come
with the op's request: `ON_DEMAND_OPS`), imported by `_server` when it idles or at its first file
op: stdlib only, Python 3.6-compatible.

Frames (see `_server`): F starts an op (``{"op": [name, args...]}``, `marshal`'d: the script's
arguments), I/C carry a write's bytes as they would a command's stdin, K aborts it; the answer
is X (``{code, timed_out}``, a read's O frames before it), E (a bad request) or N. A write's
bytes go to the file as they arrive (memory stays one frame), and a client that goes away leaves
no temporary file behind (`abort_native_ops`).
"""

from ._listing import LISTING_OPS, listing
from ._loop import _streaming, send
from ._native import _Answer, _answer, _NativeWrite, _NotNative, _op, _spec
from ._reads import (
    abort_streams,
    download_parts,
    download_spec,
    read_parts,
    sent_in_steps,
    step_streams,
    stop_stream,
    stream_answer,
)
from ._search import SEARCH_OPS, search
from ._uploads import NativeUpload, upload_spec
from .frames import ACCEPTED, ERROR, KILL, NOT_NATIVE, STDIN

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: `typing` is not imported in the sandbox
    from collections.abc import Callable

__all__ = ["abort_native_ops", "feed_native_op", "start_native_op", "step_streams"]

_native_ops: "dict[int, _NativeWrite | NativeUpload]" = {}  # id -> _NativeWrite, until answered


def start_native_op(ident: int, payload: bytes) -> None:
    """F: check and open; answer at once when the script would have stopped before reading."""
    send(ACCEPTED, ident)
    try:
        if ident in _native_ops or ident in _streaming:
            raise ValueError("op %d is already in flight" % ident)
        op = _op(payload)
        if op[0] in SEARCH_OPS:
            _answer_whole(ident, op, search)
            return
        if op[0] in LISTING_OPS:
            _answer_whole(ident, op, listing)
            return
        if op[0] == "list_dir":  # `_listdir`, shipped with the request
            from ._listdir import list_dir

            _answer_whole(ident, op, list_dir)
            return
        if op[0] == "e2b_metadata":  # `_xattrs`, shipped with the request
            from ._xattrs import metadata

            _answer_whole(ident, op, metadata)
            return
        if op[0] == "metrics":  # `_usage`, shipped with the request
            from ._usage import usage

            _answer_whole(ident, op, usage)
            return
        if op[0] == "download":  # `_reads`
            stream_answer(ident, download_parts(*download_spec(op)))
            return
        if op[0] == "upload":  # `_uploads`
            _start_upload(ident, upload_spec(op))
            return
        name, path, size, token, digest = _spec(op)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        send(ERROR, ident, ("bad file op: %s" % (exc,)).encode("utf-8", "replace"), answer=True)
        return
    if name == "read_file":
        stream_answer(ident, read_parts(path, size))
        return
    try:
        _native_ops[ident] = _NativeWrite(path, size, token, digest)
    except _NotNative:
        send(NOT_NATIVE, ident, answer=True)
    except _Answer as done:
        _answer(ident, done.code)
    except Exception:  # a surprise here must not end the helper: before any byte is placed, the script decides
        send(NOT_NATIVE, ident, answer=True)


def _start_upload(ident: int, spec: "tuple[str, list[tuple[str, int]]]") -> None:
    try:
        _native_ops[ident] = NativeUpload(ident, *spec)
    except Exception:  # one is written in place (_NotNative), or a surprise: nothing placed yet
        send(NOT_NATIVE, ident, answer=True)


def _answer_whole(ident: int, op: "list[str]", answer_for: "Callable[[list[str]], tuple[int, bytes] | None]") -> None:
    """The answer of `_search.search` or `_listing.listing` (``answer_for``): its output, then
    its exit code, a step at a time (`_reads.sent_in_steps`); or N."""
    try:
        answer = answer_for(op)
    except ValueError:
        raise
    except Exception:  # a surprise must not end the helper: the script decides (a delete: finishes)
        answer = None
    if answer is None:
        send(NOT_NATIVE, ident, answer=True)
        return
    code, output = answer
    stream_answer(ident, sent_in_steps(output, code))


def feed_native_op(kind: bytes, ident: int, payload: bytes) -> None:
    """I, C or K for an op in flight (anything else, or an op already answered: ignored)."""
    if ident in _streaming:  # an answer being sent (`_reads`): K stops it, nothing else is for it
        if kind == KILL:
            stop_stream(ident)
        return
    op = _native_ops.get(ident)
    if op is None:
        return
    if kind == STDIN:
        op.feed(payload)
        if op.failure is not None:  # answered now: the client stops sending the rest
            del _native_ops[ident]
            _answer(ident, op.finish())
        return
    del _native_ops[ident]
    if kind == KILL:  # the client's timeout: nothing is placed
        op.discard()
        _answer(ident, None, timed_out=True)
        return
    try:
        code = op.finish()
    except Exception as exc:  # as in `start_native_op`
        op.discard()
        send(ERROR, ident, ("%s: %s" % (type(exc).__name__, exc)).encode("utf-8", "replace"), answer=True)
        return
    _answer(ident, code)


def abort_native_ops() -> None:
    """The client is gone: nobody will send the rest, so no op is placed and no temp file stays."""
    abort_streams()
    for op in list(_native_ops.values()):
        op.discard()
    _native_ops.clear()
