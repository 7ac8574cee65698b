"""Smoke test of benchmarks/bench_state.py: one tiny run prints the machine line and a row for
every measurement, with a baseline where it has one, and leaves no container or volume behind.
Functional only; no timing is asserted, since timings depend on the machine."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from support import HAS_BWRAP, SESSION_OWNER, needs, owner_leftovers

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_state.py"


def test_one_tiny_run_reports_every_row(docker_client: Any, runtime_image: str) -> None:
    needs(HAS_BWRAP, "bubblewrap is not installed")
    owner = f"{SESSION_OWNER}-bench-state-{uuid.uuid4().hex[:6]}"
    argv = ["--iterations", "2", "--mib", "1", "--forks", "2", "--owner", owner, "--json"]
    with owner_leftovers(docker_client, owner) as left:
        done = subprocess.run([sys.executable, str(BENCH), *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["machine"].startswith("machine: ")
    rows = {row["name"]: row for row in report["rows"]}
    hibernate, restore = "docker hibernate + resume 1 MiB", "docker restore 1 MiB"
    names = ["docker freeze + resume", "local freeze + resume", "snapshot + restore 1 MiB", "fork of 2"]
    assert list(rows) == [*names, hibernate, restore]
    for name in ("docker freeze + resume", "snapshot + restore 1 MiB", "fork of 2", hibernate, restore):
        assert rows[name]["baseline_p50_ms"] > 0
        assert rows[name]["ratio"] == rows[name]["p50_ms"] / rows[name]["baseline_p50_ms"]
    assert rows[hibernate]["p50_ms"] == rows[hibernate]["hibernate_ms"] + rows[hibernate]["resume_ms"]
    assert rows["local freeze + resume"]["n"] == 2
    assert left == []
