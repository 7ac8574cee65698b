"""A silent command through the service and its Python client, on the Docker backend: neither the
service's docker client (whose request timeout docker-py leaves on an exec's socket) nor the
client's own read timeout ends a command before its own timeout. Both are made short here, so a
silence of a few seconds shows what their defaults did to a quiet build."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from service_harness import KEYS, UNTHROTTLED, Running, running, settings_for
from support import SESSION_OWNER

from sandboxes import protocol as p
from sandboxes.client import RemoteSandbox, SandboxClient
from sandboxes.docker import DockerTemplate

_SHORT = 3
"""Seconds of the docker client's request timeout, and of the Python client's read timeout."""
_COMMAND = f"sleep {_SHORT + 2}; echo done"


@pytest.fixture
def impatient_docker(docker_client: Any) -> Iterator[Any]:
    """A docker client of the service's own, made impatient once the sandbox exists."""
    client = docker.from_env()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def service(impatient_docker: Any, runtime_image: str, tmp_path: Path) -> Iterator[Running]:
    template = DockerTemplate(
        backend="docker",
        image=runtime_image,
        cpus=0.5,
        memory="256m",
        labels={"io.sandboxes.test-session": SESSION_OWNER},
    )
    owner = f"{SESSION_OWNER}-silent-{uuid.uuid4().hex[:6]}"
    settings = settings_for(tmp_path, owner=owner, templates={"default": template}, tenants=UNTHROTTLED)
    with running(settings, docker_client=impatient_docker) as svc:
        yield svc


@pytest.fixture
def remote(service: Running, impatient_docker: Any) -> Iterator[RemoteSandbox]:
    with SandboxClient(service.url, KEYS["alice"], timeout=_SHORT) as client, client.create("default") as sandbox:
        impatient_docker.api.timeout = _SHORT  # before the first command starts the exec helper
        assert sandbox.execute("true").exit_code == 0
        yield sandbox


def test_a_silent_command_outlives_both_short_timeouts(remote: RemoteSandbox) -> None:
    result = remote.execute(_COMMAND, timeout=30)
    assert (result.exit_code, result.error, result.output) == (0, None, "done\n"), result


def test_a_silent_streamed_command_outlives_both_short_timeouts(remote: RemoteSandbox) -> None:
    events = list(remote.execute_stream(_COMMAND, timeout=30))
    final = events[-1]
    assert isinstance(final, p.ExecuteResponse), events
    assert (final.exit_code, final.error, final.output) == (0, None, "done\n"), final
