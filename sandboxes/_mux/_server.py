# ruff: noqa
# mypy: ignore-errors
"""The exec helper that runs INSIDE a sandbox (shipped as source with ``python3 -c``).

One long-lived process per sandbox answers many concurrent commands over one byte stream, so a
command costs a fork instead of a ``docker exec`` (~70 ms) or an SSH channel setup. Stdlib only
and Python 3.6-compatible: it runs on whatever python3 the image has. Shipped last, after
`_reap`, whose ``kill_marked``, ``kill_orphans``, ``reap_orphans``, ``has_strays`` and
``_container_main`` it calls, `_spawn` and `_command` (a command from its request to its
answer: ``Command``); ``SERVER_SOURCE`` is those files and `sandboxes._kill`, one script.

Frames both ways: 1 byte type, 4 bytes command id, 4 bytes length (big endian), payload.
  client -> helper: P ping, R run (a spec), I stdin bytes, C close stdin, K kill,
                    M kill marked ({name, value}: every process of the sandbox whose
                    environment holds name=value, killed by the helper itself),
                    F file op (`_files`: a read or write without a process, its bytes as I/C;
                    `_search`: a grep or glob, answered whole); specs are `marshal`'d dicts
  helper -> client: H hello (JSON), A accepted (queued BEFORE the command is started; its timeout
                    counts from here. It goes out with the command's first output or answer,
                    or `HOLD` seconds later, see `send`. Its absence proves nothing: a request
                    the client wrote may be read and run after the client gave up, so the
                    client never resends a written request, acknowledged or not), O output
                    bytes, X exit (JSON {code, timed_out}; for M: code 0 when none was left),
                    S stderr bytes (O: stdout's; in the order the helper read them),
                    E error text, N not native here (`_files`: the client runs the script)
Every command runs in its own session with a marker in its environment (``SANDBOXES_EXEC_ID``;
the caller's value when its env has one, as the service's does; such a caller may announce,
as ``next_marker`` in an R spec, the marker its next command will carry: `_command._next_key`);
a timeout or a kill takes down its process group and every process still carrying the marker,
which catches descendants that called setsid or double-forked.

Orphans: a command may also drop the marker (``env -u SANDBOXES_EXEC_ID setsid ...``), and a
process that did both is no longer anyone's by group or environment. Once its parent dies it is
re-parented to the nearest subreaper (this helper, when it is one) or to the pid namespace's init
(in a container: the container's, since ``docker exec`` enters the container's namespace, which
the helper sees as its parent pid being 0; in a local jail: bubblewrap's, the helper's parent;
only when started with ``--reap-init``, which DockerSandbox passes for the containers it made,
whose init has one child of its own, and LocalSandbox for its jails: a foreign container's init
may run services). Those two adopters' children are therefore the
escaped processes of some command, and every time a command ends, times out or is killed, the
helper kills them all, and in rounds what they leave behind (`kill_orphans`), except: a running
command's leader, the container's own command (the oldest child of init), a process still
carrying a running command's marker (it is that command's, and dies with it), and a background
job's supervisor (`sandboxes.jobs`), which was detached on purpose and is killed by its own
marker: only one this helper saw a job's start leave behind (the start names its marker,
``JOB_START_ENV``), or found adopted by init when it started (an earlier helper's, before a
restart), is spared: a job's marker alone is not, since any process can set it. Which command an
unmarked orphan came from cannot be known (another command may have made it), so it does not
outlive the next end of ANY command: a command relying on a daemon that dropped the marker and
left its tree loses it early; nothing else is lost. Outside a container without a subreaper
(no ctypes), orphans go to the host's init, among the host's processes, and are not touched.

Most commands run in a shell started before they came, once an earlier command like them was
answered (`_spawn`): starting a shell is mostly exec and dynamic linking, which then costs them
nothing.

The helper never speaks first (it answers P with H): a transport that reads the stream through
a buffered HTTP response (docker's attach) cannot lose bytes sent before it took the socket.

Why one thread and an event loop (SIGCHLD through a wakeup pipe, timeouts as select deadlines):
three threads started per command (output, wait, timer) cost more than the fork itself, and a
helper that starts no thread cannot be starved of one by a command that took every free pid.

Why a child subreaper: the marker sweep reads every process's environment, which costs ~10 us
per process on the host, after EVERY command. As a subreaper, the helper inherits every orphan
of its commands, so once a command's leader is reaped, none of its descendants can be alive
unless the helper has a child that is not the leader of a running command: only then is /proc
swept. Every command is swept without ctypes or ``/proc/.../children``, and under a small pids
limit (see `_become_subreaper`).
"""

import _signal as signal
import marshal
import os
import select
import struct
import sys
import time

HEADER = struct.Struct(">cII")
STDOUT = b"O"
"""The frame of a command's stdout bytes."""
STDERR = b"S"
"""The frame of a command's stderr bytes (its stdout's are `STDOUT`'s): the client keeps them
apart, and merges them in the order they arrive for a merged answer."""
NATIVE_OPS = ["write", "cas_write", "read_file", "download", "upload", "grep", "find_files", "ls", "delete"]
"""The file ops this helper answers without a process (`_files`, `_uploads`, `_search`'s
``SEARCH_OPS``, `_listing`'s ``LISTING_OPS``), named in the hello before their code is
compiled (`_load_native`)."""
MAX_FRAME = 64 << 20
DRAIN_GRACE = 0.2
TIMED_OUT_DRAIN = 2.0
HOLD = 0.005
"""Seconds an acknowledgement or output frame may wait for the next frame (see `send`): far
below anything a client times (its acknowledgement timeout is seconds), about what a short
command takes, so that its A, O and X go out together."""
HOLD_BYTES = 64 << 10
NATIVE_IDLE = 0.05
_session = os.urandom(8).hex()
_base_env = dict(os.environ)
_commands = {}  # id -> Command, until its exit is sent
_leaders = {}  # pid -> Command, while that pid is UNREAPED (so it is still ours to signal)
_inbox = bytearray()
_outbox = bytearray()  # frames queued for the client (`send`)
_held_until = [None]  # when the oldest frame held in _outbox must go out; None: none held
_ended = []  # commands answered this turn, whose leftovers are swept once the answers are out
_chunk = bytearray(1 << 20)  # read into, not allocated per read: os.read(fd, 1 MiB) costs ~15 us of mmap
_serving = [True]
_subreaper = [False]
_undumpable = [False]
_main = [None]  # (pid, starttime) of the container's own command, when in a container's pid namespace
_jobs = {}  # (pid, starttime) -> marker of each background job's supervisor the helper saw started (`_reap`)
_markers = [0]  # of the shells started ahead of their command (`_spawn`)
_native_loaded = [None]
"""Whether `_NATIVE_SOURCE` (the file ops: `_files`, `_uploads`, `_reads`, `_search`, `_listing`, which
the shipped script carries as a string) is compiled into this module's globals (``None``: not
tried yet). Not at the start: they are 45% of the source, and compiling them cost every helper's
start 3.5 ms (of 7.6 for the whole script, in the runtime image) before its first command. They
are compiled once the helper has been idle `NATIVE_IDLE` seconds with no command running (an
agent's sandbox between two turns, a pool's spare), or by the first file op that comes sooner
(`_load_native`)."""
_last_event = [0.0]  # monotonic time the loop last had something to do
_streaming = {}  # id -> a file op's answer being sent, a step a turn (`_reads`)


class _Poller(object):
    """fd -> callback(events) over epoll (poll elsewhere): the selectors module costs ~10 us a
    registration in Python, and every command registers its output."""

    READ = select.POLLIN | select.POLLHUP | select.POLLERR
    WRITE = select.POLLOUT | select.POLLERR

    def __init__(self):
        self.epoll = hasattr(select, "epoll")
        self.poller = select.epoll() if self.epoll else select.poll()
        self.callbacks = {}

    def register(self, fd, events, callback):
        self.poller.register(fd, events)
        self.callbacks[fd] = callback

    def unregister(self, fd):
        self.poller.unregister(fd)
        del self.callbacks[fd]

    def poll(self, timeout):
        """[(callback, events)] ready within ``timeout`` seconds (``None``: no limit)."""
        if self.epoll:
            ready = self.poller.poll(-1 if timeout is None else timeout)
        else:
            ready = self.poller.poll(None if timeout is None else timeout * 1000)
        return [(self.callbacks[fd], events) for fd, events in ready if fd in self.callbacks]


_poller = _Poller()
_spares = Spares(_leaders, _spare_env)  # shells waiting for commands (`_spawn`, `_command`)


def send(kind, ident, payload=b"", answer=False):
    """Queue one frame for the client. An ``answer`` (hello, exit, error) goes out at the end of
    this turn of the loop, with everything queued before it and the turn's other answers (20
    commands ending together: one write, not 20; measured through the service with 20 clients:
    ~4% more commands a second, ~8% less CPU in dockerd and the helper per command); an
    acknowledgement or output waits at most `HOLD` seconds, or until `HOLD_BYTES` are queued,
    for the next frame: a short command's A, O and X then leave in one write, which is one SSH
    packet (or pipe read, or docker frame) and one wake-up of the client's reader instead of
    three. The order of frames is kept."""
    _outbox.extend(HEADER.pack(kind, ident, len(payload)))
    _outbox.extend(payload)
    if len(_outbox) >= HOLD_BYTES:
        flush()
    elif answer:
        _held_until[0] = 0.0  # at the end of this turn of the loop, with the turn's other answers
    elif _held_until[0] is None:
        _held_until[0] = time.monotonic() + HOLD


def send_exit(ident, code, timed_out=False):
    """Answer X: ``{"code": code, "timed_out": timed_out}``."""
    send(b"X", ident, _json({"code": code, "timed_out": timed_out}).encode(), answer=True)


def _json(value):
    """``json.dumps(value)`` of the helper's own answers (None, bools, ints, and dicts, lists and
    strings of them), without `json`: importing it (with `re` and `enum`) and `signal` (with
    `enum`; hence `_signal`, the C module behind it, with the same calls and numbers) was 5.5 ms
    of every helper's start, a quarter of it, in the runtime image. What the client sends comes
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


def _json_escape(char):
    code = ord(char)
    if code > 0xFFFF:  # JSON's escapes are UTF-16
        code -= 0x10000
        return "\\u%04x\\u%04x" % (0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF))
    return "\\u%04x" % code


def flush():
    """Write every queued frame (blocking, whole). A client gone (its end of the stream closed)
    ends the serving as the end of its input does, into the loop's cleanup (its commands killed,
    its file ops aborted): a traceback here skipped that, and left its commands running."""
    _held_until[0] = None
    if not _outbox:
        return
    with memoryview(_outbox) as view:
        written = 0
        while written < len(view):
            try:
                written += os.write(1, view[written:])
            except BlockingIOError:  # someone made the stream non-blocking: wait, as a blocking write would
                select.select([], [1], [])
            except (BrokenPipeError, ConnectionResetError):  # the client is gone: as at the end of its input
                _serving[0] = False
                break
    del _outbox[:]


# ------------------------------------------------------------------ processes


def _become_undumpable():
    """Whether commands can no longer reach into the helper (PR_SET_DUMPABLE 0).

    They run as the helper's uid, so otherwise any of them could open /proc/<helper>/fd/1 (or
    use pidfd_getfd, /proc/<helper>/mem, ptrace) and write forged frames into the client's
    stream: a header announcing gigabytes, another command's exit. A non-dumpable process's
    /proc entries belong to root and ptrace access needs CAP_SYS_PTRACE, which sandboxes lack.
    execve resets the flag, so commands started from here are ordinary again."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE
    except Exception:  # no ctypes: the client's frame checks are the only defence
        return False


def _kill_orphans(ended=()):
    """`kill_orphans`, sparing the jobs' supervisors (``_jobs``) and what the running commands
    account for, and the supervisors that the job starts among them, among the answered ones not
    swept after yet (``_ended``) or among the ``ended`` being swept after now left behind."""
    commands = list(_commands.values()) + _ended + list(ended)
    kill_orphans(_subreaper[0], _main[0], _leaders, commands, _jobs)


# ------------------------------------------------------------------ the stream


def _on_sigchld(_mask):
    try:
        while os.read(_wakeup[0], 4096):
            pass
    except OSError:  # drained (non-blocking)
        pass
    for command in list(_leaders.values()):
        if not command.reaped and command.has_exited():  # (reaped meanwhile: an answer's orphan check)
            command.exited()
    reap_orphans(_leaders)


def _on_input(_mask):
    size = os.readv(0, [_chunk])
    if not size:
        _serving[0] = False
        return
    _inbox.extend(memoryview(_chunk)[:size])
    while _serving[0] and len(_inbox) >= HEADER.size:  # a client gone (`flush`): nothing more is started
        kind, ident, length = HEADER.unpack_from(_inbox)
        if kind not in b"PRICKMF" or length > MAX_FRAME:
            sys.stderr.write("sandboxes exec helper: corrupt frame %r, exiting\n" % (bytes(_inbox[: HEADER.size]),))
            _serving[0] = False  # a corrupt stream: end it (the client sees EOF) rather than wait for a bogus length
            return
        if len(_inbox) < HEADER.size + length:
            return
        payload = bytes(_inbox[HEADER.size : HEADER.size + length])
        del _inbox[: HEADER.size + length]
        _handle(kind, ident, payload)


def _handle(kind, ident, payload):
    if kind == b"P":
        hello = {"pid": os.getpid(), "python": sys.version.split()[0], "subreaper": _subreaper[0],
                 "undumpable": _undumpable[0], "container": _main[0] is not None,
                 "pids_limit": _pids_limit(),
                 "spawn": "posix_spawn" if _POSIX_SPAWN else "popen", "warm": _spares.enabled,
                 "native": NATIVE_OPS}  # fmt: skip
        send(b"H", 0, _json(hello).encode(), answer=True)
        return
    if kind == b"R":
        send(b"A", ident)
        command = None
        try:
            command = Command(ident, marshal.loads(payload))
            command.start()
        except Exception as exc:  # bad cwd, no pid left for a fork: report, keep serving
            if command is not None:
                command.kill()
                command.finished = True
                command.close_output()
                command.close_stdin()
                _commands.pop(ident, None)
            send(b"E", ident, ("%s: %s" % (type(exc).__name__, exc)).encode("utf-8", "replace"), answer=True)
        return
    if kind == b"M":
        _kill_marked_for_client(ident, payload)
        return
    if kind == b"F":
        _start_native(ident, payload)
        return
    command = _commands.get(ident)
    if command is None:
        if _native_loaded[0]:  # else no file op was ever started: nothing to feed
            feed_native_op(kind, ident, payload)
        return
    if command.finished:
        return
    if kind == b"I":
        command.feed(payload)
    elif kind == b"C":
        command.feed(None)
    elif kind == b"K":
        command.stop()


def _start_native(ident, payload):
    """F: `start_native_op`, its code compiled first if it was not yet (`_load_native`); a helper
    that cannot compile it answers N, and the script does the op."""
    if not _load_native():
        send(b"N", ident, answer=True)
        return
    start_native_op(ident, payload)


def _load_native():
    """Whether the file ops' code (`_NATIVE_SOURCE`) is compiled into this module's globals,
    compiling it now if it was not (once: a failure is reported on stderr and not retried)."""
    if _native_loaded[0] is None:
        _native_loaded[0] = False
        try:
            exec(compile(_NATIVE_SOURCE, "<native ops>", "exec"), globals())
            _native_loaded[0] = True
        except Exception as exc:
            sys.stderr.write("native file ops unavailable: %s: %s\n" % (type(exc).__name__, exc))
    return _native_loaded[0]


def _kill_marked_for_client(ident, payload):
    """M: kill every process carrying a marker, from this process: no fork, so it works when the
    sandbox's process limit is reached (a command that fork-bombed), when no command can start."""
    try:
        spec = marshal.loads(payload)
        name, value = spec["name"], spec["value"]
        if not isinstance(name, str) or not isinstance(value, str) or not name or not value:
            raise ValueError("a name and a value are needed")
        cleared = kill_marked(value, name)
    except Exception as exc:  # a bad request: say so, keep serving
        send(b"E", ident, ("%s: %s" % (type(exc).__name__, exc)).encode("utf-8", "replace"), answer=True)
        return
    send_exit(ident, 0 if cleared else 1)


def _sweep_ended():
    """Kill what escaped the commands answered this turn, once their answers are written (an
    answer is flushed in the turn it was queued, see `send`): scanning /proc must not delay
    them. By marker when the helper has a child that is no running command's leader (or is no
    subreaper) and some process still carries one of their markers (one scan of /proc for all
    of them); then every unprotected orphan, once for them all (`kill_orphans` works in rounds
    until none is left, whoever they came from), unless there can be none: the helper's
    children are all leaders and it reaps for no container's init."""
    if not _ended:
        return
    ended = list(_ended)
    del _ended[:]
    strays = has_strays(_subreaper[0], _leaders)
    if strays and any_marked([command.marker for command in ended]):  # one scan for them all
        for command in ended:
            kill_marked(command.marker)
    if strays or _main[0] is not None:  # else the helper's children are all leaders: no orphan
        _kill_orphans(ended)
    for command in ended:  # a job's start may leave its supervisor to this sweep only
        command.job_needle = None


def _wait_time():
    if _streaming:  # more to send: look at the rest and go on
        return 0.0
    deadlines = [d for d in (c.next_deadline() for c in _commands.values()) if d is not None]
    if _held_until[0] is not None:
        deadlines.append(_held_until[0])
    if _native_loaded[0] is None and not _commands:
        deadlines.append(_last_event[0] + NATIVE_IDLE)
    if not deadlines:
        return None
    return max(0.0, min(deadlines) - time.monotonic())


def main():
    global _wakeup
    _undumpable[0] = _become_undumpable()
    _subreaper[0] = _become_subreaper()
    _main[0] = _container_main("--reap-init" in sys.argv[1:])
    seed_jobs(_main[0], _jobs)
    _wakeup = os.pipe()
    for fd in _wakeup:
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(_wakeup[1])
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup byte is what the loop sees
    _poller.register(0, _Poller.READ, _on_input)
    _poller.register(_wakeup[0], _Poller.READ, _on_sigchld)
    _last_event[0] = time.monotonic()
    while _serving[0]:
        ready = _poller.poll(_wait_time())
        for callback, events in ready:
            callback(events)
            if not _serving[0]:
                break
        if _streaming and _serving[0]:
            step_streams()
        now = time.monotonic()
        if ready or _commands or _streaming:
            _last_event[0] = now
        elif _native_loaded[0] is None and now >= _last_event[0] + NATIVE_IDLE:
            _load_native()
        for command in list(_commands.values()):
            deadline = command.next_deadline()
            if deadline is not None and now >= deadline and not command.finished:
                command.on_deadline(now)
        if _held_until[0] is not None and now >= _held_until[0]:
            flush()
        _sweep_ended()
        if _spares.wanted is not None and _serving[0]:  # after an answer: see `Spares`
            if _held_until[0] == 0.0:  # one the sweep's reaping queued: out first
                flush()
            _spares.top_up()
    _sweep_ended()
    _spares.drop(lambda shell: True)
    if _native_loaded[0]:
        abort_native_ops()
    for command in list(_commands.values()):  # the client is gone: nobody can collect these results
        command.finished = True
        command.kill()
    _kill_orphans()


if __name__ == "__main__":
    main()
