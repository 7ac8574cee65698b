"""How a container backend tells an OOM kill: its memory cgroup counts them, and a count above
the last one seen is a kill since that look."""

from __future__ import annotations

from sandboxes import _parse

__all__ = ["OOM_COUNT_SH", "OomCount"]

OOM_COUNT_SH = (
    "cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null"
    " | awk '$1==\"oom_kill\"{print $2; exit}'"
)
"""Prints the container's OOM-kill count (cgroup v2, else v1); nothing where neither tells."""


class OomCount:
    """The OOM-kill count last seen (`OOM_COUNT_SH`'s output); a kill is a count above it."""

    def __init__(self) -> None:
        self.seen: int | None = None

    def killed(self, text: str) -> bool:
        """Whether ``text``, a new look at the count, shows a kill since the last look."""
        count = _parse.natural(text)
        previous, self.seen = self.seen, count
        return count is not None and count > (previous or 0)

    def forget(self) -> None:
        """The next look is the first (nothing before it counts as a kill)."""
        self.seen = None
