"""The usage samples' parts without a service: the helper's ``metrics`` op (run here, on this
machine's kernel), the service's reading of its answer (hostile bytes refused field by field),
CPU percent from deltas, the bounded ring, and the Prometheus series."""

from __future__ import annotations

import asyncio
import json
import threading
import tracemalloc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sandboxes import protocol as p
from sandboxes._helper import _usage
from sandboxes.server.usage import Reading, Sampler, UsageCollector, _Ring, read_usage

GOOD = {
    "source": "cgroup",
    "cpu_usec": 10,
    "cpu_limit_millicores": 500,
    "cpus": 2,
    "mem_used": 1,
    "mem_limit": None,
    "disk_used": 0,
    "disk_total": 5,
}


@pytest.mark.parametrize("mode", ["cgroup", "processes"])
def test_the_helper_answers_what_the_kernel_says(tmp_path: Path, mode: str) -> None:
    code, answer = _usage.usage(["metrics", str(tmp_path), mode])
    reading = Reading.model_validate_json(answer)
    assert code == 0
    assert reading.source in (("cgroup", "processes") if mode == "cgroup" else ("processes",))
    assert reading.cpu_usec is not None
    assert reading.cpu_usec > 0
    assert reading.mem_used is not None
    assert reading.mem_used > 0
    assert reading.disk_total is not None
    assert reading.disk_used is not None
    assert reading.disk_used <= reading.disk_total


def test_the_helper_refuses_a_malformed_op() -> None:
    for op in (["metrics"], ["metrics", "relative", "cgroup"], ["metrics", "/", "guess"], ["metrics", "/\0", "cgroup"]):
        with pytest.raises(ValueError):
            _usage.usage(op)


def test_the_helper_reads_numbers_defensively() -> None:
    assert _usage._number(" 42\n") == 42
    for hostile in ("max", "-1", "", "1" * 21, "4.5", "١٢", None, "\ufffd"):
        assert _usage._number(hostile) is None
    assert _usage._field("usage_usec 7\nuser_usec x\n", "usage_usec") == 7
    assert _usage._field("usage_usec\n", "usage_usec") is None


class _FakeHelper:
    """A helper whose ``metrics`` answer is given: what a hostile sandbox could send."""

    def __init__(self, output: str, exit_code: int = 0, truncated: bool = False) -> None:
        self.answer = p.ExecuteResponse(output=output, exit_code=exit_code, truncated=truncated)

    def run_native(self, op: list[str], stdin: None, *, timeout: float, output_limit: int) -> p.ExecuteResponse:
        assert op[0] == "metrics"
        assert output_limit <= 4096
        return self.answer


@pytest.mark.parametrize(
    "hostile",
    [
        "not json",
        json.dumps({**GOOD, "cpu_usec": -1}),
        json.dumps({**GOOD, "cpu_usec": True}),
        json.dumps({**GOOD, "mem_used": 1.5}),
        json.dumps({**GOOD, "mem_used": "12"}),
        json.dumps({**GOOD, "disk_total": 1 << 70}),
        json.dumps({**GOOD, "source": "trust me"}),
        json.dumps({k: v for k, v in GOOD.items() if k != "cpus"}),
        "[" * 10000,
    ],
)
def test_a_hostile_answer_is_no_reading(hostile: str) -> None:
    assert read_usage(_FakeHelper(hostile), "/w", "cgroup") is None  # type: ignore[arg-type]


def test_a_good_answer_is_read_and_a_failed_one_is_not() -> None:
    assert read_usage(_FakeHelper(json.dumps(GOOD)), "/w", "cgroup") == Reading(**GOOD)  # type: ignore[arg-type]
    assert read_usage(_FakeHelper(json.dumps(GOOD), exit_code=1), "/w", "cgroup") is None  # type: ignore[arg-type]
    assert read_usage(_FakeHelper(json.dumps(GOOD), truncated=True), "/w", "cgroup") is None  # type: ignore[arg-type]


def _reading(cpu_usec: int | None, source: Any = "cgroup") -> Reading:
    return Reading(**{**GOOD, "cpu_usec": cpu_usec, "source": source})


def test_cpu_percent_comes_from_deltas_and_never_from_a_guess() -> None:
    ring = _Ring(10)
    ring.add(_reading(1_000_000), 100.0, 10.0)
    ring.add(_reading(1_500_000), 101.0, 11.0)  # half a CPU for a second
    ring.add(_reading(200_000), 102.0, 12.0)  # went back (a process ended unwaited): unknown
    ring.add(_reading(400_000, "processes"), 103.0, 13.0)  # another source: unknown
    ring.add(_reading(None), 104.0, 14.0)
    ring.add(_reading(2_400_000, "processes"), 105.0, 15.0)  # 2 s of CPU over the 2 s since the last one known
    assert [point.cpu_percent for point in ring.points] == [None, 50.0, None, None, None, 100.0]
    assert ring.points[0].cpu_limit == 0.5


def test_a_ring_is_bounded_and_small() -> None:
    """A sandbox's ring keeps the newest ``history`` samples, at a few hundred bytes each."""
    history = 720
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        ring = _Ring(history)
        for tick in range(history * 3):
            ring.add(Reading(**{**GOOD, "cpu_usec": tick * 10**6, "mem_used": tick << 20}), float(tick), float(tick))
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert len(ring.points) == history
    assert ring.points[0].timestamp == history * 2
    assert grown < 400 * history, f"{grown} bytes for {history} samples"


def _entry(sandbox_id: str, tenant: str) -> Any:
    backend = SimpleNamespace(template=SimpleNamespace(backend="docker"))
    return SimpleNamespace(state=SimpleNamespace(id=sandbox_id, tenant=tenant), backend=backend)


@pytest.mark.parametrize("per_sandbox", [False, True])
def test_prometheus_has_a_series_per_sandbox_only_when_asked(per_sandbox: bool) -> None:
    entries = {"a": _entry("a", "alice"), "b": _entry("b", "bob")}
    sampler = Sampler(lambda: entries, 1.0, 10)
    for sandbox_id in entries:
        ring = sampler._rings[sandbox_id] = _Ring(10)
        ring.add(Reading(**{**GOOD, "mem_used": 100}), 1.0, 1.0)
    registry = CollectorRegistry()
    registry.register(UsageCollector(sampler, per_sandbox))
    text = generate_latest(registry).decode()
    assert 'sandboxes_usage_memory_bytes{backend="docker"} 200.0' in text
    assert ('sandboxes_sandbox_memory_bytes{sandbox="a",tenant="alice"} 100.0' in text) is per_sandbox
    assert ("sandboxes_sandbox_" in text) is per_sandbox


class _SlowHelper:
    """A running helper whose ``metrics`` answers only once released, counting the asks."""

    def __init__(self) -> None:
        self.asked = 0
        self.started = threading.Event()
        self.release = threading.Event()

    def run_native(self, op: list[str], stdin: None, *, timeout: float, output_limit: int) -> p.ExecuteResponse:
        self.asked += 1
        self.started.set()
        assert self.release.wait(10)
        return p.ExecuteResponse(output=json.dumps(GOOD), exit_code=0, truncated=False)


def test_a_sandbox_whose_sample_still_runs_is_skipped_and_a_gone_one_forgotten() -> None:
    helper = _SlowHelper()
    entry = _entry("a", "alice")
    entry.sandbox = SimpleNamespace(running_helper=lambda: helper)
    entry.state.workdir = "/w"
    entry.backend.template.backend = "docker"
    entries = {"a": entry}

    async def rounds() -> Sampler:
        sampler = Sampler(lambda: entries, 1.0, 10)
        sampler.tick()
        assert await asyncio.to_thread(helper.started.wait, 10)
        sampler.tick()  # the first sample still runs: no second one
        sampler.tick()
        helper.release.set()
        await asyncio.gather(*sampler._tasks)
        assert len(sampler.samples("a").samples) == 1
        entries.clear()  # the sandbox is gone: its ring goes at the next round
        sampler.tick()
        return sampler

    sampler = asyncio.run(rounds())
    assert helper.asked == 1
    assert sampler.samples("a").samples == []
