"""DockerSandbox: a command that prints nothing runs until its own timeout, however long the
docker client's request timeout (docker-py leaves it on the hijacked exec socket). The client
here times requests out after `_CLIENT_TIMEOUT` seconds, so a silence a little longer shows
what the default 60 s did to a quiet build."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import docker
import pytest
from support import SESSION_OWNER

from sandboxes.docker import DockerSandbox, DockerSandboxConfig

_CLIENT_TIMEOUT = 3
_SILENCE = _CLIENT_TIMEOUT + 2


@pytest.fixture
def impatient_client(docker_client: Any) -> Iterator[Any]:
    """A docker client of its own, made to time requests out after `_CLIENT_TIMEOUT` seconds
    once the sandbox exists (so creating it under load is not what is tested)."""
    client = docker.from_env()  # as `docker_client` was made, but not shared with other tests
    try:
        yield client
    finally:
        client.close()


def _silent_sandbox(client: Any, image: str) -> DockerSandbox:
    sandbox = DockerSandbox.create(DockerSandboxConfig(image=image, owner=SESSION_OWNER), client=client)
    client.api.timeout = _CLIENT_TIMEOUT  # before the first command starts the helper on it
    assert sandbox.execute("true").exit_code == 0
    return sandbox


def test_a_silent_command_outlives_the_client_timeout_through_the_helper(
    impatient_client: Any, runtime_image: str
) -> None:
    with _silent_sandbox(impatient_client, runtime_image) as sandbox:
        helper = sandbox.helper_driver.mux
        assert helper is not None
        result = sandbox.execute(f"sleep {_SILENCE}; echo done", timeout=60)
        assert (result.exit_code, result.error, result.output) == (0, None, "done\n"), result
        assert sandbox.helper_driver.mux is helper  # the same helper: it was never dropped
        assert helper.alive


def test_a_silent_command_outlives_the_client_timeout_in_its_own_exec(
    impatient_client: Any, no_python_image: str
) -> None:
    with _silent_sandbox(impatient_client, no_python_image) as sandbox:
        assert sandbox.helper_driver.mux is None
        result = sandbox.execute(f"sleep {_SILENCE}; echo done", timeout=60)
        assert (result.exit_code, result.error, result.output) == (0, None, "done\n"), result
