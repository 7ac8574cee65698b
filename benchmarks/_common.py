"""Measurement helpers shared by the benchmarks (imported as a sibling: run them as scripts)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from sandboxes import protocol as p


def percentile(samples: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0..1) of ``samples``."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def timed(fn: Callable[[], object]) -> float:
    """Milliseconds ``fn`` took."""
    started = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - started) / 1e6


def ok(result: object) -> object:
    """Fail loudly rather than time an operation that errored."""
    items = result if isinstance(result, list) else [result]
    for item in items:
        if getattr(item, "error", None) is not None:
            raise RuntimeError(f"benchmark operation failed: {item}")
        if isinstance(item, p.ExecuteResponse) and item.exit_code != 0:
            raise RuntimeError(f"benchmark command failed: {item}")
    return result
