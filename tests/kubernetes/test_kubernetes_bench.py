"""Smoke test of benchmarks/bench_kubernetes.py against the fake API server: one tiny run
prints every row beside its baselines and leaves no container behind. Functional only; no
timing is asserted."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from support import SESSION_OWNER

BENCH = Path(__file__).resolve().parent.parent.parent / "benchmarks" / "bench_kubernetes.py"


def test_bench_kubernetes_runs_every_row(docker_client: Any, runtime_image: str) -> None:
    owner = f"{SESSION_OWNER}-bench-{uuid.uuid4().hex[:6]}"
    environment = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"}
    result = subprocess.run(
        [sys.executable, str(BENCH), "--iterations", "2", "--cold-iterations", "1", "--owner", owner],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=BENCH.parent,
        env=environment,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "fake API server" in lines[0]
    for row, baselines in [
        ("execute true", ["raw persistent", "raw fresh exec"]),
        ("read small file", ["raw persistent cat"]),
        ("cold start (to Ready)", ["raw create->Running"]),
        ("warm acquisition", []),
    ]:
        (line,) = [line for line in lines if line.startswith(row)]
        assert "ours p50" in line
        for baseline in baselines:
            assert f"| {baseline} p50" in line
    assert docker_client.containers.list(all=True, filters={"label": f"io.sandboxes.owner={owner}"}) == []
