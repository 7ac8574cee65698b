"""The one process-tree kill: every process carrying a command's environment marker.

Every command a sandbox runs gets ``SANDBOXES_EXEC_ID=<marker>`` in its environment, and every
descendant inherits it, including the ones that left the command's process group with ``setsid``
or a double fork. Killing "the command" therefore means killing every process whose environment
holds that entry. This module is the only place that does it, in two forms:

- `kill_marked`, in Python, for the host (`LocalSandbox`, the service's local backend) and for
  the exec helper inside a sandbox, whose package this module is part of (`sandboxes._helper`):
  hence stdlib only, Python 3.6-compatible, no ``__future__`` import, and
  annotations that evaluate on 3.6 (local variable annotations are never evaluated).
- `KILL_MARKED_SH`, a POSIX ``sh`` function for sandboxes reached without the helper (one
  ``docker exec`` or SSH channel per command, busybox images included).

Why it is not one scan of /proc and a kill: a process may fork while /proc is being read, and its
child, born after the directory listing, is missed (a single pass lost such races under load in
CI). Rescanning until a scan finds nothing is not enough against a tree that keeps forking (a
fork bomb, ``while :; do sleep 1000 & done``): each kill frees the pid its victim held, which the
survivors fork into, and a scan that takes milliseconds can leave as many children behind as it
kills. So the kill has two phases. First every marked process is stopped (SIGSTOP) as soon as it
is found, and scanning repeats until a scan finds no marked process it had not stopped already:
a stopped process cannot fork, and it keeps its pid, so the tree can only shrink toward zero
runnable members. Then every marked process is killed (SIGKILL), rescanning until a scan finds
none left. Both phases are bounded in time; `kill_marked` says whether the last scan was empty.

The caller must not carry the marker itself (the calling process is skipped, not its children).
A pid is signalled right after its environment was read, not through a pidfd: reusing it in
between needs the pid space to wrap around within microseconds.
"""

import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only (it takes any ``TYPE_CHECKING`` as true): `typing` is no cheaper
    import signal
    from collections.abc import Iterator
else:  # the C module behind `signal`, with the same calls and numbers: see `sandboxes._helper._server`
    import _signal as signal

MARKER_ENV = "SANDBOXES_EXEC_ID"
"""The one marker name, set by every transport on every command (the exec helper, the
per-command fallbacks of Docker, SSH and Local) and by the service on the commands it tracks.
A caller that sets it itself (the service does, with its own unique token) chooses the marker:
the command's tree is then killed by that value."""

JOB_MARKER_PREFIX = "sandboxes-job-"
"""Markers that start with this are background jobs' (`sandboxes.jobs`): processes carrying one
were detached on purpose to outlive the command that started them. The exec helper spares from
its sweep of orphans only the supervisors it saw a job's start leave (`JOB_START_ENV`), since a
marker can be forged; the shell's ``kill_orphans`` (no helper) still spares by marker. A job is
still killed by its own marker, and with its sandbox."""

JOB_START_ENV = "SANDBOXES_JOB_START"
"""Set by `sandboxes.jobs` on the command that starts a job, to the marker its supervisor will
carry: the exec helper takes the supervisor that command leaves behind (and only what it leaves
behind) for a job's, and spares it from the sweep of orphans (`sandboxes._helper._reap`). A job's
marker alone spares nothing: any process may set it."""

RECORD_ENV = "SANDBOXES_STREAM_RECORD"  # a request's: record its command (`_record`)

KILL_DEADLINE = 10.0
"""Seconds each phase of `kill_marked` may take at most."""

_READ_CHUNK = 32768  # below malloc's mmap threshold, so a read's buffer is never mmap'd


def kill_marked(value: str, name: str = MARKER_ENV, deadline: float = KILL_DEADLINE) -> bool:
    """Stop, then kill every process whose environment holds ``name=value`` (see the module
    docstring); whether none was left at the end. An empty ``value`` is refused: it would match
    every command's processes."""
    if not value:
        raise ValueError("an empty marker would match every command's processes")
    needle = f"\0{name}={value}\0".encode()
    found, _ = _sweep(needle, signal.SIGSTOP, set())
    if not found:  # the common case, after every command: one scan
        return True
    stopped: set[int] = set()
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        _, new = _sweep(needle, signal.SIGSTOP, stopped)
        if not new:
            break
    end = time.monotonic() + deadline
    while True:
        found, _ = _sweep(needle, signal.SIGKILL, set())
        if not found:
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.001)  # the killed are exiting: let them have the CPU


def any_marked(values: "list[str]", name: str = MARKER_ENV) -> bool:
    """Whether any process but this one carries ``name=value`` for one of ``values``: one scan
    of /proc for many markers, where `kill_marked` scans once per marker even when there is
    nothing to kill. The exec helper asks it for the commands that ended in one turn of its
    loop (under 20 concurrent clients, several) and kills by marker only when it answers yes.
    A process born during the scan may be missed, as by `kill_marked`'s first scan."""
    needles = [f"\0{name}={value}\0".encode() for value in values if value]
    return any(any(needle in environ for needle in needles) for _, environ in _others())


def _sweep(needle: bytes, signum: int, seen: "set[int]") -> "tuple[int, int]":
    """Signal every process whose environment holds ``needle``, each right after it was read;
    (how many there were, how many of them were not in ``seen``), adding them to ``seen``."""
    found = new = 0
    for pid, environ in _others():
        if needle not in environ:
            continue
        try:
            os.kill(pid, signum)
        except OSError:  # gone meanwhile, or not ours to signal
            continue
        found += 1
        if pid not in seen:
            seen.add(pid)
            new += 1
    return found, new


def _others() -> "Iterator[tuple[int, bytes]]":
    """(pid, environment as `_environ` reads it) of every process but this one, each read when
    its turn comes (so a caller can signal it before the next is read)."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            yield int(entry), _environ(int(entry))


def _environ(pid: int) -> bytes:
    """The environment of ``pid``, NUL-framed on both sides so an entry matches only whole;
    empty if it is gone, a zombie or not ours to read.

    A process in the middle of an ``exec`` has none for a moment: its new memory is in place
    but its environment is not set up yet, and ``/proc/<pid>/environ`` reads empty, often so
    for a process exec'ing in a chain (``sh -c 'exec sh -c ...'``), and the orphan sweep
    (`_reap.kill_orphans`) must not take such a process for one that dropped every marker (a
    job's ``setsid``'d loop, orphaned and exec'ing, would die before its first line). The read
    may also be refused for that moment, for a process of our own user (its new memory is not
    yet marked readable to us). So an empty or refused read counts only between two looks at
    where the environment ends that agree and are not 0 (the same exec's, through); else it
    is read again, for at most `_EXEC_WAIT`.

    Some processes look like that for good: a VM's init started by the kernel (this CI
    machine's pid 1 reads refused, its environment's end 0). One that outlasted a whole wait
    is not waited for again (`_STUCK`), so a host-side scan (`LocalSandbox`'s kill after every
    command of a jail of its own) does not pay the wait on every command."""
    environ = _read_environ(pid)
    if environ not in (b"\0\0", None):
        return environ
    start = _start_time(pid)
    if (pid, start) in _STUCK:
        return b""
    end = time.monotonic() + _EXEC_WAIT
    while time.monotonic() < end:
        before = _env_end(pid)
        environ = _read_environ(pid)
        if environ not in (b"\0\0", None) or before is None or before == _env_end(pid) != b"0":
            return environ or b""  # an environment; gone (or no such field); or empty (or refused) for good
        time.sleep(0.0002)
    if len(_STUCK) >= _STUCK_MAX:
        _STUCK.clear()
    _STUCK.add((pid, start))
    return b""


_EXEC_WAIT = 0.05
"""Seconds to wait for a process's exec to set up its environment: an exec takes well under
a millisecond; a process that could make it longer gains one sweep at most."""

_STUCK = set()  # type: set[tuple[int, bytes | None]]
"""(pid, start time) of the processes whose environment stayed unreadable for a whole
`_EXEC_WAIT`: no exec takes that long, so they are not waited for again (see `_environ`)."""
_STUCK_MAX = 1024


def _start_time(pid: int) -> "bytes | None":
    """``pid``'s start time (clock ticks after boot), which with the pid names one process."""
    fields = _stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


_PF_KTHREAD = 0x00200000


def _read_environ(pid: int) -> "bytes | None":
    """One read of ``/proc/<pid>/environ``, NUL-framed (see `_environ`); ``b""``: gone or
    another user's; None: refused although the process is our own user's (in an exec)."""
    try:
        fd = os.open(f"/proc/{pid}/environ", os.O_RDONLY)
    except PermissionError:
        return None if _uid(pid) == os.geteuid() else b""
    except OSError:
        return b""
    chunks = [b"\0"]
    try:
        while True:
            chunk = os.read(fd, _READ_CHUNK)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError:
        pass
    finally:
        os.close(fd)
    chunks.append(b"\0")
    return b"".join(chunks)


def _uid(pid: int) -> "int | None":
    """``pid``'s real user id from its ``status`` (not the owner of ``/proc/<pid>``, which
    reads root while an exec has its memory unreadable)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _env_end(pid: int) -> "bytes | None":
    """Where ``pid``'s environment ends, from its ``stat`` (``b"0"``: not set up yet, in an
    exec); None if it is gone, a zombie or a kernel thread, or the kernel is older than 3.5."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 49 or fields[0] in (b"Z", b"X") or int(fields[6]) & _PF_KTHREAD:
        return None
    return fields[48]


def _stat_fields(pid: int) -> "list[bytes] | None":
    """The fields of ``/proc/<pid>/stat`` after the command name (the state is the first), or
    None if it is gone. Also the exec helper's (`_reap`)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2 :].split()


KILL_MARKED_SH = r"""kill_marked() {
  [ -n "$1" ] || return 1
  _km_was= _km_r=0
  while [ "$_km_r" -lt 200 ]; do
    _km_r=$((_km_r + 1))
    signal_marked "$1" STOP
    [ -n "$_km_p" ] || break
    [ "$_km_p" = "$_km_was" ] && break
    _km_was=$_km_p
  done
  [ -n "$_km_was$_km_p" ] || return 0
  _km_r=0
  while [ "$_km_r" -lt 1000 ]; do
    _km_r=$((_km_r + 1))
    signal_marked "$1" KILL
    [ -n "$_km_p" ] || return 0
  done
  return 1
}
signal_marked() {
  if command eval '_km_p=$(marked_pids "$1")' 2>/dev/null; then
    [ -z "$_km_p" ] || kill "-$2" $_km_p 2>/dev/null
  else
    signal_read "$1" "$2" -
  fi
}
marked_pids() {
  command eval 'marked_scan "$1"' || exit 2
}
marked_scan() {
  grep -lsxzF -e "SANDBOXES_EXEC_ID=$1" /proc/[0-9]*/environ 2>/dev/null | {
    read -r _km_me _ _ _km_up _ </proc/self/stat
    while IFS=/ read -r _ _ p _; do
      case " $$ $_km_me $_km_up " in *" $p "*) ;; *) printf '%s ' "$p" ;; esac
    done
  }
}
signal_read() {
  _km_p=
  for _km_d in /proc/[0-9]*; do
    _km_q=${_km_d#/proc/}
    [ "$_km_q" != "$$" ] || continue
    {
      while IFS= read -r _km_l || [ -n "$_km_l" ]; do
        case $_km_l in *"SANDBOXES_EXEC_ID=$1"*) ;; *) continue ;; esac
        if [ -n "$3" ]; then
          case ${_km_l#*"SANDBOXES_EXEC_ID=$1"} in "$3"*) continue ;; esac
        fi
        kill "-$2" "$_km_q" && _km_p="$_km_p$_km_q "
        break
      done < "$_km_d/environ"
    } 2>/dev/null
  done
}
"""
"""``kill_marked MARKER``: `kill_marked`'s two phases in POSIX ``sh`` plus ``grep`` (GNU or
busybox: ``-z`` reads NUL-separated entries, ``-x`` matches one whole), for sandboxes reached
without the exec helper. One ``grep`` reads every process's environment per scan (not one
``grep`` per process, a process start each); phase one ends when a scan finds the same
processes as the one before (all of them stopped already). Bounded by rounds rather than time
(``sh`` has no clock).
It skips the shell running it (``$$``) and the subshells it forks to read the scan (a forked
subshell shows the environment the shell started with, which may hold the marker even after an
``unset``); whatever else runs it must not carry the marker.

A sandbox whose pids limit the tree filled may leave no room for the scan's processes, and a
shell that cannot fork dies (dash, busybox ash), so the scan is tried under ``command eval``,
which turns that death into a failed status. Twice: in the shell, for the fork of the
substitution's subshell, and in that subshell (``marked_pids``, which then exits), for the forks
of its pipeline; a subshell that failed to fork under only the shell's ``command eval`` returns
into the shell's code after it (busybox ash does), a second copy of the kill. Then
``signal_read MARKER SIGNAL NEXT`` scans with the shell's built-ins alone (``read`` of each
``/proc/<pid>/environ``, slower than ``grep``, so only when that scan failed). ``read`` drops
the NUL bytes between entries, so the marker is found as a substring, wherever it is (another
variable's value may hold it), unless its first occurrence on a line is followed by NEXT (``-``,
what `kill_marked` passes: the markers of a job's other roles, ``MARKER-s``, start with MARKER;
empty: every marker that starts with MARKER)."""
