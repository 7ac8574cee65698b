"""`ProviderConformance` over every provider, each against its real backend: a Docker engine,
sshd in `sandboxes/ssh-vm` containers, and this host's bubblewrap; `SharedProviderConformance`
over Docker's."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ssh_fixtures import SSHVM, start_vm
from support import SESSION_OWNER

from sandboxes.docker import DockerProvider, DockerSandboxConfig
from sandboxes.local import LocalProvider
from sandboxes.ssh import SSHProvider, SSHProviderConfig
from sandboxes.testing import ProviderConformance, SharedProviderConformance


class TestDockerProvider(ProviderConformance, SharedProviderConformance):
    @pytest.fixture
    def provider(self, docker_client: Any, runtime_image: str) -> Iterator[DockerProvider]:
        owner = f"{SESSION_OWNER}-pc-{uuid.uuid4().hex[:6]}"
        template = DockerSandboxConfig(
            image=runtime_image, owner=owner, labels={"io.sandboxes.test-session": SESSION_OWNER}
        )
        with DockerProvider(template, client=docker_client, sweep_interval=None) as provider:
            yield provider


@pytest.fixture(scope="module")
def vm(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHVM]:
    machine = start_vm(tmp_path_factory.mktemp("provider-ssh"))
    yield machine
    machine.stop()


class TestSSHProvider(ProviderConformance):
    @pytest.fixture
    def provider(self, vm: SSHVM) -> Iterator[SSHProvider]:
        config = SSHProviderConfig(hosts=[vm.host_config()], workspace_root=f"/tmp/ws-{uuid.uuid4().hex[:8]}")
        with SSHProvider(config) as provider:
            yield provider


class TestLocalProvider(ProviderConformance):
    @pytest.fixture
    def provider(self, tmp_path: Path) -> Iterator[LocalProvider]:
        with LocalProvider(tmp_path / "sandboxes") as provider:
            yield provider


def test_local_records_live_outside_the_sandbox(tmp_path: Path) -> None:
    """A sandbox cannot reach its own record (labels, expiry) to forge it."""
    provider = LocalProvider(tmp_path / "sandboxes")
    with provider.create() as sandbox:
        assert sandbox.isolated, "this test needs bubblewrap"
        record = tmp_path / "sandboxes" / f"{sandbox.id}.json"
        original = record.read_text()
        assert '"labels"' in original
        sandbox.execute(f"echo '{{}}' > {record}; rm -f {record}")  # inside the jail: a path of its own
        assert record.read_text() == original
