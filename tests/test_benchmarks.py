"""Smoke test of benchmarks/bench_local.py: it runs and reports every operation. Functional only;
no timing is asserted, since timings depend on the machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_local.py"
OPS = [
    "execute",
    "ls",
    "ls (scripts)",
    "read",
    "write",
    "edit",
    "write (scripts)",
    "edit (scripts)",
    "delete",
    "delete (scripts)",
    "grep",
    "glob",
    "grep (scripts)",
    "glob (scripts)",
    "upload_files 1MiB",
    "download_files 1MiB",
    "download_files 16MiB",
    "execute (one jail per command)",
    "write (one jail per command)",
]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, str(BENCH), "--iterations", "2", *args], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result


def test_table_has_a_row_per_operation() -> None:
    lines = _run().stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("op "))
    assert "round trips" in lines[header]
    assert "ratio" in lines[header]
    rows = lines[header + 2 : header + 2 + len(OPS) + 1]
    found = {op for op in OPS for row in rows if row.startswith(op + "  ")}
    assert found == set(OPS)


def test_json_report_measures_round_trips() -> None:
    report = json.loads(_run("--json").stdout)
    assert report["iterations"] == 2
    rows = report["rows"]
    assert {r["op"] for r in rows} == set(OPS)
    by_op = {r["op"]: r for r in rows if "floor" not in r["baseline"]}
    # execute() is one call by definition: proves the counter counts.
    assert by_op["execute"]["round_trips"] == 1
    for op in ("write", "write (scripts)"):  # a write the helper does itself is counted too
        assert by_op[op]["round_trips"] == 1, by_op[op]
    for op in ("edit", "edit (scripts)"):
        assert by_op[op]["round_trips"] == 2, by_op[op]
    for op in ("ls", "ls (scripts)", "delete", "delete (scripts)"):  # a native listing or delete too
        assert by_op[op]["round_trips"] == 1, by_op[op]
    for op in ("grep", "grep (scripts)", "glob", "glob (scripts)"):  # a native search counted too
        assert by_op[op]["round_trips"] == 1, by_op[op]
    for row in rows:
        assert row["sandbox_p50_ms"] > 0
        assert row["direct_p50_ms"] > 0
        assert row["sandbox_p90_ms"] >= row["sandbox_p50_ms"]
        assert row["round_trips"] == int(row["round_trips"]), row  # same count on every call
    if report["isolated"]:
        floor = [r for r in rows if "floor" in r["baseline"]]
        assert len(floor) == 1
        assert all(r["floor_ms"] == r["round_trips"] * floor[0]["direct_p50_ms"] for r in rows)
