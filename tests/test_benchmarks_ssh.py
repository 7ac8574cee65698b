"""Smoke test of benchmarks/bench_ssh.py: one tiny run prints every row, its JSON report agrees
with the table, and the ssh-vm container it started is gone afterwards. Functional only; no
timing is asserted, since timings depend on the machine."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from support import SESSION_OWNER

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_ssh.py"
EXECUTE_ROWS = [
    "execute",
    "execute (timeout=0)",
    "execute (no helper)",
    "raw fresh channel",
    "raw persistent shell",
    "raw persistent channel",
    "host spawn",
]
FILE_ROWS = ["ls", "ls (scripts)", "read", "write", "edit", "delete", "delete (scripts)", "grep", "glob"]
TRANSFER_ROWS = ["upload_files 2MiB", "download_files 2MiB"]
TARGETS = ["the same command on a raw persistent shell", "a fresh exec_command"]


@pytest.fixture(scope="module")
def bench_run(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run: the printed table, the saved JSON report, and the containers left with its label."""
    run_label = f"io.sandboxes.bench-run={uuid.uuid4().hex[:8]}"
    saved = tmp_path_factory.mktemp("bench-ssh") / "report.json"
    argv = ["--iterations", "2", "--warmup", "0", "--transfer-iterations", "1", "--transfer-mib", "2",
            "--profile", "3", "--save", str(saved),
            "--label", f"io.sandboxes.test-session={SESSION_OWNER}", "--label", run_label]  # fmt: skip
    result = subprocess.run([sys.executable, str(BENCH), *argv], capture_output=True, text=True, timeout=300)
    left = docker_client.containers.list(all=True, filters={"label": run_label})
    assert result.returncode == 0, result.stderr
    return {"table": result.stdout, "report": json.loads(saved.read_text()), "left": left}


def _rows_of(table: str, title: str) -> list[str]:
    """The data rows of the section starting with ``title`` (after its header and rule)."""
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[start + 3 :]:
        if not line.strip() or line.startswith(("target", "context", "floor")):
            break
        rows.append(line)
    return rows


def test_every_execute_row_and_target_prints(bench_run: dict[str, Any]) -> None:
    rows = _rows_of(bench_run["table"], "1. execute")
    assert [row.split("  ")[0].strip() for row in rows] == EXECUTE_ROWS
    for target in TARGETS:
        assert any(line.startswith("target:") and target in line for line in bench_run["table"].splitlines())
    assert "(what a command cannot avoid)" in bench_run["table"]
    assert "persistent-channel 1-byte echo" in bench_run["table"]


def test_every_file_operation_and_transfer_row_prints(bench_run: dict[str, Any]) -> None:
    assert [row.split("  ")[0].strip() for row in _rows_of(bench_run["table"], "2. file operations")] == FILE_ROWS
    transfers = _rows_of(bench_run["table"], "3. transfers")
    assert [row.split("  ")[0] for row in transfers] == TRANSFER_ROWS
    assert all(row.rstrip().endswith(("MET", "MISSED")) for row in transfers)
    assert "4. cProfile of execute('true')" in bench_run["table"]


def test_json_report_agrees_with_the_table(bench_run: dict[str, Any]) -> None:
    report = bench_run["report"]
    assert report["iterations"] == 2
    assert [r["op"] for r in report["execute"]] == EXECUTE_ROWS
    assert [r["op"] for r in report["file_ops"]] == FILE_ROWS
    assert [r["op"] for r in report["transfers"]] == TRANSFER_ROWS
    for row, digits in [(r, 3) for r in report["execute"]] + [(r, 2) for r in report["file_ops"]]:
        assert 0 < row["p50_ms"] <= row["p90_ms"], row
        assert f"{row['p50_ms']:.{digits}f}" in bench_run["table"], row
    by_op = {r["op"]: r for r in report["file_ops"]}
    assert by_op["edit"]["round_trips"] == 2  # read, then compare-and-swap: proves the counter counts
    assert all(by_op[op]["round_trips"] == 1 for op in FILE_ROWS if op != "edit")
    execute = {r["op"]: r["p50_ms"] for r in report["execute"]}
    assert report["targets"]["execute_vs_shell"] == pytest.approx(execute["execute"] / execute["raw persistent shell"])
    assert report["targets"]["execute_vs_persistent"] == pytest.approx(
        execute["execute"] / execute["raw persistent channel"]
    )
    for row in report["transfers"]:
        assert row["ratio"] == pytest.approx(row["sandbox_mib_s"] / row["raw_mib_s"])


def test_the_container_is_removed(bench_run: dict[str, Any]) -> None:
    assert bench_run["left"] == []
