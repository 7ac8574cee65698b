"""Freezing a local sandbox's jail: every process in it stopped where it is, then let go.

The jail's cgroup freezer holds it where the sandbox has one (`Cgroup.freeze`); without one
(no writable cgroups, v1 without a freezer hierarchy, or a freezer that did not settle), every
process of the jail gets
``SIGSTOP``, and ``SIGCONT`` back: the processes of its cgroup, or else the jail's launch
process and all its descendants (a jail is a pid namespace, so an orphan in it is reparented
to the jail's init, still a descendant).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path

from sandboxes.local._limits import Cgroup

logger = logging.getLogger(__name__)

__all__ = ["freeze_jail", "kill_jail", "thaw_jail"]

_PASSES = 20
"""Rounds of stopping what is found: a process may fork while the tree is read."""


def freeze_jail(cgroup: Cgroup | None, launcher: int | None) -> None:
    """Stop every process of the jail (its cgroup's, else ``launcher``'s tree); signals where
    the cgroup's freezer did not settle (it was thawed again)."""
    try:
        if cgroup is not None and cgroup.freeze():
            return
    except OSError as exc:
        logger.warning("the freezer did not stop the jail (%s); stopping its processes by signal", exc)
    stopped: set[int] = set()
    for _ in range(_PASSES):
        found = set(_members(cgroup, launcher)) - stopped
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= found
    _wait_stopped(stopped)


def _wait_stopped(pids: set[int], deadline: float = 5.0) -> None:
    """Until every one of ``pids`` has stopped (or is gone): a signal takes effect once its
    process is scheduled, which on a loaded machine takes a moment. Bounded: a process that
    does not stop in ``deadline`` seconds is left to the caller's next look."""
    end = time.monotonic() + deadline
    while any(_state(pid) not in _STOPPED for pid in pids) and time.monotonic() < end:
        time.sleep(0.001)


_STOPPED = frozenset({"T", "t", "Z", "X", ""})
"""``/proc`` states of a process that runs no more: stopped, traced, dead (``""``: gone)."""


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2]


def thaw_jail(cgroup: Cgroup | None, launcher: int | None) -> None:
    """Let every process of the jail run again."""
    if cgroup is not None:
        cgroup.thaw()
    for pid in _members(cgroup, launcher):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGCONT)


def kill_jail(cgroup: Cgroup | None, launcher: int | None) -> None:
    """``SIGKILL`` to every process of the jail: a frozen one dies where it stopped, once thawed,
    without running again (its files stay as they were when frozen)."""
    for pid in _members(cgroup, launcher):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _members(cgroup: Cgroup | None, launcher: int | None) -> list[int]:
    if cgroup is not None:
        return cgroup.pids()
    return [] if launcher is None else [launcher, *_descendants(launcher)]


def _descendants(root: int) -> list[int]:
    """Every process below ``root``, read from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            parent = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, pending = [], [root]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found
