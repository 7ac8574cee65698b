"""BaseSandbox's promise that POSIX ``sh`` plus coreutils OR busybox suffices, kept: the whole
conformance suite over an image whose only userland is busybox (as on Alpine), through
DockerSandbox's one-exec-per-command fallback (there is no python3 for the exec helper)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import SESSION_OWNER, assert_the_sh_kill_works_in_a_full_sandbox
from testcontainers.core.image import DockerImage

from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.testing import SandboxConformance

FIXTURE = Path(__file__).parent / "fixtures" / "busybox"


@pytest.fixture(scope="module")
def busybox_image(docker_client: Any, runtime_image: str) -> Iterator[str]:
    with DockerImage(path=FIXTURE, tag="sandboxes-test/busybox:latest", clean_up=False) as image:
        yield str(image)


@pytest.fixture(scope="module")
def busybox_sandbox(docker_client: Any, busybox_image: str) -> Iterator[DockerSandbox]:
    config = DockerSandboxConfig(image=busybox_image, owner=SESSION_OWNER)
    with DockerSandbox.create(config, client=docker_client) as sandbox:
        yield sandbox


class TestBusyboxConformance(SandboxConformance):
    @pytest.fixture
    def backend(self, busybox_sandbox: DockerSandbox) -> DockerSandbox:
        return busybox_sandbox

    @pytest.fixture
    def base_dir(self) -> str:
        return "/workspace"

    def test_the_userland_is_busybox_alone(self, busybox_sandbox: DockerSandbox) -> None:
        """Not vacuous: busybox is the only program in the image, and there is no exec helper."""
        executables = busybox_sandbox.execute("find / -xdev -type f -perm -u+x 2>/dev/null").output.split()
        assert set(executables) - {"/.dockerenv", "/sbin/docker-init"} == {"/bin/busybox"}  # the engine adds those
        links = busybox_sandbox.execute("for t in sh find stat grep; do readlink /bin/$t; done").output.split()
        assert links == ["/bin/busybox"] * 4
        assert busybox_sandbox.helper_driver.mux is None


def test_the_shared_kill_works_when_the_container_has_no_pid_left(busybox_sandbox: DockerSandbox) -> None:
    """busybox ash, like dash, exits when it cannot fork: the kill's scan falls back to built-ins."""
    assert_the_sh_kill_works_in_a_full_sandbox(busybox_sandbox)
