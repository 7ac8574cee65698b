"""What the chart's test modules share: where the chart is, how it is rendered, and lookups in
what it renders. (Not in conftest.py: pytest imports every conftest under one name.)"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "CHART",
    "FULLNAME",
    "HARDENED",
    "KUBERNETES",
    "NAMESPACE",
    "RELEASE",
    "REPO",
    "VERSION",
    "Render",
    "fail_message",
    "one",
    "render_notes",
    "run_helm",
]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "sandboxes"
HARDENED = Path(__file__).with_name("values-hardened.yaml")
VERSION = (REPO / "images" / "VERSION").read_text().strip()
KUBERNETES = "1.31.0"
"""The API schemas rendered objects must satisfy: the kubectl the tools come with is 1.31."""
RELEASE, NAMESPACE = "rel", "svc"
FULLNAME = "rel-sandboxes"

Render = Callable[..., list[dict[str, Any]]]
"""``render(*helm_args, values={dotted.key: value})``: the objects ``helm template`` renders."""


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)


def fail_message(helm: Path, *args: str) -> str:
    """What `helm template` of the chart with ``args`` says on stderr; fails if it renders."""
    done = run_helm(helm, "template", RELEASE, str(CHART), "-n", NAMESPACE, *args)
    assert done.returncode != 0, f"helm template {' '.join(args)} rendered:\n{done.stdout[:2000]}"
    return done.stderr


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The one rendered object of ``kind`` (and ``name``); fails on none or several."""
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}: {[o['metadata']['name'] for o in found]}"
    return found[0]


def render_notes(helm: Path, tmp_path: Path, *args: str) -> str:
    """NOTES.txt as `helm install` prints it. `helm template` never renders it and an install
    needs a cluster, so a copy of the chart renders it through `tpl` into a ConfigMap."""
    chart = tmp_path / "sandboxes"
    shutil.copytree(CHART, chart)
    (chart / "files" / "NOTES.txt").write_text((chart / "templates" / "NOTES.txt").read_text())
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ tpl (.Files.Get "files/NOTES.txt") . | quote }}}\n'
    )
    done = run_helm(helm, "template", RELEASE, str(chart), "-n", NAMESPACE, "-s", "templates/zz-notes.yaml", *args)
    assert done.returncode == 0, done.stderr
    return str(yaml.safe_load(done.stdout)["data"]["notes"])
