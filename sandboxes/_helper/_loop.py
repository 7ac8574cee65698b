"""The exec helper's state and its way out: the frames queued for the client (`send`, `flush`),
the commands in flight, and the poller the loop in `_server` waits on; shared by `_server`,
`_command` and the file ops, so that none of them imports another's loop. Stdlib only, Python
3.6-compatible.
"""

import os
import select
import time

from .frames import EXIT, HEADER

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: `typing` is not imported in the sandbox
    from collections.abc import Callable, Generator

    Parts = Generator[bytes, None, int | None]  # a file op's answer, a piece at a time, then its exit code
    from typing import Any, Protocol  # novermin (never run: mypy only)

    class Running(Protocol):
        """An entry of the table of commands in flight (`_command.Command`, `_watch.Watch`): what
        the loop hands it (its frames, its deadlines, the client leaving)."""

        ident: int
        finished: bool

        def start(self) -> None: ...
        def feed(self, data: "bytes | None") -> None: ...
        def stop(self) -> None: ...
        def kill(self) -> None: ...
        def close_output(self) -> None: ...
        def close_stdin(self) -> None: ...
        def resize(self, payload: bytes) -> None: ...
        def next_deadline(self) -> "float | None": ...
        def on_deadline(self, now: float) -> None: ...


NATIVE_OPS = [
    "write",
    "cas_write",
    "read_file",
    "download",
    "upload",
    "grep",
    "find_files",
    "ls",
    "delete",
    "metrics",
    "list_dir",
    "e2b_metadata",
]
"""The file ops this helper answers without a process (`_files`, `_uploads`, `_search`'s
``SEARCH_OPS``, `_listing`'s ``LISTING_OPS``, `_listdir`'s ``list_dir``, `_xattrs`' ``e2b_metadata``, `_usage`'s
``metrics``), named in the hello before their code is compiled (`_load_native`)."""
MAX_FRAME = 64 << 20
DRAIN_GRACE = 0.2
TIMED_OUT_DRAIN = 2.0
HOLD = 0.005
"""Seconds an acknowledgement or output frame may wait for the next frame (see `send`): far
below anything a client times (its acknowledgement timeout is seconds), about what a short
command takes, so that its A, O and X go out together."""
HOLD_BYTES = 64 << 10
_session = os.urandom(8).hex()
_base_env = dict(os.environ)
_inbox = bytearray()
_outbox = bytearray()  # frames queued for the client (`send`)
_held_until: "list[float | None]" = [None]  # when the oldest frame held in _outbox must go out; None: none held
_chunk = bytearray(1 << 20)  # read into, not allocated per read: os.read(fd, 1 MiB) mmaps a fresh buffer
_serving = [True]
_gone = [False]  # the client is gone for good: frames are dropped, not queued (`_record.linger`)
_subreaper = [False]
_undumpable = [False]
# (pid, starttime) of the container's own command, when in a container's pid namespace
_main: "list[tuple[int, int] | None]" = [None]
# (pid, starttime) -> marker of each background job's supervisor the helper saw started (`_reap`)
_jobs: "dict[tuple[int, int], bytes]" = {}
_markers = [0]  # of the shells started ahead of their command (`_spawn`)
_streaming: "dict[int, Parts]" = {}  # id -> a file op's answer being sent, a step a turn (`_reads`)


class _Poller:
    """fd -> callback(events) over epoll (poll elsewhere): the selectors module adds a
    layer of Python to every registration, and every command registers its output."""

    READ = select.POLLIN | select.POLLHUP | select.POLLERR
    WRITE = select.POLLOUT | select.POLLERR

    def __init__(self) -> None:
        self.epoll = hasattr(select, "epoll")
        self.poller: "Any" = select.epoll() if self.epoll else select.poll()
        self.callbacks: "dict[int, Callable[[int], None]]" = {}

    def register(self, fd: int, events: int, callback: "Callable[[int], None]") -> None:
        self.poller.register(fd, events)
        self.callbacks[fd] = callback

    def modify(self, fd: int, events: int) -> None:
        self.poller.modify(fd, events)

    def unregister(self, fd: int) -> None:
        self.poller.unregister(fd)
        del self.callbacks[fd]

    def poll(self, timeout: "float | None") -> "list[tuple[Callable[[int], None], int]]":
        """[(callback, events)] ready within ``timeout`` seconds (``None``: no limit)."""
        if self.epoll:
            ready = self.poller.poll(-1 if timeout is None else timeout)
        else:
            ready = self.poller.poll(None if timeout is None else timeout * 1000)
        return [(self.callbacks[fd], events) for fd, events in ready if fd in self.callbacks]


_poller = _Poller()


def send(kind: bytes, ident: int, payload: "bytes | memoryview" = b"", answer: bool = False) -> None:
    """Queue one frame for the client. An ``answer`` (hello, exit, error) goes out at the end of
    this turn of the loop, with everything queued before it and the turn's other answers (20
    commands ending together: one write, not 20); an
    acknowledgement or output waits at most `HOLD` seconds, or until `HOLD_BYTES` are queued,
    for the next frame: a short command's A, O and X then leave in one write, which is one SSH
    packet (or pipe read, or docker frame) and one wake-up of the client's reader instead of
    three. The order of frames is kept. Once the client is gone (`_gone`), nothing is queued."""
    if _gone[0]:
        return
    _outbox.extend(HEADER.pack(kind, ident, len(payload)))
    if len(payload) >= HOLD_BYTES:  # out now, with what is queued, and not copied into the outbox
        flush(payload)
        return
    _outbox.extend(payload)
    if len(_outbox) >= HOLD_BYTES:
        flush()
    elif answer:
        _held_until[0] = 0.0  # at the end of this turn of the loop, with the turn's other answers
    elif _held_until[0] is None:
        _held_until[0] = time.monotonic() + HOLD


def send_exit(ident: int, code: "int | None", timed_out: bool = False) -> None:
    """Answer X: ``{"code": code, "timed_out": timed_out}``."""
    send(EXIT, ident, _json({"code": code, "timed_out": timed_out}).encode(), answer=True)


def _json(value: object) -> str:
    """``json.dumps(value)`` of the helper's own answers (None, bools, ints, and dicts, lists and
    strings of them), without `json`: importing it (with `re` and `enum`) and `signal` (with
    `enum`; hence `_signal`, the C module behind it, with the same calls and numbers) would
    weigh on every helper's start. What the client sends comes
    `marshal`'d, which is built in; what it reads from here stays JSON, which it parses as the
    hostile bytes they may be."""
    if value is None or value is True or value is False:
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return "%d" % value
    if isinstance(value, dict):
        return "{%s}" % ", ".join("%s: %s" % (_json(str(k)), _json(v)) for k, v in value.items())
    if isinstance(value, list):
        return "[%s]" % ", ".join(_json(v) for v in value)
    if not isinstance(value, str):
        raise TypeError("%s is not one of the helper's answers' types" % type(value).__name__)
    return '"%s"' % "".join(c if " " <= c <= "~" and c not in '"\\' else _json_escape(c) for c in value)


def _json_escape(char: str) -> str:
    code = ord(char)
    if code > 0xFFFF:  # JSON's escapes are UTF-16
        code -= 0x10000
        return "\\u%04x\\u%04x" % (0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF))
    return "\\u%04x" % code


def flush(tail: "bytes | memoryview" = b"") -> None:
    """Write every queued frame, then ``tail`` (the payload of a frame whose header was queued
    last: `send`'s big payloads, not copied into the outbox), blocking, whole. A client gone (its
    end of the stream closed) ends the serving as the end of its input does, into the loop's
    cleanup (its commands killed, its file ops aborted): a traceback here skipped that, and
    left its commands running."""
    _held_until[0] = None
    if not _outbox and not tail:
        return
    with memoryview(_outbox) as queued, memoryview(tail) as rest:
        done, total = 0, len(queued) + len(rest)
        while done < total:
            try:
                if done >= len(queued):
                    done += os.write(1, rest[done - len(queued) :])
                elif rest:
                    done += os.writev(1, [queued[done:], rest])
                else:
                    done += os.write(1, queued[done:])
            except BlockingIOError:  # someone made the stream non-blocking: wait, as a blocking write would
                select.select([], [1], [])
            except (BrokenPipeError, ConnectionResetError):  # the client is gone: as at the end of its input
                _serving[0] = False
                break
    del _outbox[:]


def add_sources(sources: str) -> None:
    """A request's ``sources`` (an R's or an F's): modules left out of the bootstrap (`_watch`,
    `_pty`, `_listdir`...), added to what the helper's importer serves, for this request and
    every later one."""
    import binascii
    import marshal
    import sys
    import zlib

    for finder in sys.meta_path:
        shipped = getattr(finder, "shipped", None)
        if isinstance(shipped, dict):
            packed = zlib.decompress(binascii.a2b_base64(sources))
            for name, source in marshal.loads(packed).items():  # noqa: S302 (the client's own, `ON_DEMAND`)
                shipped.setdefault(name, source)
