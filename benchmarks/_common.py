"""Measurement helpers shared by the benchmarks (imported as a sibling: run them as scripts)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sandboxes import protocol as p
from sandboxes.base import BaseSandbox, Call


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


def scripted(sandbox: BaseSandbox, operation: Callable[[], object]) -> Callable[[], object]:
    """``operation`` with the exec helper's native file ops (reads, writes, searches, listings,
    deletes, transfers) off: the scripts' cost, timed in the same run as the native path."""

    def run() -> object:
        sandbox.native_file_ops = False
        try:
            return operation()
        finally:
            sandbox.native_file_ops = True

    return run


class CountingCalls(BaseSandbox):
    """Mixed in before a backend's sandbox class: counts its ``execute`` calls, and the file
    operations its exec helper does itself (a round trip without a process), so round trips
    per operation are measured, not assumed."""

    calls = 0

    def execute(self, command: str, **kwargs: Any) -> p.ExecuteResponse:
        self.calls += 1
        return super().execute(command, **kwargs)

    def _run_native(self, call: Call) -> p.ExecuteResponse | None:
        answer = super()._run_native(call)
        self.calls += answer is not None
        return answer


def machine() -> str:
    """One line naming this machine: CPU model, cores, load average (read when called), so
    figures from two machines, or one machine busy and quiet, can be told apart."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    try:
        load = "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        load = "load average unknown"
    return f"machine: {model}, {os.cpu_count()} cores, {load}, Python {platform.python_version()}"


def save_report(report: dict[str, Any], path: str | None) -> None:
    """The JSON report written to ``path`` as well (``--save``), when one is named."""
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
