"""One lifecycle contract on every backend (`sandboxes.lifecycle`): ``with`` destroys what the
caller created and only closes what it attached to; close keeps, destroy is idempotent."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest
from server.service_harness import KEYS, running, settings_for
from ssh_fixtures import SSHVM, start_vm
from support import SESSION_OWNER

from sandboxes.client import NotFound, RemoteSandbox, SandboxClient
from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.local import LocalSandbox, LocalSandboxConfig, LocalTemplate
from sandboxes.ssh import SSHSandbox, SSHSandboxConfig
from sandboxes.testing import LifecycleConformance


class TestDockerLifecycle(LifecycleConformance):
    @pytest.fixture
    def create(self, docker_client: Any, runtime_image: str) -> Callable[[], DockerSandbox]:
        config = DockerSandboxConfig(image=runtime_image, owner=SESSION_OWNER)
        return lambda: DockerSandbox.create(config, client=docker_client)

    @pytest.fixture
    def attach(self, docker_client: Any) -> Callable[[DockerSandbox], DockerSandbox]:
        return lambda sandbox: DockerSandbox.attach(sandbox.id, client=docker_client, config=sandbox.config)

    @pytest.fixture
    def exists(self, docker_client: Any) -> Callable[[DockerSandbox], bool]:
        def exists(sandbox: DockerSandbox) -> bool:
            try:
                docker_client.containers.get(sandbox.id)
            except docker.errors.NotFound:
                return False
            return True

        return exists


class TestLocalLifecycle(LifecycleConformance):
    @pytest.fixture
    def create(self, tmp_path: Path) -> Callable[[], LocalSandbox]:
        counter = iter(range(1000))
        return lambda: LocalSandbox.create(LocalSandboxConfig(root_dir=tmp_path / f"root-{next(counter)}"))

    @pytest.fixture
    def attach(self) -> Callable[[LocalSandbox], LocalSandbox]:
        # A LocalSandbox's id is its caller's to give (a handle without one names itself, as
        # `LocalSandbox(root)` does); a caller that re-attaches passes the id it kept, as
        # `LocalProvider.attach` does from its records.
        return lambda sandbox: LocalSandbox(config=sandbox.config.model_copy(update={"sandbox_id": sandbox.id}))

    @pytest.fixture
    def exists(self) -> Callable[[LocalSandbox], bool]:
        return lambda sandbox: sandbox.root.is_dir()


def test_local_sandbox_on_a_directory_only_closes(tmp_path: Path) -> None:
    """``LocalSandbox(root)`` attaches to the caller's own directory: leaving ``with`` keeps it."""
    with LocalSandbox(tmp_path / "mine") as sandbox:
        assert not sandbox.owned
        sandbox.write(f"{tmp_path}/mine/kept.txt", "kept")
    assert (tmp_path / "mine" / "kept.txt").read_text() == "kept"


@pytest.fixture(scope="module")
def vm(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHVM]:
    machine = start_vm(tmp_path_factory.mktemp("lifecycle-ssh"))
    yield machine
    machine.stop()


class TestSSHLifecycle(LifecycleConformance):
    @pytest.fixture
    def create(self, vm: SSHVM) -> Callable[[], SSHSandbox]:
        return lambda: SSHSandbox.create(SSHSandboxConfig(host=vm.host_config()))

    @pytest.fixture
    def attach(self, vm: SSHVM) -> Callable[[SSHSandbox], SSHSandbox]:
        return lambda sandbox: SSHSandbox.attach(sandbox.config, sandbox.workspace)

    @pytest.fixture
    def exists(self, vm: SSHVM) -> Callable[[SSHSandbox], bool]:
        return lambda sandbox: vm.docker.exec_run(["test", "-d", sandbox.workspace]).exit_code == 0


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxClient]:
    data = tmp_path_factory.mktemp("lifecycle-service")
    settings = settings_for(data, templates={"default": LocalTemplate()})
    with running(settings) as service, SandboxClient(service.url, KEYS["alice"]) as sandbox_client:
        yield sandbox_client


class TestRemoteLifecycle(LifecycleConformance):
    @pytest.fixture
    def create(self, client: SandboxClient) -> Callable[[], RemoteSandbox]:
        return lambda: client.create("default")

    @pytest.fixture
    def attach(self, client: SandboxClient) -> Callable[[RemoteSandbox], RemoteSandbox]:
        return lambda sandbox: client.attach(sandbox.id)

    @pytest.fixture
    def exists(self, client: SandboxClient) -> Callable[[RemoteSandbox], bool]:
        def exists(sandbox: RemoteSandbox) -> bool:
            try:
                client.get(sandbox.id)
            except NotFound:
                return False
            return True

        return exists


def test_async_with_follows_the_same_rule(client: SandboxClient, tmp_path: Path) -> None:
    import asyncio

    async def scenario() -> tuple[str, str]:
        async with client.create("default") as created:
            async with client.attach(created.id) as attached:
                assert (await attached.aexecute("echo a")).output == "a\n"
            assert client.get(created.id).id == created.id  # attached: only closed
            return created.id, created.id

    sandbox_id, _ = asyncio.run(scenario())
    with pytest.raises(NotFound):
        client.get(sandbox_id)  # created: destroyed
