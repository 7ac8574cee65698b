"""A command's output record in the sandbox: the head and the tail of its output (stdout and
stderr in the order they came, bytes as written, with which stream each run of bytes came
from) and, once it ended, its status, kept in a directory that
outlives the exec helper's client, so that a caller that lost the helper (the service restarted)
reads from the sandbox alone what the command printed and how it ended. Stdlib only, Python
3.6-compatible.

A command asks for one with ``RECORD_ENV`` (``<id>:<limit>``, `_kill`) in its request's
environment (taken out of the command's); this module comes with such a request (shipped on
demand, `sandboxes._mux._shipped.ON_DEMAND`). When the client goes, the helper runs such commands
on to their end or their timeout (`linger`). A record is a directory
``${TMPDIR:-/tmp}/.sandboxes-streams/<id>`` (0700, in a 0700 root the helper's user owns), laid
out as a background job's (`sandboxes.jobs`), so that the same reader serves both: ``limits``
(``H T``), ``started``, ``status`` (``STATE CODE ENDED``, times in ns), ``o.h`` (the
first ``H`` bytes), ``o.<k>`` (tail chunks of ``T`` bytes, the newest two kept), ``runs`` (a
line ``OFFSET TAG`` where each run of one stream starts in the output, ``o`` stdout, ``e``
stderr; past `MAX_RUNS` runs, one ``m``: the rest is merged), and ``helper``
(the recording helper's pid and start time in clock ticks: a record without a status whose
helper is gone was lost; then the command's marker, to kill it by). At most `RECORD_LIMIT` bytes
are kept, whatever the command prints; a file that cannot be written (``/tmp`` full, a name
taken by the sandbox) stops the recording, never the command. The ``status`` file is made with
the record, blank, its fd held, and the status is written over it in place at the end: a
``/tmp`` filled meanwhile cannot keep the end from being recorded (a record whose status stays
blank while its helper lives would read as running for good). Records whose command ended are
removed past the newest `KEEP`, looked for every `KEEP` new ones.
"""

import os
import stat
import time

from ._kill import RECORD_ENV
from ._loop import _gone, _held_until, _outbox, _poller

RECORD_LIMIT = 1 << 20
"""Most output bytes a record keeps (head and tail)."""
KEEP = 16
"""Ended records kept in a sandbox (the newest)."""
MAX_RUNS = 4096
"""Most runs of one stream a record names (`sandboxes.jobs.MAX_RUNS` reads as many)."""
_made = [0]  # records made by this helper
_ticks: "list[str]" = []  # `_start_ticks`, once read
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_APPEND | os.O_CLOEXEC

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: `typing` is not imported in the sandbox
    from collections.abc import Callable
    from typing import Any

    from ._loop import Running


def take_record(spec_env: "Any") -> "tuple[Any, Callable[[str], Record | None] | None]":
    """(the environment without `RECORD_ENV`, what makes the record it asks for once the command
    started, given the command's marker; or None: a malformed request records nothing)."""
    if not isinstance(spec_env, dict):
        return spec_env, None
    spec_env = dict(spec_env)
    value = spec_env.pop(RECORD_ENV, None)
    name, _, limit = value.partition(":") if isinstance(value, str) else ("", "", "")
    if not (0 < len(name) <= 64 and all(c in "0123456789abcdef" for c in name) and limit.isdigit()):
        return spec_env, None
    return spec_env, lambda marker: _open(name, min(int(limit), RECORD_LIMIT), marker)


def _open(name: str, limit: int, marker: str) -> "Record | None":
    """The record, or None when it cannot be made (the command runs unrecorded)."""
    try:
        return Record(name, limit, marker)
    except OSError:
        return None


def _root() -> str:
    """The records' root, made 0700 if missing; refused (OSError) unless it is this user's own
    directory (on a shared ``/tmp`` another user could have planted it)."""
    root = os.path.join(os.environ.get("TMPDIR") or "/tmp", ".sandboxes-streams")
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(root)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise OSError("the records' root %s is not this user's directory" % root)
    return root


def _prune(root: str) -> None:
    """Every `KEEP` records made, remove the ended ones past the newest `KEEP`."""
    _made[0] += 1
    if _made[0] % KEEP:
        return
    ended = []
    for name in os.listdir(root):
        try:
            mtime = os.lstat(os.path.join(root, name, "status")).st_mtime
        except OSError:
            continue
        if _ended(os.path.join(root, name)):
            ended.append((mtime, name))
    ended.sort()
    for _, name in ended[: max(0, len(ended) - KEEP)]:
        directory = os.path.join(root, name)
        try:
            for entry in os.listdir(directory):
                os.unlink(os.path.join(directory, entry))
            os.rmdir(directory)
        except OSError:
            pass


STATUS_SIZE = 64
"""Bytes of a record's ``status`` file: made blank (spaces, which its readers take for no
status) with the record, and overwritten in place by the status (under 64 bytes) at the end."""


def _blank_status(directory: str) -> int:
    """An fd on ``directory``'s new ``status``, holding `STATUS_SIZE` blank bytes: the room the
    status takes is taken now, while the record is made, not when ``/tmp`` may be full."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC  # no O_APPEND: `os.pwrite` at 0
    fd = os.open(os.path.join(directory, "status"), flags, 0o600)
    try:
        if os.write(fd, b" " * (STATUS_SIZE - 1) + b"\n") != STATUS_SIZE:
            raise OSError("the record's status could not be made")
    except OSError:
        os.close(fd)
        raise
    return fd


def _ended(directory: str) -> bool:
    """Whether the record in ``directory`` holds a status (not only the blank one)."""
    try:
        with open(os.path.join(directory, "status"), "rb") as status:
            return bool(status.read(STATUS_SIZE).strip())
    except OSError:
        return False


def _start_ticks() -> str:
    """This process's start time in clock ticks (``/proc/self/stat``), what tells it from a
    later process given the same pid."""
    if not _ticks:
        with open("/proc/self/stat", "rb") as stat_file:
            _ticks.append(stat_file.read().rsplit(b")", 1)[-1].split()[19].decode("ascii"))
    return _ticks[0]


def _now_ns() -> int:
    return time.time_ns() if hasattr(time, "time_ns") else int(time.time() * 1e9)  # novermin (3.7+)


class Record(object):
    """One command's record (see the module docstring); written by the helper's loop only."""

    def __init__(self, name: str, limit: int, marker: str) -> None:
        root = _root()
        _prune(root)
        self.dir = os.path.join(root, name)
        os.mkdir(self.dir, 0o700)
        self.tail = max(1, limit // 4)
        self.head = max(0, limit - 2 * self.tail)
        self.file = "o.h"
        self.room = self.head
        self.chunk = -1
        self.fd: "int | None" = None
        self.broken = False
        self.total = 0
        self.runs = 0
        self.stream = ""
        self._put("limits", "%d %d\n" % (self.head, self.tail))
        self._put("started", "%d\n" % _now_ns())
        self._put("helper", "%d %s %s\n" % (os.getpid(), _start_ticks(), marker))
        status = _blank_status(self.dir)
        self.status_fd: "int | None" = status
        self.runs_fd: "int | None" = None
        try:
            self.runs_fd = os.open(os.path.join(self.dir, "runs"), _FLAGS, 0o600)
            self._open("o.h")
        except OSError:
            self._close()
            os.close(status)
            raise

    def _put(self, name: str, text: str) -> None:
        fd = os.open(os.path.join(self.dir, name), _FLAGS, 0o600)
        try:
            os.write(fd, text.encode("utf-8", "replace"))
        finally:
            os.close(fd)

    def _open(self, name: str) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.fd = os.open(os.path.join(self.dir, name), _FLAGS, 0o600)

    def write(self, data: bytes, stderr: bool = False) -> None:
        """Keep ``data`` (the command's next output, of its stderr or its stdout) as far as the
        head and the tail take it, and where a run of the other stream starts."""
        if self.broken or not data:
            return
        view = memoryview(data)
        try:
            self._run("e" if stderr else "o")
            self.total += len(data)
            while len(view):
                if self.room <= 0:
                    self.chunk += 1
                    self._open("o.%d" % self.chunk)
                    self.room = self.tail
                    if self.chunk >= 2:
                        os.unlink(os.path.join(self.dir, "o.%d" % (self.chunk - 2)))
                piece = view[: self.room]
                written = os.write(self.fd, piece)  # type: ignore[arg-type]
                if written <= 0:
                    raise OSError("nothing written")
                self.room -= written
                view = view[written:]
        except (OSError, TypeError):
            self._stop()

    def _run(self, stream: str) -> None:
        """Name the stream of the bytes from `total` on, when it changes (``m`` past `MAX_RUNS`)."""
        if self.stream == "m" or stream == self.stream:
            return
        self.runs += 1
        self.stream = stream if self.runs < MAX_RUNS else "m"
        if os.write(self.runs_fd, ("%d %s\n" % (self.total, self.stream)).encode("ascii")) <= 0:  # type: ignore[arg-type]
            raise OSError("nothing written")

    def end(self, code: "int | None", timed_out: bool) -> None:
        """The command ended: its status, written once, over the blank line `_blank_status` put
        in place (no new room needed, so a full ``/tmp`` cannot keep it from being written)."""
        self._close()
        fd, self.status_fd = self.status_fd, None
        if fd is None:
            return
        state = "timeout -" if timed_out or code is None else "exited %d" % code
        try:
            os.pwrite(fd, ("%s %d" % (state, _now_ns())).ljust(STATUS_SIZE - 1).encode("ascii") + b"\n", 0)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _stop(self) -> None:
        """Keep nothing more (the rest of the output is not recorded; the status still is)."""
        self.broken = True
        self._close()

    def _close(self) -> None:
        for fd in (self.fd, self.runs_fd):
            if fd is not None:
                os.close(fd)
        self.fd = self.runs_fd = None


def linger(recorded: "list[Running]", sweep: "Callable[[], None]") -> None:
    """Run the recorded commands to their end (their timeouts hold) once the helper's client is
    gone: their output goes to their records alone (`_gone`); ``sweep``: the helper's sweep
    after commands ended (`_server._sweep_ended`)."""
    _gone[0] = True
    del _outbox[:]
    _held_until[0] = None
    try:
        _poller.unregister(0)
    except (KeyError, OSError):
        pass
    for command in recorded:  # no more stdin can come: what is queued is written, then it ends
        command.feed(None)
    while any(not command.finished for command in recorded):
        deadlines = [d for d in (command.next_deadline() for command in recorded) if d is not None]
        wait = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        for callback, events in _poller.poll(wait):
            callback(events)
        now = time.monotonic()
        for command in recorded:
            deadline = command.next_deadline()
            if deadline is not None and now >= deadline and not command.finished:
                command.on_deadline(now)
        sweep()
