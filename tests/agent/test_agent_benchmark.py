"""Smoke test of benchmarks/bench_agent.py: it runs and reports a row per backend and store.
Functional only; no timing is asserted, since timings depend on the machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_agent.py"


def test_reports_a_row_per_backend_and_persistence() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--rounds",
            "1",
            "--cycles",
            "1",
            "--backends",
            "local",
            "--persistence",
            "none,sqlite",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [(r["backend"], r["persistence"]) for r in rows] == [("local", "none"), ("local", "sqlite")]
    for row in rows:
        assert row["steps"] == 8
        assert row["agent_ms_per_step"] > 0
        assert row["direct_ms_per_step"] > 0
        assert row["bare_ms_per_step"] > 0
        assert row["agent_cpu_ms_per_step"] > 0
        assert row["bare_cpu_ms_per_step"] > 0
        assert row["cpu_ratio"] > 0


def test_the_table_states_the_target_as_a_ratio_to_the_bare_agent() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--rounds", "1", "--cycles", "1", "--backends", "local", "--persistence", "none"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "target: ours <= 1.75x bare" in done.stdout
    assert "load average" in done.stdout
    last = done.stdout.strip().splitlines()[-1].split()
    assert last[:2] == ["local", "none"]
    assert last[-1] in ("yes", "NO")
