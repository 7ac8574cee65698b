"""When a transport may try to start its exec helper again, after a start failed.

Why one module: every transport follows one rule, so that a passing failure (the pids limit
full for a moment, a hello later than its timeout under load) neither costs a sandbox its helper
for its life nor makes every command wait out a hanging start (the hello's 20 s): only a
sandbox whose shell says its python is missing gives up for good; any other failure waits
`RETRY_AFTER`, doubled at each failure in a row up to `MAX_RETRY_AFTER` (a failure that always
repeats, a python too old for the helper say, is neither retried nor logged every 30 s for the
sandbox's life), and commands meanwhile run the transport's own slow way.
"""

from __future__ import annotations

import logging
import shlex
import time

__all__ = ["HAS_PYTHON_SH", "MAX_RETRY_AFTER", "RETRY_AFTER", "HelperStarts", "has_python_sh", "python_missing"]

RETRY_AFTER = 30.0
"""Seconds after a failed start of an exec helper (its python is there) before another is tried."""
MAX_RETRY_AFTER = 600.0
"""The longest wait, however many starts failed in a row."""


def has_python_sh(python: str = "python3") -> str:
    """What a transport asks its sandbox's shell after a failed start: it prints ``no`` only
    when ``python`` is not there."""
    return f"command -v -- {shlex.quote(python)} >/dev/null 2>&1 && echo yes || echo no"


HAS_PYTHON_SH = has_python_sh()


def python_missing(answer: str) -> bool:
    """Whether the shell's answer to `has_python_sh` says the python is missing: only its own
    ``no``. Anything else cannot tell: an exec that could not start (a full pids limit makes the
    runtime answer status 126), a shell that is not there, a timeout."""
    return answer.strip() == "no"


class HelperStarts:
    """Whether a start of the helper may be tried now. Not thread-safe: the transport asks under
    the lock that serializes its helper's starts."""

    def __init__(self, enabled: bool = True, retry_after: float = RETRY_AFTER) -> None:
        self.unavailable = not enabled
        """No helper for this sandbox's life: turned off, or its python is missing."""
        self.retry_after = retry_after
        self.failures = 0
        """Starts failed in a row."""
        self.wait = 0.0
        """Seconds the last failure waits before the next try."""
        self._retry_at = 0.0  # monotonic

    @property
    def due(self) -> bool:
        """Whether a start may be tried now."""
        return not self.unavailable and time.monotonic() >= self._retry_at

    @property
    def log_level(self) -> int:
        """How loud to report the last failure: a warning once, then quietly while it repeats."""
        return logging.WARNING if self.failures <= 1 else logging.DEBUG

    def failed(self, *, for_good: bool) -> None:
        """A start failed: for good (no python there), or wait before the next."""
        self.failures += 1
        if for_good:
            self.unavailable = True
            return
        self.wait = min(self.retry_after * 2 ** (self.failures - 1), MAX_RETRY_AFTER)
        self._retry_at = time.monotonic() + self.wait

    def report(self, log: logging.Logger, subject: str, error: object, fallback: str) -> None:
        """Log the start that just failed (`failed` first): what it cost, a warning when it is
        for good or the first in a row, DEBUG while it repeats."""
        if self.unavailable:
            log.warning("no python3 in %s (%s): %s", subject, error, fallback)
        else:
            log.log(
                self.log_level, "exec helper of %s did not start (%s); %s for %g s", subject, error, fallback, self.wait
            )

    def started(self) -> None:
        """A start succeeded: the next failure is the first again."""
        self.failures = 0

    def expire(self) -> None:
        """Let the next start be tried at once (as if its wait had passed)."""
        self._retry_at = 0.0
