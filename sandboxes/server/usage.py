"""What each running sandbox uses, sampled: one task reads every held sandbox's usage through
its running exec helper (the ``metrics`` op, `sandboxes._helper._usage`) every
``sample_interval`` seconds, a few at a time, and keeps a bounded ring of samples per sandbox
for as long as the registry holds it; CPU percent is the CPU time's delta over the wall
clock's. Prometheus reads the latest samples at scrape time (`UsageCollector`).

Never started to sample: a sandbox whose helper is not running (none started yet, or its
backend has none) keeps the samples it had. A sandbox whose previous sample is still running
is skipped. What the helper answers is the sandbox's, hence hostile: bounded (`_ANSWER_LIMIT`)
and validated field by field (`Reading`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Literal, NamedTuple, Protocol, runtime_checkable

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandboxes import api
from sandboxes._mux import MuxBroken, MuxClient
from sandboxes.server.entry import Entry

__all__ = ["Reading", "Sampler", "UsageCollector", "read_usage"]

logger = logging.getLogger(__name__)

_ANSWER_LIMIT = 4096
_TIMEOUT = 10.0
_CONCURRENCY = 4
_Count = int | None


@runtime_checkable
class _ShowsHelper(Protocol):
    def running_helper(self) -> MuxClient | None: ...


class Reading(BaseModel):
    """The ``metrics`` op's answer: every count a non-negative integer or ``None``."""

    model_config = ConfigDict(extra="ignore", strict=True)

    source: Literal["cgroup", "processes", "none"]
    cpu_usec: _Count = Field(ge=0, lt=1 << 63)
    cpu_limit_millicores: _Count = Field(ge=0, lt=1 << 40)
    cpus: _Count = Field(ge=0, lt=1 << 20)
    mem_used: _Count = Field(ge=0, lt=1 << 63)
    mem_limit: _Count = Field(ge=0, lt=1 << 63)
    disk_used: _Count = Field(ge=0, lt=1 << 63)
    disk_total: _Count = Field(ge=0, lt=1 << 63)


def read_usage(mux: MuxClient, workdir: str, mode: str) -> Reading | None:
    """The sandbox's usage now, through its exec helper; ``None`` if it does not answer one
    (an older helper, a failure, an answer that is not a `Reading`)."""
    try:
        answer = mux.run_native(["metrics", workdir, mode], None, timeout=_TIMEOUT, output_limit=_ANSWER_LIMIT)
    except MuxBroken:
        return None
    if answer is None or answer.exit_code != 0 or answer.truncated:
        return None
    try:
        return Reading.model_validate_json(answer.output)
    except ValidationError:
        return None


class _Point(NamedTuple):
    """One sample, compact: a ring holds `sample_history` of them per sandbox."""

    timestamp: float
    source: Literal["cgroup", "processes", "none"]
    cpu_percent: float | None
    cpu_limit: float | None
    cpus: _Count
    memory_used: _Count
    memory_limit: _Count
    disk_used: _Count
    disk_total: _Count

    def sample(self) -> api.MetricsSample:
        return api.MetricsSample(**self._asdict())


class _Ring:
    """The samples of one sandbox, and the CPU time of the last one (for the next delta)."""

    __slots__ = ("cpu", "points")

    def __init__(self, size: int) -> None:
        self.points: deque[_Point] = deque(maxlen=size)
        self.cpu: tuple[float, int, str] | None = None
        """(monotonic seconds, CPU microseconds, source) of the last reading with a CPU time."""

    def add(self, reading: Reading, now: float, monotonic: float) -> None:
        percent = None
        if reading.cpu_usec is not None:
            last = self.cpu
            if last is not None and last[2] == reading.source and monotonic > last[0] and reading.cpu_usec >= last[1]:
                percent = round((reading.cpu_usec - last[1]) / ((monotonic - last[0]) * 1e6) * 100, 2)
            self.cpu = (monotonic, reading.cpu_usec, reading.source)
        limit = None if reading.cpu_limit_millicores is None else reading.cpu_limit_millicores / 1000
        self.points.append(
            _Point(
                now,
                reading.source,
                percent,
                limit,
                reading.cpus,
                reading.mem_used,
                reading.mem_limit,
                reading.disk_used,
                reading.disk_total,
            )
        )


class Sampler:
    """The rings of the sandboxes ``entries()`` holds (the registry's, by id), filled by `run`."""

    def __init__(self, entries: Callable[[], Mapping[str, Entry]], interval: float, history: int) -> None:
        self.entries = entries
        self.interval = interval
        self.history = history
        self._rings: dict[str, _Ring] = {}
        self._busy: set[str] = set()
        self._slots = asyncio.Semaphore(_CONCURRENCY)
        self._tasks: set[asyncio.Task[None]] = set()
        self.ticks = 0
        """Rounds started (`tick`), for a test to wait on."""

    def samples(self, sandbox_id: str) -> api.SandboxMetrics:
        """What is kept of ``sandbox_id`` (no samples if none was taken)."""
        ring = self._rings.get(sandbox_id)
        samples = [point.sample() for point in ring.points] if ring is not None else []
        return api.SandboxMetrics(
            sandbox_id=sandbox_id, interval=self.interval, latest=samples[-1] if samples else None, samples=samples
        )

    def latest(self) -> Iterator[tuple[Entry, api.MetricsSample]]:
        """The latest sample of each held sandbox that has one."""
        for entry in list(self.entries().values()):
            ring = self._rings.get(entry.state.id)
            if ring is not None and ring.points:
                yield entry, ring.points[-1].sample()

    async def run(self) -> None:
        """Sample every ``interval`` seconds until cancelled."""
        if self.interval <= 0:
            return
        try:
            while True:
                self.tick()
                await asyncio.sleep(self.interval)
        finally:
            for task in list(self._tasks):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    def tick(self) -> None:
        """Start a sample of every held sandbox not being sampled, and forget the rings of those
        no longer held."""
        self.ticks += 1
        held = dict(self.entries())
        for gone in self._rings.keys() - held.keys():
            del self._rings[gone]
        for sandbox_id, entry in held.items():
            if sandbox_id in self._busy:
                continue
            self._busy.add(sandbox_id)
            task = asyncio.ensure_future(self._sample(entry))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _sample(self, entry: Entry) -> None:
        try:
            async with self._slots:
                reading = await asyncio.to_thread(_reading_of, entry)
        except Exception:
            logger.warning("sampling sandbox %s failed", entry.state.id, exc_info=True)
            reading = None
        finally:
            self._busy.discard(entry.state.id)
        if reading is None or self.entries().get(entry.state.id) is not entry:
            return
        ring = self._rings.get(entry.state.id)
        if ring is None:
            ring = self._rings[entry.state.id] = _Ring(self.history)
        ring.add(reading, time.time(), time.monotonic())


def _reading_of(entry: Entry) -> Reading | None:
    """The sandbox's usage through its running helper; ``None`` where none runs."""
    sandbox = entry.sandbox
    mux = sandbox.running_helper() if isinstance(sandbox, _ShowsHelper) else None
    workdir = entry.state.workdir
    if mux is None or not workdir:
        return None
    mode = "processes" if entry.backend.template.backend == "ssh" else "cgroup"
    return read_usage(mux, workdir, mode)


class UsageCollector(Collector):
    """Gauges of the latest samples at scrape time: summed per backend, and per sandbox
    (labels ``sandbox``, ``tenant``) only where ``per_sandbox``."""

    def __init__(self, sampler: Sampler, per_sandbox: bool) -> None:
        self.sampler = sampler
        self.per_sandbox = per_sandbox

    def collect(self) -> Iterator[GaugeMetricFamily]:
        latest = list(self.sampler.latest())
        for name, help_text, field in _GAUGES:
            total = GaugeMetricFamily(f"sandboxes_usage_{name}", f"{help_text}, summed by backend", labels=["backend"])
            sums: dict[str, float] = {}
            for entry, sample in latest:
                value = getattr(sample, field)
                if value is not None:
                    sums[entry.backend.template.backend] = sums.get(entry.backend.template.backend, 0) + value
            for backend, value in sorted(sums.items()):
                total.add_metric([backend], value)
            yield total
            if self.per_sandbox:
                each = GaugeMetricFamily(
                    f"sandboxes_sandbox_{name}", f"{help_text}, per sandbox", labels=["sandbox", "tenant"]
                )
                for entry, sample in latest:
                    value = getattr(sample, field)
                    if value is not None:
                        each.add_metric([entry.state.id, entry.state.tenant], value)
                yield each


_GAUGES = [
    ("cpu_percent", "CPU used at the last sample, percent of one CPU", "cpu_percent"),
    ("memory_bytes", "Memory used at the last sample", "memory_used"),
    ("memory_limit_bytes", "Memory limit", "memory_limit"),
    ("disk_bytes", "Disk used at the last sample", "disk_used"),
]
