"""Fixtures of the chart's tests: the real helm binary and a renderer."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import CHART, NAMESPACE, RELEASE, REPO, Render, run_helm
from support import needs


@pytest.fixture(scope="session")
def helm() -> Path:
    """The real helm binary; `.ci/helm.sh` fetches it once into a cache outside git. A machine
    that cannot get it skips; in CI that is a failure (`needs`)."""
    fetched = subprocess.run(["bash", str(REPO / ".ci" / "helm.sh")], capture_output=True, text=True, timeout=600)
    binary = Path(fetched.stdout.strip() or "/nonexistent") / "helm"
    needs(fetched.returncode == 0 and binary.is_file(), f".ci/helm.sh could not provide helm: {fetched.stderr[-2000:]}")
    return binary


@pytest.fixture(scope="session")
def render(helm: Path) -> Render:
    def render(*args: str, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        extra: list[str] = []
        for key, value in (values or {}).items():
            extra += ["--set-json", f"{key}={json.dumps(value)}"]
        done = run_helm(helm, "template", RELEASE, str(CHART), "-n", NAMESPACE, *args, *extra)
        assert done.returncode == 0, done.stderr
        return [doc for doc in yaml.safe_load_all(done.stdout) if doc]

    return render
