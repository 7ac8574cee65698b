"""When a transport may try to start its exec helper again, after a start failed.

Why one module: Docker gave up on a sandbox's helper for good after any failed start, the local
jail too, and Kubernetes retried at every command. A passing failure (the pids limit full for a
moment, a hello later than its timeout under load) then cost a sandbox its helper for its life
(every command a fresh ``docker exec`` or jail: 35 ms or 13 ms instead of ~1), or made every
command wait out a hanging start (the hello's 20 s). The rule is the same everywhere: only a
sandbox without the helper's python gives up for good; any other failure waits `RETRY_AFTER`
before the next try, and commands meanwhile run the transport's own slow way.
"""

from __future__ import annotations

import time

__all__ = ["HAS_PYTHON_SH", "RETRY_AFTER", "HelperStarts"]

RETRY_AFTER = 30.0
"""Seconds after a failed start of an exec helper (its python is there) before another is tried."""

HAS_PYTHON_SH = "command -v python3 >/dev/null 2>&1"
"""Asked of a sandbox's shell after a failed start: exit 0 if python3 is there (try again later)."""


class HelperStarts:
    """Whether a start of the helper may be tried now. Not thread-safe: the transport asks under
    the lock that serializes its helper's starts."""

    def __init__(self, enabled: bool = True, retry_after: float = RETRY_AFTER) -> None:
        self.unavailable = not enabled
        """No helper for this sandbox's life: turned off, or its python is missing."""
        self.retry_after = retry_after
        self._retry_at = 0.0  # monotonic

    @property
    def due(self) -> bool:
        """Whether a start may be tried now."""
        return not self.unavailable and time.monotonic() >= self._retry_at

    def failed(self, *, for_good: bool) -> None:
        """A start failed: for good (no python there), or wait `retry_after` before the next."""
        if for_good:
            self.unavailable = True
        else:
            self._retry_at = time.monotonic() + self.retry_after

    def expire(self) -> None:
        """Let the next start be tried at once (as if `retry_after` had passed)."""
        self._retry_at = 0.0
