"""Freezing a local sandbox's jail: every process in it stopped where it is, then let go.

The jail's cgroup freezer holds it where the sandbox has one (`Cgroup.freeze`); without one
(no writable cgroups, or v1 without a freezer hierarchy), every process of the jail gets
``SIGSTOP``, and ``SIGCONT`` back: the processes of its cgroup, or else the jail's launch
process and all its descendants (a jail is a pid namespace, so an orphan in it is reparented
to the jail's init, still a descendant).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from sandboxes.local._limits import Cgroup

__all__ = ["freeze_jail", "thaw_jail"]

_PASSES = 20
"""Rounds of stopping what is found: a process may fork while the tree is read."""


def freeze_jail(cgroup: Cgroup | None, launcher: int | None) -> None:
    """Stop every process of the jail (its cgroup's, else ``launcher``'s tree)."""
    if cgroup is not None and cgroup.freeze():
        return
    stopped: set[int] = set()
    for _ in range(_PASSES):
        found = set(_members(cgroup, launcher)) - stopped
        if not found:
            return
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= found


def thaw_jail(cgroup: Cgroup | None, launcher: int | None) -> None:
    """Let every process of the jail run again."""
    if cgroup is not None:
        cgroup.thaw()
    for pid in _members(cgroup, launcher):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGCONT)


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
