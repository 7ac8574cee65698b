"""Native reads and downloads in the exec helper: `sandboxes._scripts.READ_FILE` and
``DOWNLOAD`` without a process, their answers sent a step at a time from the helper's loop
(imported with `_files` when the helper idles or at its first file op: stdlib only, Python 3.6-compatible).

Why a step at a time: the loop is single-threaded, and a file read and sent whole would hold
it for as long as the client takes to take the bytes while every other command's output
waits. A turn of the loop sends one `STEP` of the answers in flight, and between two the loop
serves everything else; memory stays a step, and no size is too big to be native. A search's
or a listing's answer, made whole, goes out the same way (`sent_in_steps`).

The answers are the scripts', raw (`RAW`, where the scripts' are base64; `sandboxes._parse`
tells them apart): a read's is ``RAW`` and at most its limit of the file's bytes; a download's
is ``RAW`` and per file ``<status> <length>\\n`` and that many bytes, with the script's
statuses. A file's length is announced before its bytes: the bytes a first read of `STEP`
found, when the file ended there (whatever its size says: a pseudo-file of ``/proc`` or
``/sys`` says 0 or a page); else its size then. A file that turns out shorter than announced
(cut while it was sent), or a pseudo-file with more than a step, hands the whole download back
(N): the client drops what came and runs the script, which reads what is there then, bounded.
A file that grows meanwhile is sent as long as it was announced.
"""

import os
import stat

from ._loop import _streaming, send
from ._native import _MAX_PATH, _Answer, _answer, _NotNative, _why
from .frames import NOT_NATIVE, OUTPUT

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: `typing` is not imported in the sandbox
    from ._loop import Parts

RAW = b"\0"
"""The first byte of a native read's or download's answer, which the script's (base64, and a
download's ``!`` lines) never starts with: `sandboxes._parse` tells the two apart by it."""
STEP = 256 << 10
"""How much a turn of the loop sends of the answers in flight (at least this, or all of them;
less than twice this: `_step`, `step_streams`): big enough that a turn's own cost (a poll, a
read) is small beside sending the step, small enough that everything else waits at most about
one step."""
_FRAME = 64 << 10
"""The most bytes of one O frame (the client refuses frames over 1 MiB)."""


def stream_answer(ident: int, parts: "Parts") -> None:
    """Send the answer ``parts`` (`read_parts`, `download_parts`, `sent_in_steps`) a step a turn
    of the loop, from this one on (`step_streams`), until it ends."""
    _streaming[ident] = parts


def step_streams() -> None:
    """Steps of the answers in flight, each time of the one longest without (round robin), until
    `STEP` bytes went out this turn: however many are in flight, everything else waits at most
    about a step between two turns of the loop, and many small answers still leave together."""
    sent = 0
    while _streaming and sent < STEP:
        ident = next(iter(_streaming))
        parts = _streaming.pop(ident)
        more, size = _step(ident, parts, STEP - sent)
        sent += size
        if more:
            _streaming[ident] = parts  # to the back of the line


def stop_stream(ident: int) -> None:
    """K, the client's timeout: no more of it; answered as timed out."""
    parts = _streaming.pop(ident)
    parts.close()
    _answer(ident, None, timed_out=True)


def abort_streams() -> None:
    """The client is gone: close every file still being sent."""
    for parts in _streaming.values():
        parts.close()
    _streaming.clear()


def _step(ident: int, parts: "Parts", budget: int) -> "tuple[bool, int]":
    """Send pieces of ``parts`` (each at most `STEP` bytes) until ``budget`` bytes or more, so
    less than two steps' worth, joined (a download of many small files is a few frames, not two
    a file); (whether more is to come, how many bytes went). Its end is answered here: its exit
    code (what ``parts`` returns; none: 0), ``N`` (`_NotNative`: the script does it, the client
    drops what came), or the code of an `_Answer` raised before anything was sent (a read of
    what is not a file)."""
    pieces: "list[bytes]" = []
    size = 0
    try:
        while size < budget:
            piece = next(parts)
            pieces.append(piece)
            size += len(piece)
    except StopIteration as end:
        _send_output(ident, b"".join(pieces))
        _answer(ident, 0 if end.value is None else end.value)
        return False, size
    except _Answer as done:  # only before the first piece (`read_parts`)
        _answer(ident, done.code)
        return False, 0
    except Exception:  # _NotNative, or a surprise that must not end the helper: the script decides
        send(NOT_NATIVE, ident, answer=True)
        return False, 0
    _send_output(ident, b"".join(pieces))
    return True, size


def _send_output(ident: int, output: bytes) -> None:
    for offset in range(0, len(output), _FRAME):
        send(OUTPUT, ident, output[offset : offset + _FRAME])


def sent_in_steps(output: bytes, code: int) -> "Parts":
    """An answer made whole (a search's, a listing's: bounded, `_search.SEARCH_MAX_OUTPUT`),
    sent a step at a time all the same, then ``code``."""
    for offset in range(0, len(output), STEP):
        yield output[offset : offset + STEP]
    return code


def read_parts(path: str, limit: int) -> "Parts":
    """`sandboxes._scripts.READ_FILE`: at most ``limit`` bytes of the file. `_Answer` with the
    script's code (at the first step, nothing sent) when it cannot be read."""
    fd = _open_regular(path)
    try:
        yield RAW
        left = limit
        while left > 0:
            chunk = _read_up_to(fd, min(left, STEP))
            if not chunk:
                return None
            left -= len(chunk)
            yield chunk
    finally:
        os.close(fd)
    return None


def download_spec(op: "list[str]") -> "tuple[str, list[str]]":
    """(limit, paths) of a download ``op``; ValueError when malformed."""
    limit: "str | None"
    limit, paths = (op[1], op[2:]) if len(op) > 2 else (None, [])
    if not (limit == "-" or (limit is not None and limit.isdigit() and len(limit) <= 19)) or not paths:
        raise ValueError("wrong arguments for download")
    for path in paths:  # a lone surrogate: ValueError
        if not path.startswith("/") or "\0" in path or len(os.fsencode(path)) > _MAX_PATH:
            raise ValueError("bad path")
    return limit, paths


def download_parts(limit: str, paths: "list[str]") -> "Parts":
    """`sandboxes._scripts.DOWNLOAD` for ``limit`` (``-``: none) and ``paths``."""
    yield RAW
    for path in paths:
        try:
            fd = _open_regular(path)
        except _Answer as failed:
            yield b"%d 0\n" % failed.code
            continue
        try:
            if limit != "-" and os.fstat(fd).st_size > int(limit):  # `wc -c` counts what a read gives: st_size here
                yield b"17 0\n"
                continue
            first = _read_up_to(fd, STEP)
            size = len(first) if len(first) < STEP else os.fstat(fd).st_size  # short: the whole file
            if limit != "-" and max(size, len(first)) > int(limit):  # its size said less (a pseudo-file), or it grew
                yield b"17 0\n"
                continue
            if size < len(first):  # a pseudo-file with more than a step: the script reads it to its end
                raise _NotNative()
            yield b"0 %d\n" % size
            yield first
            left = size - len(first)
            while left > 0:
                chunk = _read_up_to(fd, min(left, STEP))
                if not chunk:  # cut since its length was announced
                    raise _NotNative()
                left -= len(chunk)
                yield chunk
        finally:
            os.close(fd)
    return None


def _open_regular(path: str) -> int:
    """An fd of the regular file at ``path`` (through symlinks), opened as the scripts' ``[ -f ]``
    then ``true < "$f"`` would find it; else `_Answer` with their code. Never opens what is not
    a regular file (a FIFO would block this loop)."""
    try:
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        regular = False
    if not regular:
        code = _why(path)
        raise _Answer(16 if code == 12 and os.path.exists(path) else code)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        raise _Answer(12) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped meanwhile
        os.close(fd)
        raise _NotNative()
    return fd


def _read_up_to(fd: int, wanted: int) -> bytes:
    """Up to ``wanted`` bytes of ``fd``, fewer only at its end. `_NotNative` on a read error:
    what ``head`` or ``base64`` does then is the script's to say."""
    data = b""
    try:
        while len(data) < wanted:
            chunk = os.read(fd, wanted - len(data))
            if not chunk:
                break
            data = chunk if not data else data + chunk
    except OSError:
        raise _NotNative() from None
    return data
