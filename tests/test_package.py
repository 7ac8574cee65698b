"""The top-level package: its version, its public API, and that importing it stays cheap."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

import sandboxes

HEAVY = ("docker", "paramiko", "kubernetes", "fastapi", "uvicorn", "httpx")


def _modules_after(statement: str) -> set[str]:
    """The modules loaded by ``statement`` in a fresh interpreter (this one has imported them all)."""
    probe = f"{statement}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


def test_importing_the_package_loads_no_driver_nor_web_framework() -> None:
    loaded = _modules_after("import sandboxes")
    assert "sandboxes" in loaded
    assert not {m for m in loaded if m.split(".")[0] in HEAVY}
    # Not a single backend either: each is imported when its name is first used.
    assert not {m for m in loaded if m.startswith("sandboxes.")}


def test_a_public_name_imports_only_its_own_module() -> None:
    loaded = _modules_after("from sandboxes import LocalSandbox")
    assert "sandboxes.local" in loaded
    assert not {m for m in loaded if m.split(".")[0] in HEAVY}


@pytest.mark.parametrize("name", [n for n in sandboxes.__all__ if n != "__version__"])
def test_every_public_name_resolves_to_its_module(name: str) -> None:
    value = getattr(sandboxes, name)
    home = importlib.import_module(sandboxes._HOME[name])
    assert value is getattr(home, name)
    assert name in dir(sandboxes)


def test_every_home_is_public() -> None:
    assert set(sandboxes._HOME) == set(sandboxes.__all__) - {"__version__"}


def test_the_kubernetes_backend_imports_its_client_only_when_used() -> None:
    loaded = _modules_after("from sandboxes import KubernetesSandbox")
    assert "sandboxes.kubernetes" in loaded
    assert not {m for m in loaded if m.split(".")[0] in HEAVY}


def test_an_unknown_name_is_an_attribute_error() -> None:
    assert not hasattr(sandboxes, "NoSuchSandbox")
    with pytest.raises(AttributeError, match="NoSuchSandbox"):
        sandboxes.NoSuchSandbox  # type: ignore[attr-defined]  # noqa: B018


def test_the_version_is_the_installed_distributions() -> None:
    assert sandboxes.__version__ == importlib.metadata.version("sandboxes")


@pytest.mark.parametrize("module", ["providers", "server/api.py"])
def test_no_shim_of_an_unshipped_release_remains(module: str) -> None:
    """The providers live in their backend's package and the wire contract in `sandboxes.api`:
    the re-exports kept for a release that never shipped are gone, so each name has one home."""
    package = Path(sandboxes.__file__).parent
    assert not (package / module).exists(), f"sandboxes/{module} is a shim of an unshipped release"


MAX_MODULE_LINES = 650
"""The project's bound on a module's length (a module past ~600 lines is split by responsibility)."""


def test_no_module_of_the_package_nor_the_agent_is_over_the_bound() -> None:
    root = Path(__file__).resolve().parent.parent
    sources = [path for package in ("sandboxes", "agent") for path in sorted((root / package).rglob("*.py"))]
    assert len(sources) > 50  # the walk found the code
    lengths = {str(path.relative_to(root)): len(path.read_text(encoding="utf-8").splitlines()) for path in sources}
    assert {path: n for path, n in lengths.items() if n > MAX_MODULE_LINES} == {}
