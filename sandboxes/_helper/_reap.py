"""Finding and killing what a command left behind, for the exec helper (`_server`), with which
whose package it is part of: stdlib only, Python 3.6-compatible.

Two ways to find a command's processes: its marker (an environment entry every descendant
inherits unless it drops it; killed by `sandboxes._helper._kill.kill_marked`),
and adoption: what escaped its group and dropped its marker is an
orphan, adopted by the helper (a subreaper) or by the container's (or jail's) init. See
"Orphans" in the helper's docstring for what is killed and why, and which jobs' supervisors are
spared (the helper's own record of them, ``_jobs``: never a marker alone, which can be forged).
Whether the helper becomes a subreaper at all (`_become_subreaper`) is decided here too.
"""

import os
import select
import time

from ._kill import JOB_MARKER_PREFIX, MARKER_ENV, _environ, _stat_fields

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: `typing` is not imported in the sandbox
    import signal
    from collections.abc import Sequence
    from typing import Any
else:  # the C module behind `signal` (which imports `enum`), with the same calls and numbers
    import _signal as signal

SWEEP_ROUNDS = 20
SMALL_PIDS_LIMIT = 4096


def _children(pid: int) -> "list[int]":
    """Pids of ``pid``'s children: ``/proc/<pid>/task/*/children`` where the kernel has it, else
    every process whose parent it is."""
    found: "list[int]" = []
    try:
        for task in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, task), "rb") as fh:
                found += [int(child) for child in fh.read().split()]
        return found
    except (OSError, ValueError):
        pass
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[1] == pid:
                found.append(int(entry))
    return found


def _stat(pid: int) -> "tuple[str, int, int] | None":
    """(state, parent pid, start time) of ``pid`` from /proc/<pid>/stat, or None if it is gone
    (`_stat_fields`: `sandboxes._helper._kill`'s)."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return fields[0].decode(), int(fields[1]), int(fields[19])


def _container_main(reap_init: bool) -> "tuple[int, int] | None":
    """(pid, start time) of the process whose tree init's other children escaped, when the helper
    was asked to reap init's orphans (``reap_init``: a sandbox made by us, whose init has no other
    children of its own), else None: init's children are left alone. In a container's pid
    namespace (the helper's parent is outside it: ``docker exec``) that is the container's own
    command (the oldest child of its init); in a local jail (bubblewrap's init is the helper's
    parent, and the helper is pid 2, which on a host is always the kernel's) the helper itself."""
    if not reap_init or os.getpid() == 1:
        return None
    if os.getppid() == 1 and os.getpid() == 2:
        stat = _stat(2)
        return None if stat is None else (2, stat[2])
    if os.getppid() != 0:
        return None
    oldest: "tuple[int, int] | None" = None
    for pid in _children(1):
        stat = _stat(pid)
        if stat is not None and (oldest is None or stat[2] < oldest[1]):
            oldest = (pid, stat[2])
    return oldest


def _spared(pid: int, start: int, commands: "Sequence[Any]", jobs: "dict[tuple[int, int], bytes]") -> bool:
    """Whether the orphan ``pid`` (started at ``start``) is a background job's supervisor or
    belongs to a running command. A job's supervisor is one in ``jobs`` ((pid, start) -> its
    marker), or one carrying the supervisor marker a job's start announced (``job_needle`` of a
    command in ``commands``, a start not yet swept after), which enters ``jobs`` now: the helper's
    own record, since a job's marker (`JOB_MARKER_PREFIX`) can be set by any process. Else it is
    spared only while it carries a running command's marker (that command kills it), or when it
    carries a supervisor's marker and started before every one of ``commands`` (each's ``born``):
    then no command of this helper made it, and it is another helper's job (a replica's, sharing
    the sandbox), which this helper's record cannot hold. What a command forges is younger than
    that command, and dies."""
    if (pid, start) in jobs:
        return True
    environ = _environ(pid)  # `sandboxes._helper._kill`'s: it waits out an exec
    if not environ:
        return False
    for command in commands:
        if command.job_needle is not None and command.job_needle in environ:
            jobs[(pid, start)] = command.job_needle
            return True
    for command in commands:
        if not command.finished and command.needle in environ:
            return True
    needle = _supervisor_needle(environ)
    born = [command.born for command in commands]
    if needle is not None and born and None not in born and start < min(born):
        jobs[(pid, start)] = needle  # another helper's job (a replica's), older than these commands
        return True
    return False


def now_ticks() -> "int | None":
    """The time since boot in the unit of a process's start time in /proc/<pid>/stat; None where
    it cannot be read (then no orphan is taken for another helper's job)."""
    try:
        with open("/proc/uptime") as uptime:
            return int(float(uptime.read().split()[0]) * os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def _supervisor_needle(environ: bytes) -> "bytes | None":
    """The job supervisor's marker entry in ``environ`` (NUL-delimited), or None."""
    prefix = ("\0%s=%s" % (MARKER_ENV, JOB_MARKER_PREFIX)).encode()
    at = environ.find(prefix)
    if at == -1:
        return None
    needle = environ[at : environ.index(b"\0", at + 1) + 1]
    return needle if needle.endswith(b"-s\0") else None


def seed_jobs(main: "tuple[int, int] | None", jobs: "dict[tuple[int, int], bytes]") -> None:
    """Record as jobs' supervisors the orphans of the container's init that carry a supervisor's
    marker when the helper starts (a service restart started a new helper; the old one's record
    died with it). Nothing when init's orphans are not swept: then nothing kills them either."""
    if main is None:
        return
    for pid in _children(1):
        stat = _stat(pid)
        if stat is None or stat[0] in "ZX" or pid == main[0]:
            continue
        needle = _supervisor_needle(_environ(pid))
        if needle is not None:
            jobs[(pid, stat[2])] = needle


def _forget_ended_jobs(jobs: "dict[tuple[int, int], bytes]") -> None:
    """Drop the supervisors that ended (or whose pid now names another process) from ``jobs``."""
    for pid, start in list(jobs):
        stat = _stat(pid)
        if stat is None or stat[2] != start or stat[0] in "ZX":
            del jobs[(pid, start)]


def kill_orphans(
    subreaper: bool,
    main: "tuple[int, int] | None",
    leaders: "dict[int, Any]",
    commands: "Sequence[Any]",
    jobs: "dict[tuple[int, int], bytes]",
) -> None:
    """Kill what escaped every running command: see "Orphans" in the module docstring. Spared:
    jobs' supervisors and what carries a running command's marker (`_spared`).

    In rounds: killing an orphan hands its own children to the same adopter, where the next
    round finds them. Each victim is signalled through a pidfd opened before it was looked at,
    so a pid reused meanwhile is never hit: the helper's own children cannot be reaped during
    the sweep (it reaps them itself, later), but init's are reaped by init at any moment.
    Without pidfds (Python < 3.9, Linux < 5.3) init's children get a plain kill(2), which can
    hit a pid reused in the microseconds between the look and the kill."""
    adopters = ([os.getpid()] if subreaper else []) + ([1] if main is not None else [])
    _forget_ended_jobs(jobs)
    for _ in range(SWEEP_ROUNDS):
        victims: "list[tuple[int, int | None]]" = []
        for adopter in adopters:
            for pid in _children(adopter):
                if pid in leaders or (adopter == 1 and main is not None and pid == main[0]):
                    continue
                handle = _pidfd(pid)
                stat = _stat(pid)
                if stat is None or stat[0] in "ZX" or _spared(pid, stat[2], commands, jobs):
                    _close(handle)
                    continue
                victims.append((pid, handle))
        if not victims:
            return
        for pid, handle in victims:
            _kill_pid(pid, handle)
        deadline = time.monotonic() + 1.0
        for _pid, handle in victims:  # until they are dead, so their children are re-parented
            if handle is not None:
                try:
                    select.select([handle], [], [], max(0.0, deadline - time.monotonic()))
                except OSError:
                    pass
            _close(handle)


def reap_orphans(leaders: "dict[int, Any]") -> None:
    """Reap exited children: a running command's leader (``leaders``: pid -> its command) goes
    through its ``exited`` (its group is killed first), an adopted orphan is simply reaped.
    WNOWAIT first, so that no leader is ever reaped unseen."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or not info.si_pid:
            return
        command = leaders.get(info.si_pid)
        if command is not None:
            command.exited()
            continue
        try:
            os.waitpid(info.si_pid, 0)
        except ChildProcessError:
            pass


def has_strays(subreaper: bool, leaders: "dict[int, Any]") -> bool:
    """Whether the helper has a child that is no running command's leader (``leaders``): an
    orphan it adopted (as a ``subreaper``), so some command's descendant may be alive. Always
    True when it is no subreaper (it cannot tell)."""
    if not subreaper:
        return True
    reap_orphans(leaders)
    return any(pid not in leaders for pid in _children(os.getpid()))


def _pidfd(pid: int) -> "int | None":
    try:
        return os.pidfd_open(pid)  # novermin: Python 3.9's, AttributeError before
    except (AttributeError, OSError):  # Python < 3.9 or an old kernel: plain kill(2)
        return None


def _kill_pid(pid: int, handle: "int | None") -> None:
    try:
        if handle is not None:
            signal.pidfd_send_signal(handle, signal.SIGKILL)  # novermin: a handle means 3.9+
        else:
            os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _close(handle: "int | None") -> None:
    if handle is not None:
        os.close(handle)


def _pids_limit() -> "int | None":
    """The pids limit of the cgroup this helper's view of /sys/fs/cgroup is rooted at (its
    container's, usually), or None: unlimited or unknown."""
    for path in ("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"):
        try:
            with open(path) as fh:
                value = fh.read().strip()
        except (OSError, ValueError):
            continue
        return int(value) if value.isdigit() else None
    return None


def _become_subreaper() -> bool:
    """Whether the helper now adopts its commands' orphans (and so may skip the /proc sweep).

    Not under a small pids limit: the orphans' zombies hold pids until this (Python, and under a
    fork bomb CPU-starved) reaper gets to them, where the container's init would reap them at
    once, so a fork bomb would starve the sandbox of pids for longer. A small limit also means a
    container with few processes, where the sweep is cheap."""
    limit = _pids_limit()
    if limit is not None and limit <= SMALL_PIDS_LIMIT:
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(36, 1, 0, 0, 0) == 0)  # PR_SET_CHILD_SUBREAPER
    except Exception:  # no ctypes, no prctl, not Linux: every command gets the full sweep
        return False
