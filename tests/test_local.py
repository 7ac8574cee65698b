"""LocalSandbox: the full sandbox conformance suite, isolated and not."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from sandboxes import protocol as p
from sandboxes.composite import CompositeBackend
from sandboxes.local import LocalSandbox, LocalSandboxConfig, NotIsolatedWarning
from sandboxes.state import StateBackend
from sandboxes.testing import SandboxConformance

IN_CI = os.environ.get("CI") == "true"


@pytest.fixture(scope="module")
def isolated_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSandbox]:
    if shutil.which("bwrap") is None:
        if IN_CI:
            pytest.fail("CI must test the isolated LocalSandbox: bubblewrap (bwrap) is not installed")
        pytest.skip("bubblewrap not installed: isolated LocalSandbox not testable here")
    with LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path_factory.mktemp("isolated"), isolation="bwrap")) as sb:
        yield sb


@pytest.fixture(scope="module")
def unisolated_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSandbox]:
    root = tmp_path_factory.mktemp("unisolated")
    with (
        pytest.warns(NotIsolatedWarning, match="NOT isolated"),
        LocalSandbox(config=LocalSandboxConfig(root_dir=root, isolation="none")) as sandbox,
    ):
        yield sandbox


class TestIsolatedLocalSandbox(SandboxConformance):
    @pytest.fixture
    def backend(self, isolated_sandbox: LocalSandbox) -> LocalSandbox:
        return isolated_sandbox

    @pytest.fixture
    def base_dir(self, isolated_sandbox: LocalSandbox) -> str:
        return str(isolated_sandbox.root)


class TestUnisolatedLocalSandbox(SandboxConformance):
    """Without bubblewrap the sandbox must be just as correct, only not isolated."""

    @pytest.fixture
    def backend(self, unisolated_sandbox: LocalSandbox) -> LocalSandbox:
        return unisolated_sandbox

    @pytest.fixture
    def base_dir(self, unisolated_sandbox: LocalSandbox) -> str:
        return str(unisolated_sandbox.root)


# ---------------------------------------------------------------------- what is writable


@pytest.mark.parametrize("path", ["/work/a.txt", "/opt/a.txt", "/a.txt", "/home/a.txt", "/var/a.txt", "/etc/a.txt"])
def test_writes_outside_the_root_and_tmp_are_refused(isolated_sandbox: LocalSandbox, path: str) -> None:
    """The jail's / is a throwaway tmpfs: a write there must not answer success and vanish."""
    assert isolated_sandbox.write(path, "lost?").error == p.PERMISSION_DENIED
    assert isolated_sandbox.upload_files([(path, b"lost?")])[0].error == p.PERMISSION_DENIED
    assert isolated_sandbox.execute(f"echo x > {path}").exit_code != 0


def test_writes_through_a_composite_are_refused_outside_the_root(isolated_sandbox: LocalSandbox) -> None:
    composite = CompositeBackend.create(isolated_sandbox, {"/memories/": StateBackend()})
    assert composite.write("/work/a.txt", "lost?").error == p.PERMISSION_DENIED
    kept = f"{isolated_sandbox.root}/composite.txt"
    assert composite.write(kept, "kept").error is None
    assert composite.download_files([kept])[0].content == b"kept"


def test_the_root_and_private_tmp_stay_writable(isolated_sandbox: LocalSandbox) -> None:
    for path in (f"{isolated_sandbox.root}/deep/w.txt", "/tmp/deep/w.txt"):
        assert isolated_sandbox.write(path, "w").error is None
        assert isolated_sandbox.download_files([path])[0].content == b"w"
