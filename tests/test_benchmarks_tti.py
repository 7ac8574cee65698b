"""Smoke tests of benchmarks/bench_tti.py and benchmarks/bench_density.py: tiny runs print the
machine first and every row, their JSON reports agree with the tables, and nothing they made is
left behind. Functional only; no timing is asserted, since timings depend on the machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import HAS_BWRAP

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _bench(name: str, tmp_path: Path, *args: str) -> tuple[list[str], dict[str, Any]]:
    saved = tmp_path / "report.json"
    argv = [sys.executable, str(BENCHMARKS / name), "--save", str(saved), *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("machine: "), lines[0]
    assert "cores, load average" in lines[0], lines[0]
    report = json.loads(saved.read_text())
    said = [line for line in result.stderr.splitlines() if line.startswith(("left behind", "service log"))]
    assert report.get("leftovers_swept", 0) == 0, said
    return lines, report


@pytest.mark.needs(HAS_BWRAP, "the local backend needs bubblewrap")
def test_tti_local_rows_through_the_service_and_the_library(tmp_path: Path) -> None:
    lines, report = _bench("bench_tti.py", tmp_path, "--backends", "local", "--n", "2", "--no-crowds")
    ops = [row["op"] for row in report["rows"]]
    assert ops == ["service local: create + execute (cold)", "library local: LocalSandbox + execute",
                   "raw local: bwrap --unshare-all true"]  # fmt: skip
    for row in report["rows"]:
        assert row["n"] == 2, row
        assert 0 < row["p50"] <= row["p99"], row
        assert any(line.startswith(row["op"] + "  ") for line in lines), row["op"]
    assert report["machine"] == lines[0]


def test_tti_crowds_count_what_past_capacity_gets(tmp_path: Path, docker_client: Any) -> None:
    args = ["--backends", "docker", "--service-only", "--n", "1", "--burst", "2", "--extra", "1", "--stagger", "50",
            "--cli-n", "1", "--pool-burst", "2"]  # fmt: skip
    _, report = _bench("bench_tti.py", tmp_path, *args)
    by_op = {row["op"]: row for row in report["rows"]}
    cold_burst = by_op["service docker: burst of 2 (cold)"]
    assert cold_burst["ok"] == 2, (cold_burst["failures"], cold_burst)
    staggered = by_op["service docker: 2 staggered, one per 50 ms"]
    assert staggered["ok"] == 2, (staggered["failures"], staggered)
    past = by_op["service docker: 1 more past capacity"]
    assert past["ok"] == 0, past
    assert past["failures"] == {"HTTP 429": 1, "of which with Retry-After": 1}, past
    assert by_op["sandboxes exec true (new process)"]["n"] == 1
    warm = by_op["service docker: create from warm pool + execute (warm)"]
    assert (warm["n"], warm["target"]) == (1, "p50 <= 10 ms, p99 <= 50 ms"), warm
    pooled = by_op["service docker: burst of 2 creates from a warm pool of 2 + first command"]
    assert (pooled["n"], pooled["ok"], pooled["failures"]) == (2, 2, {}), pooled
    assert pooled["target"] == "100% ok, p99 <= 500 ms", pooled
    refill = by_op["service docker: create + execute (cold) while the pool of 2 refills"]
    assert "the pool back to 2 in " in refill["note"], refill
    assert report["leftovers_swept"] == 0


def test_density_reports_memory_per_sandbox_and_execute_ratio(tmp_path: Path, docker_client: Any) -> None:
    lines, report = _bench("bench_density.py", tmp_path, "--count", "2", "--rounds", "1", "--settle", "0")
    assert report["sandboxes"] == 2
    assert report["sandbox_mib"]["charged"]["median"] > 0
    assert 0 < report["helper_mib"]["pss"]["median"] <= report["helper_mib"]["rss"]["median"]
    assert report["execute_ms"]["across 2 idle"]["n"] == 2
    assert report["leftovers_swept"] == 0
    assert any(line.startswith("ratio of p50s: ") for line in lines)
