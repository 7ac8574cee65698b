"""CompositeSandbox: a composite whose default is a LocalSandbox runs commands there (sync and
async), routes paths inside the sandbox's root, and passes the sandbox conformance suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from composite_support import paths_of, text_of

from sandboxes import protocol as p
from sandboxes.composite import CompositeBackend, CompositeSandbox
from sandboxes.local import LocalSandbox
from sandboxes.state import StateBackend
from sandboxes.testing import SandboxConformance

# ---------------------------------------------------------------------- sandbox default


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalSandbox]:
    with LocalSandbox(tmp_path / "root") as sandbox:
        yield sandbox


def test_composite_executes_only_when_the_default_can(local: LocalSandbox) -> None:
    plain = CompositeBackend.create(StateBackend(), {"/mem": StateBackend()})
    assert type(plain) is CompositeBackend
    assert not isinstance(plain, p.SandboxBackendProtocol)
    assert not hasattr(plain, "execute")
    sandbox = CompositeBackend.create(local, {"/mem": StateBackend()})
    assert isinstance(sandbox, CompositeSandbox)
    assert isinstance(sandbox, p.SandboxBackendProtocol)
    assert sandbox.id == local.id
    assert sandbox.execute("echo hi").output == "hi\n"
    assert not isinstance(CompositeBackend(local, {}), p.SandboxBackendProtocol)
    with pytest.raises(TypeError, match="SandboxBackendProtocol"):
        CompositeSandbox(StateBackend(), {})  # type: ignore[arg-type]


async def test_composite_sandbox_async_execute(local: LocalSandbox) -> None:
    sandbox = CompositeBackend.create(local, {})
    result = await sandbox.aexecute('printf %s "$X"', env={"X": "y"})
    assert (result.output, result.exit_code) == ("y", 0)


def test_local_default_with_state_routes(local: LocalSandbox) -> None:
    root = str(local.root)
    mem = StateBackend()
    composite = CompositeBackend.create(local, {f"{root}/mem": mem, "/virtual/notes": StateBackend()})
    composite.write(f"{root}/src/main.py", "needle = 1\n")
    composite.write(f"{root}/mem/note.py", "needle = 2\n")
    composite.write("/virtual/notes/n.py", "needle = 3\n")
    assert set(mem.files) == {"/note.py"}
    assert not (local.root / "mem").exists()
    assert paths_of(composite.ls(root).entries) == [f"{root}/mem/", f"{root}/src/"]
    assert paths_of(composite.grep("needle", root).matches) == [f"{root}/mem/note.py", f"{root}/src/main.py"]
    assert paths_of(composite.glob("**/*.py", root).matches) == [f"{root}/mem/note.py", f"{root}/src/main.py"]
    assert paths_of(composite.glob("mem/*.py", root).matches) == [f"{root}/mem/note.py"]
    assert text_of(composite, "/virtual/notes/n.py") == "needle = 3\n"
    # Commands see the default's filesystem only.
    listing = composite.execute(f"ls {root}")
    assert listing.output.split() == ["src"]


@pytest.fixture(scope="module")
def local_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSandbox]:
    with LocalSandbox(tmp_path_factory.mktemp("composite-local")) as sandbox:
        yield sandbox


class TestCompositeConformanceOverLocalSandbox(SandboxConformance):
    """Routes live outside the sandbox's directory, so ``root`` is an ordinary empty directory."""

    @pytest.fixture
    def backend(self, local_sandbox: LocalSandbox) -> CompositeSandbox:
        return CompositeBackend.create(local_sandbox, {"/composite-mem": StateBackend()})

    @pytest.fixture
    def base_dir(self, local_sandbox: LocalSandbox) -> str:
        return str(local_sandbox.root)
