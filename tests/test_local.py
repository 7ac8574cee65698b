"""LocalSandbox: the full sandbox conformance suite, isolated and not."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from sandboxes.local import LocalSandbox, LocalSandboxConfig, NotIsolatedWarning
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
