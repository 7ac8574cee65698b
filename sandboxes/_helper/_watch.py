"""A file watch in the exec helper (`_server`): an R request whose spec holds ``watch``
(``{"path": P, "recursive": bool}``, and optional bounds: ``max_watches``, ``max_events``,
``max_entries``, ``poll_interval``) starts no process. It watches the directory P and sends what
happens under it as O frames, one JSON object a line: first ``{"type": "start", "method":
"inotify"|"poll"}`` once the watch is in place, then ``{"type": "create"|"write"|"remove"|
"rename"|"chmod", "name": path relative to P}`` (the kinds of E2B's envd, as fsnotify maps
inotify's), and ``{"type": "overflow"}`` where events were lost. K, the request's timeout, the
client leaving or P's removal end it with X. Stdlib only, Python 3.6-compatible.

Linux inotify through ctypes where it is (its descriptor waits in the helper's poller, its
events are parsed in linear time from a bounded read); recursive, a watch on every directory of
the tree (at most ``max_watches``) and on each directory created later, whose entries made
before its watch was added are reported as created (one may then come twice). Elsewhere (no
ctypes, no inotify, no instance left) the tree's snapshots (`_snapshots`) every
``poll_interval`` seconds, or more apart when a scan takes long, yield the same kinds. At most
``max_events`` events go out per read or scan: past it one overflow, and the rest is dropped.

The helper runs as the sandbox's command user, so the kernel lets it watch and list only what
that user may list: a directory the user cannot read is not entered, and an unreadable P is the
request's E.
"""

import errno
import os
import stat
import struct
import time

from ._command import _commands
from ._kill import MARKER_ENV
from ._loop import _json, _Poller, _poller, _session, send, send_exit
from ._reap import now_ticks
from ._snapshots import changes, snapshot
from .frames import OUTPUT

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: `typing` is not imported in the sandbox
    from typing import Any

    from ._snapshots import Snapshot

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_DONT_FOLLOW = 0x2000000
IN_EXCL_UNLINK = 0x4000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = 0o2000000
WATCHED = (
    IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
) | (IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK)
EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name
READ_SIZE = 1 << 16
MAX_WATCHES = 8192
MAX_EVENTS = 4096
MAX_ENTRIES = 20000
POLL_INTERVAL = 0.5
POLL_SHARE = 10
"""A polling watch scans again at the earliest this many times its last scan's duration later:
a large tree costs at most a tenth of a core."""
FRAME_BYTES = 60000
"""Lines of events go out in O frames of about this many bytes at most."""


def _bound(spec: "dict[str, Any]", name: str, default: "Any") -> "Any":
    """``spec[name]`` when it is a positive number, else ``default``."""
    value = spec.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return default
    return type(default)(value)


class _Inotify(object):
    """One inotify instance through ctypes; OSError (or ImportError, AttributeError) where the
    kernel, the C library or ctypes lacks it."""

    def __init__(self) -> None:
        import ctypes

        self.libc = ctypes.CDLL(None, use_errno=True)
        self.errno = ctypes.get_errno
        fd = self.libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            code = self.errno()
            raise OSError(code, os.strerror(code))
        self.fd: int = fd

    def add(self, path: str) -> int:
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(path), WATCHED)
        if wd < 0:
            code = self.errno()
            raise OSError(code, os.strerror(code), path)
        return int(wd)

    def remove(self, wd: int) -> None:
        self.libc.inotify_rm_watch(self.fd, wd)


def settle() -> None:
    """Each inotify watch sends, now, what the kernel queued for it (one bounded read each)."""
    for running in list(_commands.values()):
        if isinstance(running, Watch) and running.inotify is not None and not running.finished:
            running.on_events(0)


class Watch(object):
    """A watch in the helper's table of commands (``_commands``), answering the loop as a command
    does (deadlines, K, the client leaving); it carries a marker no process carries, so that
    the sweep of orphans spares nothing for it."""

    def __init__(self, ident: int, spec: "dict[str, Any]") -> None:
        self.ident = ident
        self.finished = False
        self.born = now_ticks()
        self.job_needle = None
        self.marker = "%s-watch-%d" % (_session, ident)
        self.needle = ("\0%s=%s\0" % (MARKER_ENV, self.marker)).encode()
        options = spec["watch"]
        if not isinstance(options, dict) or not isinstance(options.get("path"), str) or not options["path"]:
            raise ValueError("a watch needs the path of a directory")
        root = os.path.normpath(os.path.join(spec.get("cwd") or os.getcwd(), options["path"]))
        if not stat.S_ISDIR(os.stat(root).st_mode):  # FileNotFoundError, PermissionError: the request's E
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", root)
        os.scandir(root).close()  # PermissionError when the user may not list it
        self.root = root
        self.recursive = bool(options.get("recursive"))
        self.max_watches: int = _bound(options, "max_watches", MAX_WATCHES)
        self.max_events: int = _bound(options, "max_events", MAX_EVENTS)
        self.max_entries: int = _bound(options, "max_entries", MAX_ENTRIES)
        self.interval: float = _bound(options, "poll_interval", POLL_INTERVAL)
        timeout = spec.get("timeout")
        self.deadline: "float | None" = time.monotonic() + timeout if timeout else None
        self.lines: "list[str]" = []
        self.counted = 0
        self.dropping = False
        self.inotify: "_Inotify | None" = None
        self.registered = False
        self.dirs: "dict[int, str]" = {}  # wd -> its directory's path relative to the root
        self.wds: "dict[str, int]" = {}  # and back
        self.entries: "Snapshot" = {}
        self.truncated = False
        self.next_scan: "float | None" = None

    # ------------------------------------------------------------ as the loop sees a command

    def start(self) -> None:
        _commands[self.ident] = self
        method = "inotify"
        try:
            self.inotify = _Inotify()
            self.add_dir("")
        except Exception as exc:  # no ctypes, no inotify, no instance or watch left: poll
            if isinstance(exc, PermissionError):
                raise
            self.close()
            method = "poll"
        self.lines.append('{"type": "start", "method": "%s"}' % method)
        if self.inotify is not None:
            if self.recursive:
                self.add_tree("", False)
            _poller.register(self.inotify.fd, _Poller.READ, self.on_events)
            self.registered = True
        else:
            self.entries, self.truncated = snapshot(self.root, self.recursive, self.max_entries)
            if self.truncated:
                self.overflow()
            self.next_scan = time.monotonic() + self.interval
        self.flush()

    def next_deadline(self) -> "float | None":
        deadlines = [d for d in (self.deadline, self.next_scan) if d is not None]
        return min(deadlines) if deadlines else None

    def on_deadline(self, now: float) -> None:
        if self.deadline is not None and now >= self.deadline:
            self.end(None, True)
        elif self.next_scan is not None and now >= self.next_scan:
            self.scan()

    def feed(self, data: "bytes | None") -> None:
        """A watch reads no stdin."""

    def stop(self) -> None:
        """The client's kill (K): the watch ends as asked, with code 0."""
        self.end(0)

    def kill(self) -> None:
        self.close()

    def close_output(self) -> None:
        self.close()

    def close_stdin(self) -> None:
        """A watch has no stdin."""

    def resize(self, payload: bytes) -> None:
        """A watch has no terminal."""

    def close(self) -> None:
        if self.inotify is not None:
            if self.registered:
                _poller.unregister(self.inotify.fd)
                self.registered = False
            os.close(self.inotify.fd)
            self.inotify = None
        self.next_scan = None

    def end(self, code: "int | None", timed_out: bool = False) -> None:
        """Send what is queued, then X."""
        self.flush()
        self.finished = True
        self.close()
        _commands.pop(self.ident, None)
        send_exit(self.ident, code, timed_out)

    # ------------------------------------------------------------ events out

    def emit(self, kind: str, path: str) -> None:
        if self.dropping:
            return
        if self.counted >= self.max_events:
            self.overflow()
            return
        self.counted += 1
        self.lines.append('{"type": "%s", "name": %s}' % (kind, _json(path)))

    def overflow(self) -> None:
        """Events are lost from here to the end of this read or scan: said once."""
        if not self.dropping:
            self.dropping = True
            self.lines.append('{"type": "overflow"}')

    def flush(self) -> None:
        """The queued lines, in O frames of at most about `FRAME_BYTES`, out at the end of this
        turn of the loop (a read's or a scan's events are one batch already: none is held)."""
        frame: "list[str]" = []
        size = 0
        for line in self.lines:
            frame.append(line)
            size += len(line) + 1
            if size >= FRAME_BYTES:
                send(OUTPUT, self.ident, ("\n".join(frame) + "\n").encode(), answer=True)
                frame, size = [], 0
        if frame:
            send(OUTPUT, self.ident, ("\n".join(frame) + "\n").encode(), answer=True)
        self.lines = []
        self.counted = 0
        self.dropping = False

    # ------------------------------------------------------------ inotify

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel) if rel else self.root

    def add_dir(self, rel: str) -> bool:
        """Whether ``rel`` is watched now; a directory that vanished or that the user may not
        read is not, and one past `max_watches` (or the kernel's bound) is an overflow."""
        assert self.inotify is not None
        if rel and len(self.dirs) >= self.max_watches:
            self.overflow()
            return False
        try:
            wd = self.inotify.add(self.path(rel))
        except OSError as exc:
            if not rel:
                raise
            if exc.errno == errno.ENOSPC:
                self.overflow()
            return False
        before = self.dirs.get(wd)
        if before is not None and self.wds.get(before) == wd:  # the same directory, under a new path
            del self.wds[before]
        self.dirs[wd] = rel
        self.wds[rel] = wd
        return True

    def add_tree(self, top: str, announce: bool) -> None:
        """Watch every directory under ``top`` (itself included unless it is the root), breadth
        first; ``announce``: a directory just created, whose entries are reported as created
        (made before its watch was added, they had no event)."""
        pending = [top]
        while pending:
            rel = pending.pop(0)
            if rel and not self.add_dir(rel):
                continue
            try:
                listing = os.scandir(self.path(rel))
            except OSError:
                continue
            with listing:
                for entry in listing:
                    name = rel + "/" + entry.name if rel else entry.name
                    if announce:
                        self.emit("create", name)
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(name)
                    except OSError:
                        pass

    def forget_tree(self, top: str) -> None:
        """Stop watching ``top`` and what is under it (moved away: its watches would follow it)."""
        assert self.inotify is not None
        prefix = top + "/"
        for rel in [rel for rel in self.wds if rel == top or rel.startswith(prefix)]:
            wd = self.wds.pop(rel)
            del self.dirs[wd]
            self.inotify.remove(wd)

    def on_events(self, _mask: int) -> None:
        """One read of the instance's events (bounded), parsed once through."""
        assert self.inotify is not None
        try:
            data = os.read(self.inotify.fd, READ_SIZE)
        except BlockingIOError:
            return
        offset, size = 0, len(data)
        while offset + EVENT.size <= size and not self.finished:
            wd, mask, _cookie, length = EVENT.unpack_from(data, offset)
            start = offset + EVENT.size
            offset = start + length
            name = data[start:offset].split(b"\0", 1)[0] if length else b""
            self.on_event(wd, mask, name.decode("utf-8", "replace"))
        if not self.finished:
            self.flush()

    def on_event(self, wd: int, mask: int, name: str) -> None:
        if mask & IN_Q_OVERFLOW:
            self.overflow()
            return
        base = self.dirs.get(wd)
        if base is None:  # a watch forgotten meanwhile
            return
        if mask & IN_IGNORED:
            del self.dirs[wd]
            if self.wds.get(base) == wd:
                del self.wds[base]
            if not base:  # the root is gone
                self.end(0)
            return
        if not name:  # an event of a watched directory itself: its parent's watch reported it
            if not base:
                self.on_root_event(mask)
            return
        path = base + "/" + name if base else name
        if mask & (IN_CREATE | IN_MOVED_TO):
            self.emit("create", path)
            if self.recursive and mask & IN_ISDIR:
                self.add_tree(path, bool(mask & IN_CREATE))
        if mask & IN_MODIFY:
            self.emit("write", path)
        if mask & IN_ATTRIB:
            self.emit("chmod", path)
        if mask & IN_DELETE:
            self.emit("remove", path)
        if mask & IN_MOVED_FROM:
            self.emit("rename", path)
            if self.recursive and mask & IN_ISDIR:
                self.forget_tree(path)

    def on_root_event(self, mask: int) -> None:
        if mask & IN_ATTRIB:
            self.emit("chmod", "")
        if mask & IN_DELETE_SELF:
            self.emit("remove", "")
        if mask & IN_MOVE_SELF:
            self.emit("rename", "")

    # ------------------------------------------------------------ polling

    def scan(self) -> None:
        began = time.monotonic()
        entries, truncated = snapshot(self.root, self.recursive, self.max_entries)
        for kind, path in changes(self.entries, entries):
            self.emit(kind, path)
        if truncated and not self.truncated:
            self.overflow()
        self.entries, self.truncated = entries, truncated
        if not os.path.isdir(self.root):
            self.emit("remove", "")
            self.end(0)
            return
        self.flush()
        now = time.monotonic()
        self.next_scan = now + max(self.interval, (now - began) * POLL_SHARE)
