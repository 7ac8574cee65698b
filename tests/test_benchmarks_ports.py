"""Smoke test of benchmarks/bench_ports.py: a tiny run prints the machine first and a row per
measure (relay beside direct loopback), its JSON report agrees, and the sandboxes it made are
gone. Functional only; no timing is asserted, since timings depend on the machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import HAS_BWRAP

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_ports.py"
MEASURES = [
    "download 1 MiB",
    "upload 1 MiB",
    "1 KiB round trip, kept alive",
    "new connection + 1 KiB",
    "2 sandboxes at once, 1 MiB each",
]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(BENCH), "--size-mib", "1", "--iterations", "1", "--sandboxes", "2", *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.needs(HAS_BWRAP, "the local backend needs bubblewrap")
def test_a_tiny_run_reports_every_measure_beside_direct_loopback() -> None:
    lines = _run().stdout.splitlines()
    assert lines[0].startswith("machine: "), lines[0]
    assert "cores, load average" in lines[0], lines[0]
    for measure in MEASURES:
        assert any(line.startswith(measure + "  ") for line in lines), (measure, lines)
    report = json.loads(_run("--json").stdout)
    assert [row["measure"] for row in report["rows"]] == MEASURES
    for row in report["rows"]:
        assert row["relay"] > 0, row
        assert row["direct"] > 0, row
    assert report["sandboxes"] == 2
