"""A relayed connection in the exec helper (`_server`): an R request whose spec carries
``relay: {"port": P}`` opens a TCP connection to 127.0.0.1:P inside the sandbox instead of
starting a process, and its bytes go both ways over the helper's stream. Stdlib only, Python
3.6-compatible; imported by the first such request.

Frames of a relay (its command id is the request's):
  client -> helper: I bytes for the socket, C the end of them (shutdown(SHUT_WR) once written),
                    K close it now, G bytes of O frames the client's consumer took (4 bytes)
  helper -> client: G once connected, the window the client may send ahead, then what was
                    written to the socket of its I frames (a quarter of the window at
                    least); O the socket's bytes, an empty O the end of them (the peer
                    shut down writing); X (code 0) once both
                    directions ended, (code null) after K; E the reason it failed (nothing
                    listens on the port, a reset)
Flow control both ways: the helper sends at most ``window`` bytes the client has not granted
back, and stops polling the socket for reading while they are spent; the client sends at most
`WINDOW` bytes the helper has not granted back (more is a broken client: the relay fails). So
neither side ever buffers more than a window of a connection, however slow the other reads,
and a stalled connection holds nothing but its own socket: commands and other relays go on.
Every byte of the socket's is counted against the window before it leaves, whichever way it is
read: spliced by the kernel to the helper's stdout (`_splice_out`), or read into its memory.
The client's bytes of a big I frame go the same way back where the helper's stdin is a pipe
(`pass_frame`): what the socket takes at once is spliced from stdin to it, never through the
helper's memory; what it does not take now is read and queued as any frame's, so a full socket
never holds up the helper's stream.
"""

import errno
import fcntl
import os
import select
import socket
import stat
import struct

from ._loop import _outbox, _poller, _serving, flush, send, send_exit
from .frames import CLOSE_STDIN, ERROR, GRANT, HEADER, KILL, OUTPUT, STDIN

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: `typing` is not imported in the sandbox
    from typing import Any

WINDOW = 1 << 20
"""Bytes of the client's I frames the helper queues toward a socket before granting them back."""
GRANT_AT = WINDOW // 4
"""Bytes of the client's written to a socket that are granted back together (a quarter of the
window: the client goes on sending while the rest of it is in flight, and a grant costs a frame,
a write and a wake-up of the client's reader per quarter, not per frame). The client never waits
on fewer: its credit runs out only once a whole window was sent, and then at least a quarter of
it is written, or waits in the queue for the socket."""
MAX_WINDOW = 16 << 20
"""The largest window a client may ask the helper to send ahead."""
CHUNK = (256 << 10) - 9
"""The most bytes read from a socket at a time (one O frame: with its header, 256 KiB, what the
client reads at a time)."""
_into = bytearray(CHUNK)  # read into, not allocated per read (one relay reads at a time)
_view = memoryview(_into)
READS = 4
"""Reads of a socket per event at most (a turn of the loop for the others in between)."""
_COUNT = struct.Struct(">I")
_IN = 0x001  # select.POLLIN (and EPOLLIN)
_OUT = 0x004  # select.POLLOUT (and EPOLLOUT)
_relays: "dict[int, Relay]" = {}  # id -> Relay, until it ended
_fed: "list[Relay]" = []  # relays fed frames by the read being handled (`write_fed`)
_IOV = 64  # queued frames written by one sendmsg at most
PIPE_SIZE = 256 << 10
"""The kernel buffer asked for the helper's stdin and stdout when they are pipes, and for its
splice pipe: a relay's frame then crosses in one write, not one per 64 KiB (the default). Not
more: an unprivileged user's pipes share a quota (``/proc/sys/fs/pipe-user-pages-soft``)."""
_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Linux), named by `fcntl` only from Python 3.10


def _widen_pipes() -> None:
    """Ask for `PIPE_SIZE` on the helper's stream when it is a pipe; anything else (a socket, a
    kernel that refuses, a user over its pipe quota) keeps what it has."""
    for fd in (0, 1):
        try:
            fcntl.fcntl(fd, _SETPIPE_SZ, PIPE_SIZE)
        except (OSError, ValueError):
            pass


_SPLICE_MOVE, _SPLICE_NONBLOCK = 1, 2  # os.SPLICE_F_MOVE, os.SPLICE_F_NONBLOCK
_UNSPLICEABLE = (errno.EINVAL, errno.EPERM, errno.ENOSYS, errno.EOPNOTSUPP)
_spliced: "list[int]" = []  # the helper's own pipe (read, write) a socket's bytes pass through; none: no splice


def _open_splice() -> None:
    """Splice a socket's bytes to the client (`_splice_out`) where Python has `os.splice`
    (3.10) and the helper's stdout is a pipe; else every read goes through the helper's memory."""
    if getattr(os, "splice", None) is None or not stat.S_ISFIFO(os.fstat(1).st_mode):
        return
    pipe = os.pipe()
    try:
        fcntl.fcntl(pipe[1], _SETPIPE_SZ, PIPE_SIZE)
    except OSError:  # as big as it is: a splice takes no more than it holds
        pass
    _spliced.extend(pipe)


def _splice_out(ident: int, fd: int, want: int) -> int:
    """An O frame of at most ``want`` bytes of socket ``fd``, moved by the kernel from the socket
    to the helper's pipe and on to its stdout, never through its memory: how many (0: the socket's
    end); -1 when the kernel will not splice them (then never again: the caller reads instead).
    The pipe is empty between calls: only the bytes this call took are framed."""
    try:
        size = os.splice(fd, _spliced[1], want, flags=_SPLICE_MOVE | _SPLICE_NONBLOCK)  # novermin
    except OSError as exc:
        if exc.errno not in _UNSPLICEABLE:
            raise
        for end in _spliced:
            os.close(end)
        del _spliced[:]
        return -1
    if size:
        _outbox.extend(HEADER.pack(OUTPUT, ident, size))
        flush()  # the frames queued before it, and its header
        _move_out(size)
    return size


def _move_out(size: int) -> None:
    """The ``size`` bytes in the helper's pipe, to its stdout (blocking, as `flush` writes)."""
    while size and _serving[0]:
        try:
            size -= os.splice(_spliced[0], 1, size)  # novermin
        except BlockingIOError:
            select.select([], [1], [])
        except (BrokenPipeError, ConnectionResetError):  # the client is gone: so is the serving
            _serving[0] = False
        except OSError:  # a stdout that takes no splice after all: copied through memory
            data = os.read(_spliced[0], size)
            _outbox.extend(data)
            flush()
            size -= len(data)


PASS_MIN = 64 << 10
"""An I frame's payload this long or longer may be spliced from the helper's stdin (`pass_frame`)."""
_splice_in: "list[bool]" = []  # [True]: stdin is a pipe and Python has `os.splice`
_passing: "list[int]" = []  # [relay id, bytes of its I frame's payload still in stdin]; []: none
_header_next = [False]  # a relay's upload streams in: stdin is read a frame's header at a time
_head = bytearray()  # the header being read (`take_input`)


def _open_splice_in() -> None:
    if getattr(os, "splice", None) is not None and stat.S_ISFIFO(os.fstat(0).st_mode):
        _splice_in.append(True)


def pass_frame(kind: bytes, ident: int, length: int, data: "memoryview | bytes", start: int) -> bool:
    """Whether the rest of the I frame whose header and first bytes were read (``data`` from
    ``start``) is left in stdin for `take_input` to move to its relay's socket: a big frame for a
    connected relay that has room for all of it in its window, where splicing is possible. No
    view of ``data`` outlives the call (it may be the loop's inbox, resized next)."""
    relay = _relays.get(ident)
    if kind != STDIN or not _splice_in or length < PASS_MIN or relay is None:
        return False
    if not relay.connected or not relay.writing or relay.closing or relay.queued + length > WINDOW:
        return False  # (the frame, read whole, fails the relay that has no room for it)
    part = bytes(data[start + HEADER.size :])
    if part:
        relay.feed(STDIN, part)
    _passing[:] = [ident, length - len(part)]
    return True


def taking_input(inbox: bytearray) -> bool:
    """Whether the helper's next read of stdin is `take_input`'s: the rest of a passed frame, or
    the header of the next one once a big I frame was read whole and nothing after it."""
    if _header_next[0] and inbox:  # part of the next frame was read with it: not now
        _header_next[0] = False
    return bool(_passing) or _header_next[0]


def take_input(inbox: bytearray) -> None:
    """One read of stdin while a relay's upload streams in: the rest of its I frame (`_pass_rest`),
    or the next frame's header alone, so that its payload may be spliced too; any other frame's
    header goes to ``inbox``, where the loop's reads go on from."""
    if _passing:
        _pass_rest()
        return
    part = os.read(0, HEADER.size - len(_head))
    if not part:
        _serving[0] = False  # the client's end of the stream
        return
    _head.extend(part)
    if len(_head) < HEADER.size:
        return
    kind, ident, length = HEADER.unpack_from(_head)
    passed = pass_frame(kind, ident, length, b"", -HEADER.size)
    if not passed:
        _header_next[0] = False
        inbox.extend(_head)
    del _head[:]
    if passed:  # its payload most likely came with it: spliced now, not a turn of the loop later
        _pass_rest(ready=False)


def _pass_rest(ready: bool = True) -> None:
    """Bytes of the I frame being passed: spliced from stdin to the socket while the relay has
    nothing queued and the socket takes them, else read into the helper's memory and queued
    (or dropped: its relay ended meanwhile), as a frame's bytes read whole are. Not ``ready``
    (stdin was not reported readable): only a splice is tried, which cannot block."""
    ident, left = _passing
    relay = _relays.get(ident)
    moved = -1
    if relay is not None and relay.writing and not relay.queue and _splice_in:
        moved = relay.splice_in(left)
    if moved < 0:
        if not ready:  # (stdin empty, or the socket full): the loop's next turn sees which
            return
        moved = os.readv(0, [_view[: min(left, CHUNK)]])
        if moved and relay is not None:
            relay.feed(STDIN, bytes(_view[:moved]))
    if not moved:
        _serving[0] = False  # the client's end of the stream, mid-frame
        return
    if moved < left:
        _passing[1] = left - moved
    else:
        del _passing[:]
        _header_next[0] = True


def _reason(code: int, port: int) -> str:
    if code == errno.ECONNREFUSED:
        return "connection refused: nothing listens on port %d in the sandbox" % port
    return "connection to port %d failed: %s" % (port, os.strerror(code))


class Relay(object):
    """One TCP connection to 127.0.0.1:port, its bytes relayed both ways within their windows."""

    def __init__(self, ident: int, spec: "dict[str, Any]") -> None:
        port, window = spec.get("port"), spec.get("window", WINDOW)
        accepted = spec.get("accepted")
        if accepted is not None:  # a connection a listener took (`Listener`): already connected
            if type(accepted) is not int or accepted not in _accepted:
                raise ValueError("no accepted connection %r waits" % (accepted,))
            sock, port = _accepted.pop(accepted)
        if type(port) is not int or not 0 < port < 65536:
            raise ValueError("a relay needs a port from 1 to 65535, not %r" % (port,))
        if type(window) is not int or not 0 < window <= MAX_WINDOW:
            raise ValueError("a relay's window is 1 to %d bytes, not %r" % (MAX_WINDOW, window))
        self.ident, self.port, self.window = ident, port, window
        self.unacked = 0  # bytes sent the client has not granted back
        self.ungranted = 0  # the client's bytes written to the socket, not yet granted back
        self.queue: "list[memoryview]" = []  # the client's bytes toward the socket
        self.queued = 0
        self.connected = False
        self.reading = True  # the socket's bytes may still come
        self.writing = True  # the client's may still go (until C is written and shut down)
        self.closing = False  # C came
        self.hung_up = False  # the socket reported a hang-up: polled only to read what is left
        self.events = -1  # as registered with the poller; -1: not registered
        if accepted is not None:
            self.sock = sock
            self.sock.setblocking(False)
        else:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setblocking(False)
            code = self.sock.connect_ex(("127.0.0.1", port))
            if code not in (0, errno.EINPROGRESS):
                self.sock.close()
                raise ConnectionError(_reason(code, port))
        self.fd = self.sock.fileno()
        _relays[ident] = self
        if accepted is not None:
            self.connected = True
            send(GRANT, ident, _COUNT.pack(WINDOW), answer=True)  # connected: the client's credit
        self.update()

    def update(self) -> None:
        """Poll the socket for what the relay can take now: its connection's end, its bytes while
        the window allows, room for queued bytes. Not at all when none: a half-closed socket
        would report its hang-up on every turn."""
        if self.ident not in _relays:
            return
        events = 0 if self.connected else _OUT
        if self.connected and self.reading and self.unacked < self.window:
            events |= _IN
        if self.connected and self.queue and not self.hung_up:
            events |= _OUT
        if events == self.events or (events == 0 and self.events == -1):
            return
        if events == 0:
            _poller.unregister(self.fd)
            self.events = -1
        elif self.events == -1:
            _poller.register(self.fd, events, self.on_event)
            self.events = events
        else:
            _poller.modify(self.fd, events)
            self.events = events

    def on_event(self, mask: int) -> None:
        if not self.connected:
            code = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                self.fail(_reason(code, self.port))
                return
            self.connected = True
            send(GRANT, self.ident, _COUNT.pack(WINDOW), answer=True)  # connected: the client's credit
            self.write()
        elif mask & ~(_IN | _OUT) and not mask & _IN:  # a hang-up or an error, and nothing to read now
            code = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                self.fail("connection to port %d broke: %s" % (self.port, os.strerror(code)))
                return
            self.hung_up = True  # what is left is read once the window allows
            self.read()
        else:
            if mask & _IN:
                self.read()
            if mask & _OUT:
                self.write()
        self.update()

    def read(self) -> None:
        for _ in range(READS):
            if not self.reading or self.unacked >= self.window or self.ident not in _relays:
                return
            want = min(CHUNK, self.window - self.unacked)
            try:
                size = _splice_out(self.ident, self.fd, want) if _spliced else -1
                if size < 0:  # no splice here: through the helper's memory, one copy
                    size = self.sock.recv_into(_into, want)
                    if size:
                        send(OUTPUT, self.ident, _view[:size], answer=True)  # at the end of this turn
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.fail("connection to port %d broke: %s" % (self.port, exc))
                return
            if not size:
                self.reading = False
                send(OUTPUT, self.ident, b"", answer=True)  # the end of the socket's bytes
                self.end_if_done()
                return
            self.unacked += size
            if size < want:  # nothing more for now
                return

    def write(self) -> None:
        granted = 0
        while self.queue and self.ident in _relays:
            try:  # every queued frame in one system call (and one wake-up of the socket's reader)
                written = self.sock.sendmsg(self.queue[:_IOV])
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self.fail("connection to port %d broke: %s" % (self.port, exc))
                return
            granted += written
            while self.queue and written >= len(self.queue[0]):
                written -= len(self.queue.pop(0))
            if written:  # the socket took part of a frame: it is full
                self.queue[0] = self.queue[0][written:]
                break
        self.queued -= granted
        self.grant(granted)
        if not self.queue and self.closing and self.writing:
            self.writing = False
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:  # the peer is gone already: so is this direction
                pass
            self.end_if_done()

    def splice_in(self, left: int) -> int:
        """Up to ``left`` bytes of the client's moved by the kernel from the helper's stdin to the
        socket, and granted back: how many (0: stdin's end); -1 when the socket takes none now,
        or never will (it broke: the relay failed; or no splice here: never again)."""
        try:
            moved = os.splice(0, self.fd, left, flags=_SPLICE_MOVE | _SPLICE_NONBLOCK)  # novermin
        except (BlockingIOError, InterruptedError):  # the socket is full (stdin was readable)
            return -1
        except OSError as exc:
            if exc.errno in _UNSPLICEABLE:
                del _splice_in[:]
            else:
                self.fail("connection to port %d broke: %s" % (self.port, exc))
            return -1
        self.grant(moved)
        return moved

    def grant(self, written: int) -> None:
        """``written`` more of the client's bytes went to the socket: granted back once
        `GRANT_AT` of them add up."""
        self.ungranted += written
        if self.ungranted >= GRANT_AT:
            send(GRANT, self.ident, _COUNT.pack(self.ungranted), answer=True)
            self.ungranted = 0

    def feed(self, kind: bytes, payload: bytes) -> None:
        """A client's frame for this relay."""
        if kind == STDIN and self.writing and not self.closing:
            if self.queued + len(payload) > WINDOW:
                self.fail("the client sent more than its window of %d bytes" % WINDOW)
                return
            self.queue.append(memoryview(payload))
            self.queued += len(payload)
            if len(payload) >= PASS_MIN and _splice_in:  # an upload streams in: its next frames may pass
                _header_next[0] = True
        elif kind == CLOSE_STDIN:
            self.closing = True
        elif kind == GRANT and len(payload) == _COUNT.size:
            self.unacked = max(0, self.unacked - _COUNT.unpack(payload)[0])
        elif kind == KILL:  # what came before it still goes, as far as the socket takes it now
            if self.connected:
                self.write()
            if self.ident in _relays:  # (not failed nor ended by that write)
                self.close()
                send_exit(self.ident, None)
            return
        if self not in _fed:
            _fed.append(self)

    def end_if_done(self) -> None:
        if not self.reading and not self.writing and self.ident in _relays:
            self.close()
            send_exit(self.ident, 0)

    def fail(self, reason: str) -> None:
        if self.ident in _relays:
            self.close()
            send(ERROR, self.ident, reason.encode("utf-8", "replace"), answer=True)

    def close(self) -> None:
        if self.events != -1:
            _poller.unregister(self.fd)
            self.events = -1
        _relays.pop(self.ident, None)
        self.sock.close()


class Listener(object):
    """A TCP listener on 127.0.0.1:port inside the sandbox (an R request whose spec carries
    ``listen: {"port": P}``): each connection it accepts waits, at most `MAX_PENDING` at once
    (more are closed at once), until the client adopts it as a relay (``relay: {"accepted":
    N}``); the client learns of it by an O line ``{"accepted": N}`` (the first line,
    ``{"listening": P}``, says the port is bound). K closes it and the connections still waiting."""

    def __init__(self, ident: int, spec: "dict[str, Any]") -> None:
        port = spec.get("port")
        if type(port) is not int or not 0 < port < 65536:
            raise ValueError("a listener needs a port from 1 to 65535, not %r" % (port,))
        self.ident, self.port = ident, port
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(("127.0.0.1", port))
            self.sock.listen(MAX_PENDING)
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self.fd = self.sock.fileno()
        self.waiting = []  # type: list[int]
        _listeners[ident] = self
        _poller.register(self.fd, _IN, self.on_event)
        send(OUTPUT, ident, b'{"listening": %d}\n' % port, answer=True)

    def on_event(self, _mask: int) -> None:
        while self.ident in _listeners:
            try:
                conn, _address = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.close()
                send(ERROR, self.ident, ("listener on port %d failed: %s" % (self.port, exc)).encode(), answer=True)
                return
            self.waiting = [number for number in self.waiting if number in _accepted]
            if len(self.waiting) >= MAX_PENDING:
                conn.close()  # nobody adopts them: the sandbox's client sees a reset, not a hang
                continue
            _next_accepted[0] += 1
            number = _next_accepted[0]
            _accepted[number] = (conn, self.port)
            self.waiting.append(number)
            send(OUTPUT, self.ident, b'{"accepted": %d}\n' % number, answer=True)

    def feed(self, kind: bytes, payload: bytes) -> None:
        if kind == KILL:
            self.close()
            send_exit(self.ident, None)

    def close(self) -> None:
        if _listeners.pop(self.ident, None) is None:
            return
        _poller.unregister(self.fd)
        self.sock.close()
        for number in self.waiting:
            waiting = _accepted.pop(number, None)
            if waiting is not None:
                waiting[0].close()


MAX_PENDING = 64
"""Accepted connections a listener holds for the client to adopt."""
_listeners: "dict[int, Listener]" = {}  # id -> Listener, until closed
_accepted: "dict[int, Any]" = {}  # number -> (socket, port): accepted, not yet adopted
_next_accepted = [0]
_ready: "list[bool]" = []  # [True] once the first relay or listener was asked for


def open_relay(ident: int, spec: "dict[str, Any]") -> None:
    """R with a ``relay`` spec: connect (its answer: G once connected, E if it failed), or with a
    ``listen`` spec: listen (`Listener`)."""
    if not _ready:  # the first: the helper's pipes, made ready for relays
        _ready.append(True)
        _widen_pipes()
        _open_splice()
        _open_splice_in()
    if isinstance(spec.get("listen"), dict):
        Listener(ident, spec["listen"])
    else:
        Relay(ident, spec["relay"])


def feed_relay(kind: bytes, ident: int, payload: bytes) -> bool:
    """Whether the frame was a relay's or a listener's (and handed to it)."""
    relay = _relays.get(ident)
    if relay is not None:
        relay.feed(kind, payload)
        return True
    listener = _listeners.get(ident)
    if listener is not None:
        listener.feed(kind, payload)
        return True
    return False


def write_fed() -> None:
    """After the frames of one read of the client's stream: each relay they fed writes what
    they queued, together, and polls for what it can take now."""
    while _fed:
        relay = _fed.pop()
        if relay.ident in _relays:
            if relay.connected:
                relay.write()
            relay.update()


def close_relays() -> None:
    """The client is gone: every relayed connection and listener closes."""
    for relay in list(_relays.values()):
        relay.close()
    for listener in list(_listeners.values()):
        listener.close()
