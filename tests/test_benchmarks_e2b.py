"""Smoke test of benchmarks/bench_e2b.py: one tiny run per backend prints every row, its JSON
report agrees with itself and with the table, and nothing it made is left behind. Functional
only; no timing is asserted, since timings depend on the machine."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from support import HAS_BWRAP, SESSION_OWNER, owner_leftovers

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_e2b.py"
OPS = ["run true", "write 1 KiB", "read 1 KiB", "list a dir", "run true, as E2B runs it"]


def _bench(tmp_path: Path, *args: str) -> dict[str, Any]:
    saved = tmp_path / "report.json"
    argv = ["--iterations", "3", "--warmup", "1", "--save", str(saved), *args]
    result = subprocess.run([sys.executable, str(BENCH), *argv], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return {"table": result.stdout, "report": json.loads(saved.read_text())}


def _check_run(run: dict[str, Any], backend: str) -> None:
    table, report = run["table"], run["report"]
    assert (report["backend"], report["iterations"]) == (backend, 3)
    assert [row["op"] for row in report["rows"]] == OPS
    printed = {line.split("  ")[0] for line in table.splitlines()}
    for row in report["rows"]:
        assert row["op"] in printed, row
        assert 0 < row["e2b_p50"] <= row["e2b_p99"], row
        assert 0 < row["ours_p50"] <= row["ours_p99"], row
        assert row["ratio"] == pytest.approx(row["e2b_p50"] / row["ours_p50"]), row
        assert row["met"] == (row["ratio"] <= 1.5), row  # reported for the reference row, not printed
        assert f"{row['ratio']:.2f}x" in table
    assert table.startswith("machine: ")


@pytest.mark.needs(HAS_BWRAP, "the local backend needs bubblewrap")
def test_local_run_with_profile(tmp_path: Path) -> None:
    run = _bench(tmp_path, "--backend", "local", "--profile")
    _check_run(run, "local")
    assert "commands.run('true') in the SDK's process" in run["table"]
    assert "cumulative" in run["report"]["profile"]


def test_docker_run_leaves_nothing(docker_client: Any, runtime_image: str, tmp_path: Path) -> None:
    owner = f"{SESSION_OWNER}-bench-e2b-{uuid.uuid4().hex[:6]}"
    with owner_leftovers(docker_client, owner) as left:  # the session's sweep knows SESSION_OWNER alone
        run = _bench(tmp_path, "--backend", "docker", "--image", runtime_image, "--owner", owner)
    _check_run(run, "docker")
    assert run["report"]["leftovers_swept"] == 0  # both sandboxes were removed by the run itself
    assert left == []
    assert "profile" not in run["report"]
