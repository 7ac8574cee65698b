"""Smoke test of benchmarks/bench_kubernetes.py against the fake API server: one tiny run
prints every row beside its baselines (file operations with their measured round trips and the
issue #14 target), and leaves no container behind. Functional only; no timing is asserted."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from support import SESSION_OWNER

BENCH = Path(__file__).resolve().parent.parent.parent / "benchmarks" / "bench_kubernetes.py"
FILE_OPS = {
    "ls": 1,
    "ls (scripts)": 1,
    "read": 1,
    "write": 1,
    "edit": 2,
    "delete": 1,
    "delete (scripts)": 1,
    "grep": 1,
    "glob": 1,
}
"""Each file operation's row, with its execute round trips per call (a ``(scripts)`` row: the
same call through `BaseSandbox`'s scripts; the benchmark fails if the native op answers it)."""


def _row(lines: list[str], name: str) -> str:
    """The one row named ``name`` exactly (``ls`` is not ``ls (scripts)``)."""
    (line,) = [line for line in lines if line.partition(" ours p50 ")[0].rstrip() == name]
    return line


def test_bench_kubernetes_runs_every_row(docker_client: Any, runtime_image: str) -> None:
    owner = f"{SESSION_OWNER}-bench-{uuid.uuid4().hex[:6]}"
    environment = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
    result = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            *("--iterations", "2", "--cold-iterations", "1", "--transfer-iterations", "1", "--transfer-mib", "2"),
            *("--owner", owner),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=BENCH.parent,
        env=environment,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("machine: ")  # every benchmark says which machine it measured first
    assert "fake API server" in lines[1]
    for row, baselines in [
        ("execute true", ["raw persistent", "raw fresh exec"]),
        ("upload_files 2MiB", ["raw fresh exec head -c"]),
        ("download_files 2MiB", ["raw fresh exec cat"]),
        ("cold start (to Ready)", ["raw create->Running"]),
        ("warm acquisition", []),
    ]:
        line = _row(lines, row)
        assert "ours p50" in line
        assert "| target " in line
        for baseline in baselines:
            assert f"| {baseline} p50" in line
    for op, trips in FILE_OPS.items():
        line = _row(lines, op)
        assert "| raw persistent p50" in line
        assert "| raw fresh exec p50" in line
        assert f"| round trips {trips} |" in line  # measured: counts the helper's native reads and writes too
        assert f"| target p50 <= {3 if op == 'grep' else 2}x execute: " in line
    assert docker_client.containers.list(all=True, filters={"label": f"io.sandboxes.owner={owner}"}) == []
