"""A command in the exec helper (`_server`), from its request to its answer: its process started
(cold, or in a shell started ahead of it: `_spawn`), its output and stdin pumped, its timeout or
kill, its leader reaped and its exit answered, and the shell it foresees for the next command
like it (`_next_key`); and the commands' tables (``_commands``, ``_leaders``, ``_ended``).
Stdlib only, Python 3.6-compatible.

Apart from `_server`, which reads the client's frames, runs the loop and holds the helper's
loop's state (`_loop`: `send`, the poller, used here once a command runs), because
a command's life is a unit of its own: the loop only hands it events (its output is ready, its
stdin writable, its leader exited, a deadline passed) and it decides what they mean.
"""

import marshal
import os
import time

from ._kill import JOB_MARKER_PREFIX, JOB_START_ENV, MARKER_ENV, RECORD_ENV, kill_marked
from ._loop import (
    DRAIN_GRACE,
    TIMED_OUT_DRAIN,
    _base_env,
    _jobs,
    _main,
    _markers,
    _Poller,
    _poller,
    _session,
    _subreaper,
    send,
    send_exit,
)
from ._reap import kill_orphans, now_ticks
from ._spawn import SH, Spares, WarmShell, enter_cwd, has_exited, plain_env, spawn, warm_script
from .frames import OUTPUT, STDERR

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: `typing` is not imported in the sandbox
    import signal
    from typing import Any

    from ._loop import Running
    from ._record import Record
    from ._spawn import WarmKey
else:  # the C module behind `signal` (which imports `enum`), with the same calls and numbers
    import _signal as signal

_commands: "dict[int, Running]" = {}  # id -> Command (or `_watch.Watch`), until its exit is sent
_leaders: "dict[int, Command | WarmShell]" = {}  # pid -> its leader, while UNREAPED (so still ours to signal)
_ended: "list[Command]" = []  # commands answered this turn, whose leftovers are swept once the answers are out


class Command(object):
    def __init__(self, ident: int, spec: "dict[str, Any]") -> None:
        self.ident = ident
        self.killed = False
        self.timed_out = False
        self.finished = False
        self.reaped = False
        self.code: "int | None" = None
        self.stdin_queue: "list[memoryview]" = []
        self.stdin_closing = False
        self.stdin_waiting = False
        self.drain_deadline: "float | None" = None
        self.born = now_ticks()  # before anything it starts: what it makes is no older (`_spared`)
        timeout = spec.get("timeout")
        self.deadline: "float | None" = time.monotonic() + timeout if timeout else None
        spec_env, cwd, with_stdin = spec.get("env") or {}, spec.get("cwd"), bool(spec.get("stdin"))
        spec_env, self.job_needle = _job_start(spec_env)
        recording = None
        if RECORD_ENV in spec_env:  # before the spares' match; `_record` comes with such a request
            from ._record import take_record

            spec_env, recording = take_record(spec_env)
        self.pty = spec.get("pty")  # None, or the size of the terminal it runs on (`_pty`)
        script = None if self.pty is not None else warm_script(spec["command"], spec_env, with_stdin)
        # Once answered: a shell for the next command like it (its marker: the one announced).
        self.warm_key = _next_key(spec_env, cwd, spec.get("next_marker"), script)
        enter_cwd(cwd)  # a missing or closed directory: the command cannot start (E)
        warm = _spares.take(script, spec_env, cwd)
        self.marker: str
        self.pid: int
        self.out_fd: "int | None"
        self.err_fd: "int | None"
        self.in_fd: "int | None"
        if warm is not None:
            self.marker, self.pid, self.out_fd, self.err_fd, self.in_fd = (
                warm.marker,
                warm.pid,
                warm.out_fd,
                warm.err_fd,
                None,
            )
        else:
            self.marker = spec_env.get(MARKER_ENV) or "%s-%d" % (_session, ident)  # the caller's own, when it gave one
            env = _command_env(spec_env, self.marker)
            if self.pty is not None:
                self.pid, self.out_fd, self.err_fd, self.in_fd = _on_pty(spec["command"], env, spec_env, self.pty)
            else:
                self.pid, self.out_fd, self.err_fd, self.in_fd = spawn(["-c", spec["command"]], env, with_stdin)
        self.needle = ("\0%s=%s\0" % (MARKER_ENV, self.marker)).encode()
        _leaders[self.pid] = self  # at once: the pid must be known before anything can fail
        self.record: "Record | None" = recording and recording(self.marker)

    def start(self) -> None:
        assert self.out_fd is not None  # until its output ends
        _poller.register(self.out_fd, _Poller.READ, self.on_output)
        if self.err_fd is not None:  # None on a terminal: stdout and stderr are its one output
            _poller.register(self.err_fd, _Poller.READ, self.on_stderr)
        _commands[self.ident] = self

    def on_output(self, _mask: int) -> None:
        self.pump("out_fd", OUTPUT)

    def on_stderr(self, _mask: int) -> None:
        self.pump("err_fd", STDERR)

    def pump(self, which: str, kind: bytes) -> None:
        """Relay what the command wrote on one of its outputs (``which``: the attribute holding
        its fd) as ``kind`` frames; once both ended, its output has."""
        fd = getattr(self, which)
        if fd is None:  # closed by an earlier event of the same batch
            return
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:  # a terminal's master (non-blocking, as its writes are): nothing yet
            return
        except OSError:  # EIO: a terminal's every slave is closed
            chunk = b""
        if chunk:
            if self.record is not None:
                self.record.write(chunk, kind == STDERR)
            send(kind, self.ident, chunk)
            return
        _poller.unregister(fd)
        os.close(fd)
        setattr(self, which, None)
        if self.out_fd is not None or self.err_fd is not None:
            return
        if self.reaped:
            self.finish()
        elif self.has_exited():
            self.exited()  # which finishes it: its output just ended

    def has_exited(self) -> bool:
        """Whether the leader has exited (not reaped yet). Asked when its output ends, which is
        usually its exit: the kernel closes a process's files just before it tells the parent, so
        the answer goes out in this turn of the loop, not one more turn later on the SIGCHLD."""
        return has_exited(self.pid)

    def close_output(self) -> None:
        for fd in (self.out_fd, self.err_fd):
            if fd is not None:
                _poller.unregister(fd)
                os.close(fd)
        self.out_fd = self.err_fd = None

    def feed(self, data: "bytes | None") -> None:
        """Queue stdin bytes (``None``: close it once written), written as the pipe takes them."""
        if self.in_fd is None:
            return
        if data is None:
            self.stdin_closing = True
        elif data:
            self.stdin_queue.append(memoryview(data))
        self.write_stdin(None)

    def write_stdin(self, _mask: "int | None") -> None:
        if self.in_fd is None:  # closed by an earlier event of the same batch
            return
        while self.stdin_queue:
            data = self.stdin_queue[0]
            try:
                written = os.write(self.in_fd, data)
            except BlockingIOError:
                written = 0
            except OSError:  # the command closed its stdin: the rest is dropped, as a pipe would
                self.close_stdin()
                return
            if written < len(data):
                self.stdin_queue[0] = data[written:]
                if not self.stdin_waiting:
                    _poller.register(self.in_fd, _Poller.WRITE, self.write_stdin)
                    self.stdin_waiting = True
                return
            self.stdin_queue.pop(0)
        if self.stdin_waiting:
            _poller.unregister(self.in_fd)
            self.stdin_waiting = False
        if self.stdin_closing:
            self.close_stdin()

    def close_stdin(self) -> None:
        if self.in_fd is not None:
            if self.stdin_waiting:
                _poller.unregister(self.in_fd)
                self.stdin_waiting = False
            os.close(self.in_fd)
            self.in_fd = None
        self.stdin_queue = []

    def kill(self) -> None:
        """Kill the command's process group (only while unreaped: after that its id may already
        belong to another command's group) and every process carrying its marker."""
        if not self.reaped:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
            if self.pty is not None:  # a job-control shell's jobs are groups of their own
                from ._pty import kill_session

                kill_session(self.pid)
        kill_marked(self.marker)

    def resize(self, payload: bytes) -> None:
        """Z: the terminal's new size (``{cols, rows}``, `marshal`'d); nothing for a command
        without a terminal, or a size that is none."""
        if self.pty is None or self.out_fd is None:
            return
        from ._pty import set_size, size_of

        try:
            set_size(self.out_fd, size_of(marshal.loads(payload)))  # noqa: S302 (the client's own, `wire_spec`)
        except (ValueError, EOFError, TypeError, OSError):
            pass

    def expire(self) -> None:
        self.timed_out = True
        self.deadline = None
        self.kill()

    def stop(self) -> None:
        """The client's kill (K)."""
        self.killed = True
        self.kill()

    def exited(self) -> None:
        """The leader exited and is not reaped yet: its pid (and group id) are still ours, so the
        group's leftovers are killed now; only then is it reaped."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        _, status = os.waitpid(self.pid, 0)
        del _leaders[self.pid]
        self.reaped = True
        self.deadline = None
        self.code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        self.close_stdin()
        if self.timed_out or self.killed:  # what escaped holds the output open: end it now
            self.finished = True  # (so that its own marker does not protect what escaped)
            _kill_orphans()
            self.finished = False
        if self.finished:  # it failed to start properly and was answered with E
            return
        if self.out_fd is None and self.err_fd is None:
            self.finish()
        else:  # a process outside the group (setsid) may hold the output open: wait a little
            self.drain_deadline = time.monotonic() + (TIMED_OUT_DRAIN if self.timed_out else DRAIN_GRACE)

    def finish(self) -> None:
        self.finished = True
        self.drain_deadline = None
        self.close_output()
        _commands.pop(self.ident, None)
        code = None if self.timed_out else self.code
        if self.record is not None:
            self.record.end(code, self.timed_out)
        send_exit(self.ident, code, self.timed_out)
        if self.warm_key is not None:
            _spares.wanted = self.warm_key
        # Then whatever left its group (setsid, double forks) ends too; once the answer is
        # written at the end of this turn of the loop, so that scanning /proc does not delay it.
        _ended.append(self)

    def next_deadline(self) -> "float | None":
        return self.drain_deadline if self.drain_deadline is not None else self.deadline

    def on_deadline(self, now: float) -> None:
        if self.drain_deadline is not None and now >= self.drain_deadline:
            self.finish()
        elif self.deadline is not None and now >= self.deadline:
            self.expire()


def _on_pty(
    command: str, env: "dict[str, str]", spec_env: "dict[str, str]", size: object
) -> "tuple[int, int, None, int]":
    """(pid, output fd, no stderr, stdin fd) of ``command`` on a terminal of ``size`` (`_pty`):
    its output and its stdin are the one master (stdin a non-blocking duplicate of it, closed
    apart); ``TERM`` is `_pty.DEFAULT_TERM` unless the request's ``spec_env`` sets one."""
    from ._pty import DEFAULT_TERM, size_of, spawn_pty

    if "TERM" not in spec_env:
        env["TERM"] = DEFAULT_TERM
    pid, master = spawn_pty(command, env, size_of(size))
    writer = os.dup(master)
    os.set_blocking(writer, False)
    return pid, master, None, writer


def _job_start(spec_env: "dict[str, str]") -> "tuple[dict[str, str], bytes | None]":
    """(the environment without `JOB_START_ENV`, the needle of the supervisor marker it announced
    or None): a command that starts a background job (`sandboxes.jobs`) names the marker of the
    supervisor it leaves behind, which the sweep of orphans then records and spares
    (`_reap._spared`) until the job ends."""
    if not isinstance(spec_env, dict) or JOB_START_ENV not in spec_env:
        return spec_env, None
    spec_env = dict(spec_env)
    marker = spec_env.pop(JOB_START_ENV)
    if not isinstance(marker, str) or not marker.startswith(JOB_MARKER_PREFIX) or "\0" in marker:
        return spec_env, None
    return spec_env, ("\0%s=%s\0" % (MARKER_ENV, marker)).encode()


def _command_env(spec_env: "dict[str, str]", marker: str) -> "dict[str, str]":
    env = dict(_base_env)
    env.update(spec_env)
    env[MARKER_ENV] = marker
    return env


def _next_key(
    spec_env: "dict[str, str]", cwd: "str | None", next_marker: object, warm: "tuple[str, bytes] | None"
) -> "WarmKey | None":
    """(env, cwd, kind) of the next command like this one (``warm``: how this one could run
    warm, `warm_script`, whose kind the next is taken to be: a plain shell's if it could not),
    for which a shell is started once this one is answered; None: none is foreseen. A caller
    that marks its commands itself (the service: a token per call, which a kill from outside
    this helper looks for) announces with a command
    the marker its next will carry (``next_marker``, in the R frame), and the shell is started
    with that one: its environment, the marker in it, is fixed when it starts. One that gives
    its own marker and announces none gets no shell: its next marker is unknown. An announced
    marker gets its shell also after a command that could not run warm itself (stdin, a long
    script): the caller hands that marker out next, whatever this command was."""
    if not plain_env(spec_env):
        return None
    kind = SH if warm is None else warm[0]
    if MARKER_ENV not in spec_env:
        return (spec_env, cwd, kind) if warm is not None else None
    if not isinstance(next_marker, str) or not next_marker or "\0" in next_marker:
        return None
    key_env = dict(spec_env)
    key_env[MARKER_ENV] = next_marker
    return key_env, cwd, kind


def _spare_env(spec_env: "dict[str, str]") -> "tuple[dict[str, str], str]":
    """(environment, marker) of a shell started ahead of its command: the marker announced for
    it (`_next_key`), else one of its own, since the command is not known yet (`Command.ident`
    is not)."""
    marker = spec_env.get(MARKER_ENV)
    if not marker:
        _markers[0] += 1
        marker = "%s-w%d" % (_session, _markers[0])
    return _command_env(spec_env, marker), marker


_spares = Spares(_leaders, _spare_env)  # shells waiting for commands (`_spawn`, `_command`)


def _kill_orphans(ended: "tuple[Command, ...] | list[Command]" = ()) -> None:
    """`kill_orphans`, sparing the jobs' supervisors (``_jobs``) and what the running commands
    account for, and the supervisors that the job starts among them, among the answered ones not
    swept after yet (``_ended``) or among the ``ended`` being swept after now left behind."""
    commands = list(_commands.values()) + _ended + list(ended)
    kill_orphans(_subreaper[0], _main[0], _leaders, commands, _jobs)
