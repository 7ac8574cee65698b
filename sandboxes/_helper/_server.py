"""The exec helper that runs INSIDE a sandbox (shipped as source with ``python3 -c``).

One long-lived process per sandbox answers many concurrent commands over one byte stream, so a
command costs a fork instead of a ``docker exec`` or an SSH channel setup. Stdlib only
and Python 3.6-compatible: it runs on whatever python3 the image has. Its package (`_reap`,
whose ``kill_orphans``, ``reap_orphans``, ``has_strays`` and ``_container_main`` it calls,
`_spawn`, `_command`: a command from its request to its answer, `_loop`: the state and `send`,
`_kill`, `frames`: every frame kind by name) is shipped as sources behind a one-line bootstrap
(`sandboxes._mux._shipped`); `main` runs it.

Frames both ways: 1 byte type, 4 bytes command id, 4 bytes length (big endian), payload.
  client -> helper: P ping, R run (a spec; one holding ``watch``: a file watch, `_watch`),
                    I stdin bytes, C close stdin, K kill,
                    M kill marked ({name, value}: every process of the sandbox whose
                    environment holds name=value, killed by the helper itself),
                    F file op (`_files`: a read or write without a process, its bytes as I/C;
                    `_search`: a grep or glob, answered whole), Z a terminal's new size
                    (`_pty`: an R spec with ``pty`` runs its command on one), G a relay's bytes
                    taken (R with ``relay: {port}``: a TCP connection inside the sandbox,
                    `_relay`); specs are
                    `marshal`'d dicts
  helper -> client: H hello (JSON), A accepted (queued BEFORE the command is started; its timeout
                    counts from here. It goes out with the command's first output or answer,
                    or `HOLD` seconds later, see `send`. Its absence proves nothing: a request
                    the client wrote may be read and run after the client gave up, so the
                    client never resends a written request, acknowledged or not), O output
                    bytes, X exit (JSON {code, timed_out}; for M: code 0 when none was left),
                    S stderr bytes (O: stdout's; in the order the helper read them),
                    E error text, N not native here (`_files`: the client runs the script),
                    G a relay's window, then its bytes written (`_relay`)
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

Why a child subreaper: the marker sweep reads every process's environment, one read per
process on the host, after EVERY command. As a subreaper, the helper inherits every orphan
of its commands, so once a command's leader is reaped, none of its descendants can be alive
unless the helper has a child that is not the leader of a running command: only then is /proc
swept. Every command is swept without ctypes or ``/proc/.../children``, and under a small pids
limit (see `_become_subreaper`).
"""

import marshal
import os
import sys
import time

from ._command import Command, _commands, _ended, _kill_orphans, _leaders, _spares
from ._kill import any_marked, kill_marked
from ._loop import (
    MAX_FRAME,
    NATIVE_OPS,
    _chunk,
    _held_until,
    _inbox,
    _jobs,
    _json,
    _main,
    _Poller,
    _poller,
    _serving,
    _streaming,
    _subreaper,
    _undumpable,
    add_sources,
    flush,
    send,
    send_exit,
)
from ._reap import _become_subreaper, _container_main, _pids_limit, has_strays, reap_orphans, seed_jobs
from ._spawn import _POSIX_SPAWN
from .frames import (
    ACCEPTED,
    CLIENT_KINDS,
    CLOSE_STDIN,
    ERROR,
    FILE_OP,
    HEADER,
    HELLO,
    KILL,
    KILL_MARKED,
    NOT_NATIVE,
    PING,
    RESIZE,
    RUN,
    STDIN,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: `typing` is not imported in the sandbox
    import signal
    from typing import Any

    from ._loop import Running
    from ._watch import Watch
else:  # the C module behind `signal` (which imports `enum`), with the same calls and numbers
    import _signal as signal

NATIVE_IDLE = 0.05
_libc: "list[Any]" = [None]  # the C library through ctypes, once `_become_undumpable` loaded it
_native: "list[Any]" = [None]  # `_files`, once imported (`_load_native`)
_native_loaded: "list[bool | None]" = [None]
"""Whether the file ops (`_files`, and `_native`, `_uploads`, `_reads`, `_search`, `_listing`
that it imports) are imported (``None``: not tried yet). Not at the start: no command waits for
their code to compile. They are imported once the helper has been idle `NATIVE_IDLE` seconds with no command running (an
agent's sandbox between two turns, a pool's spare), or by the first file op that comes sooner
(`_load_native`)."""
_last_event = [0.0]  # monotonic time the loop last had something to do
_wakeup = (-1, -1)  # the pipe SIGCHLD wakes the loop through (`main`)
_relay: "list[Any]" = [None]  # `_relay`, once a relay was asked for

# ------------------------------------------------------------------ processes


def _become_undumpable() -> bool:
    """Whether commands can no longer reach into the helper (PR_SET_DUMPABLE 0).

    They run as the helper's uid, so otherwise any of them could open /proc/<helper>/fd/1 (or
    use pidfd_getfd, /proc/<helper>/mem, ptrace) and write forged frames into the client's
    stream: a header announcing gigabytes, another command's exit. A non-dumpable process's
    /proc entries belong to root and ptrace access needs CAP_SYS_PTRACE, which sandboxes lack.
    execve resets the flag, so commands started from here are ordinary again."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        _libc[0] = libc
        return bool(libc.prctl(4, 0, 0, 0, 0) == 0)  # PR_SET_DUMPABLE
    except Exception:  # no ctypes: the client's frame checks are the only defence
        return False


def _release_freed() -> None:
    """Hand the heap's free pages back to the kernel (the C library's ``malloc_trim``, where it
    has one): memory a compile freed otherwise stays counted against the sandbox while it idles."""
    trim = getattr(_libc[0], "malloc_trim", None)  # None: no ctypes; musl has no malloc_trim
    if trim is not None:
        trim(0)


# ------------------------------------------------------------------ the stream


def _on_sigchld(_mask: int) -> None:
    try:
        while os.read(_wakeup[0], 4096):
            pass
    except OSError:  # drained (non-blocking)
        pass
    for command in list(_leaders.values()):
        if not command.reaped and command.has_exited():  # (reaped meanwhile: an answer's orphan check)
            command.exited()
    reap_orphans(_leaders)


def _on_input(_mask: int) -> None:
    if _relay[0] is not None and _relay[0].taking_input(_inbox):  # a relay's upload, through a splice
        _relay[0].take_input(_inbox)
        if _inbox:  # a header it did not take: its frame may be whole (K, C) and nothing else come
            with memoryview(_inbox) as held:
                taken = _take_frames(held)
            del _inbox[:taken]
        _relay[0].write_fed()
        return
    size = os.readv(0, [_chunk])
    if not size:
        _serving[0] = False
        return
    with memoryview(_chunk) as read:
        if not _inbox:  # frames read whole are cut from the read itself, not copied through the inbox
            taken = _take_frames(read[:size])
            _inbox.extend(read[taken:size])
        else:
            _inbox.extend(read[:size])
            with memoryview(_inbox) as held:
                taken = _take_frames(held)
            del _inbox[:taken]
    if _relay[0] is not None:  # what the frames fed the relays goes out together
        _relay[0].write_fed()


def _take_frames(data: "memoryview") -> int:
    """Handle every whole frame at the start of ``data``; how many bytes they took. Each
    payload is one copy of its bytes (``data`` is the loop's buffer, reused)."""
    taken = 0
    while _serving[0] and len(data) - taken >= HEADER.size:  # a client gone (`flush`): nothing more is started
        kind, ident, length = HEADER.unpack_from(data, taken)
        if kind not in CLIENT_KINDS or length > MAX_FRAME:
            head = bytes(data[taken : taken + HEADER.size])
            sys.stderr.write("sandboxes exec helper: corrupt frame %r, exiting\n" % (head,))
            _serving[0] = False  # a corrupt stream: end it (the client sees EOF) rather than wait for a bogus length
            return taken
        end = taken + HEADER.size + length
        if len(data) < end:
            if kind == STDIN and _relay[0] is not None and _relay[0].pass_frame(kind, ident, length, data, taken):
                return len(data)  # the rest of the frame is its relay's to take from stdin
            break
        payload = bytes(data[taken + HEADER.size : end])
        taken = end
        _handle(kind, ident, payload)
    return taken


def _handle(kind: bytes, ident: int, payload: bytes) -> None:
    if kind == PING:
        hello = {"pid": os.getpid(), "python": sys.version.split()[0], "subreaper": _subreaper[0],
                 "undumpable": _undumpable[0], "container": _main[0] is not None,
                 "pids_limit": _pids_limit(),
                 "spawn": "posix_spawn" if _POSIX_SPAWN else "popen", "warm": _spares.enabled,
                 "native": NATIVE_OPS}  # fmt: skip
        send(HELLO, 0, _json(hello).encode(), answer=True)
        return
    if kind == RUN:
        send(ACCEPTED, ident)
        command: "Running | None" = None
        try:
            spec = marshal.loads(payload)  # noqa: S302 (the client's own request, `wire_spec`)
            if spec.get("sources"):
                add_sources(spec["sources"])
            if isinstance(spec, dict) and (isinstance(spec.get("relay"), dict) or isinstance(spec.get("listen"), dict)):
                _open_relay(ident, spec)
                return
            command = _watch(ident, spec) if "watch" in spec else Command(ident, spec)
            command.start()
        except Exception as exc:  # bad cwd, no pid left for a fork: report, keep serving
            if command is not None:
                command.kill()
                command.finished = True
                command.close_output()
                command.close_stdin()
                _commands.pop(ident, None)
            send(ERROR, ident, ("%s: %s" % (type(exc).__name__, exc)).encode("utf-8", "replace"), answer=True)
        return
    if kind == KILL_MARKED:
        _kill_marked_for_client(ident, payload)
        return
    if kind == FILE_OP:
        _start_native(ident, payload)
        return
    command = _commands.get(ident)
    if command is None:
        if _relay[0] is not None and _relay[0].feed_relay(kind, ident, payload):
            return
        if _native_loaded[0]:  # else no file op was ever started: nothing to feed
            _native[0].feed_native_op(kind, ident, payload)
        return
    if command.finished:
        return
    if kind == STDIN:
        command.feed(payload)
    elif kind == CLOSE_STDIN:
        command.feed(None)
    elif kind == KILL:
        command.stop()
    elif kind == RESIZE:
        command.resize(payload)


def _watch(ident: int, spec: "dict[str, Any]") -> "Watch":
    """R with ``watch``: a file watch instead of a process (`_watch`, whose modules come with
    the request's ``sources``)."""
    from ._watch import Watch

    return Watch(ident, spec)


def _open_relay(ident: int, spec: "dict[str, Any]") -> None:
    """R with a ``relay`` spec (a TCP connection to a port inside the sandbox) or a ``listen``
    spec (a listener there): `_relay`, imported by the first."""
    if _relay[0] is None:
        from . import _relay as relay

        _relay[0] = relay
    _relay[0].open_relay(ident, spec)


def _start_native(ident: int, payload: bytes) -> None:
    """F: `start_native_op`, its code compiled first if it was not yet (`_load_native`); a helper
    that cannot compile it answers N, and the script does the op."""
    if not _load_native():
        send(NOT_NATIVE, ident, answer=True)
        return
    _native[0].start_native_op(ident, payload)


def _load_native() -> "bool | None":
    """Whether the file ops (`_files`) are imported, importing them now if they were not (once:
    a failure is reported on stderr and not retried)."""
    if _native_loaded[0] is None:
        _native_loaded[0] = False
        try:
            from . import _files

            _native[0] = _files
            _native_loaded[0] = True
            _release_freed()  # the parser's memory, and the start's: nothing bigger is compiled after
        except Exception as exc:
            sys.stderr.write("native file ops unavailable: %s: %s\n" % (type(exc).__name__, exc))
    return _native_loaded[0]


def _kill_marked_for_client(ident: int, payload: bytes) -> None:
    """M: kill every process carrying a marker, from this process: no fork, so it works when the
    sandbox's process limit is reached (a command that fork-bombed), when no command can start."""
    try:
        spec = marshal.loads(payload)  # noqa: S302 (the client's own request, `wire_spec`)
        name, value = spec["name"], spec["value"]
        if not isinstance(name, str) or not isinstance(value, str) or not name or not value:
            raise ValueError("a name and a value are needed")
        cleared = kill_marked(value, name)
    except Exception as exc:  # a bad request: say so, keep serving
        send(ERROR, ident, ("%s: %s" % (type(exc).__name__, exc)).encode("utf-8", "replace"), answer=True)
        return
    send_exit(ident, 0 if cleared else 1)


def _sweep_ended() -> None:
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


def _wait_time() -> "float | None":
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


def main() -> None:
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
            _native[0].step_streams()
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
        _native[0].abort_native_ops()
    if _relay[0] is not None:
        _relay[0].close_relays()
    recorded = []
    for command in list(_commands.values()):  # the client is gone: nobody can collect these results
        if getattr(command, "record", None) is not None and not command.finished:
            recorded.append(command)  # but the sandbox's record of it (`_record`) can: it runs on
            continue
        command.finished = True
        command.kill()
        _commands.pop(command.ident, None)
    _kill_orphans()
    if recorded:  # `_record` came with them
        from ._record import linger

        linger(recorded, _sweep_ended)
