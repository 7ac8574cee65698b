"""Smoke test of benchmarks/bench_docker.py: one tiny run prints a row for every measurement,
the JSON report agrees with the table, and nothing the run created is left behind. Functional
only; no timing is asserted, since timings depend on the machine."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from support import SESSION_OWNER, owner_leftovers

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_docker.py"
ROWS = {
    "execute": ["execute('true')"],
    "file ops": [
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
    ],
    "transfer": ["upload_files 64MiB", "download_files 64MiB"],
    "create": ["DockerSandbox.create", "create + first execute", "destroy"],
    "pool": ["acquire (warm pool)", "acquire + first execute"],
    "fallback": [
        f"{image}: {op}"
        for image in ("no python3", "busybox")
        for op in ("execute('true')", "ls", "read", "write", "edit", "delete", "grep", "glob")
    ],
}
SECTION_TITLES = ["1. execute", "2. file operations", "3. transfers", "4. cold create", "5. warm pool", "6. images"]


@pytest.fixture(scope="module")
def bench_run(docker_client: Any, runtime_image: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run: the printed table, the saved JSON report, and what Docker still holds of it."""
    owner = f"{SESSION_OWNER}-bench-{uuid.uuid4().hex[:6]}"
    saved = tmp_path_factory.mktemp("bench") / "report.json"
    argv = ["--iterations", "2", "--warmup", "0", "--heavy-iterations", "1", "--owner", owner, "--save", str(saved)]
    with owner_leftovers(docker_client, owner) as left:  # the session's sweep knows SESSION_OWNER alone
        result = subprocess.run(
            [sys.executable, str(BENCH), *argv], capture_output=True, text=True, timeout=300, check=False
        )
    assert result.returncode == 0, result.stderr
    return {"table": result.stdout, "report": json.loads(saved.read_text()), "left": left, "owner": owner}


def test_table_prints_every_row(bench_run: dict[str, Any]) -> None:
    lines = bench_run["table"].splitlines()
    for title in SECTION_TITLES:
        assert any(line.startswith(title) for line in lines), title
    headers = [i for i, line in enumerate(lines) if line.startswith("op ")]
    assert len(headers) == len(ROWS)
    for header in headers:
        assert "speedup" in lines[header]
        assert "trips ours/base" in lines[header]
    printed = {line.split("  ")[0] for line in lines if "  " in line}
    for section, ops in ROWS.items():
        for op in ops:
            assert op in printed, f"{section}: no row for {op!r}"


def test_report_measures_every_row(bench_run: dict[str, Any]) -> None:
    report = bench_run["report"]
    assert report["iterations"] == 2
    assert report["heavy_iterations"] == 1
    assert report["owner"] == bench_run["owner"]
    rows = report["rows"]
    assert [(r["section"], r["op"]) for r in rows] == [(s, op) for s, ops in ROWS.items() for op in ops]
    for row in rows:
        assert row["ours_p50"] > 0, row
        assert row["ours_p90"] >= row["ours_p50"] if row["unit"] == "ms" else row["ours_p90"] <= row["ours_p50"]
        assert row["base_p50"] > 0, row
        assert row["speedup"] > 0, row
        if row["target"]:
            assert isinstance(row["met"], bool), row
    by_op = {r["op"]: r for r in rows}
    assert by_op["execute('true')"]["ours_trips"] == 1  # execute() is one call by definition: the counter counts
    for op in ROWS["file ops"]:
        for trips in (by_op[op]["ours_trips"], by_op[op]["base_trips"]):
            assert trips >= 1, by_op[op]
            assert trips == int(trips), by_op[op]  # the same count on every call
    assert by_op["edit"]["ours_trips"] == 2  # read, then compare-and-swap
    assert by_op["edit (scripts)"]["ours_trips"] == 2
    for op in ROWS["fallback"]:  # one docker exec per call, two for an edit: none through a helper
        assert by_op[op]["ours_trips"] == (2 if op.endswith(": edit") else 1), by_op[op]
    assert {by_op[op]["unit"] for op in ROWS["transfer"]} == {"MiB/s"}


def test_run_leaves_nothing_behind(bench_run: dict[str, Any]) -> None:
    assert bench_run["left"] == []
