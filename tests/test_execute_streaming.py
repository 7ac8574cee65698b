"""``execute_streaming``: output handed over as it is printed (LocalSandbox's process runner,
DockerSandbox through the exec helper and through plain docker exec), and BaseSandbox's
fallback that hands it over once at the end."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from support import SESSION_OWNER

from sandboxes import protocol as p
from sandboxes.base import BaseSandbox
from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.local import LocalSandbox

COUNT = "for i in 1 2 3 4 5 6; do echo $i; sleep 0.1; done; exit 3"
EXPECTED = "".join(f"{i}\n" for i in range(1, 7))


def _collect(sandbox: BaseSandbox, command: str, **kwargs: Any) -> tuple[list[tuple[float, bytes]], p.ExecuteResponse]:
    chunks: list[tuple[float, bytes]] = []
    response = sandbox.execute_streaming(command, lambda c, *_: chunks.append((time.monotonic(), c)), **kwargs)
    return chunks, response


def _assert_live(chunks: list[tuple[float, bytes]], response: p.ExecuteResponse) -> None:
    assert b"".join(c for _, c in chunks).decode() == EXPECTED
    assert response.output == EXPECTED
    assert response.exit_code == 3
    assert len(chunks) >= 3, "output should arrive in pieces as it is printed"
    assert chunks[-1][0] - chunks[0][0] > 0.3, "the first piece must arrive long before the last"


def test_local_sandbox_streams_as_it_prints(tmp_path: Path) -> None:
    with LocalSandbox(tmp_path) as sandbox:
        chunks, response = _collect(sandbox, COUNT)
        _assert_live(chunks, response)
        assert sandbox.execute(COUNT).output == EXPECTED  # execute itself is unchanged


def test_local_hook_sees_everything_even_beyond_the_output_cap(tmp_path: Path) -> None:
    with LocalSandbox(tmp_path) as sandbox:
        chunks, response = _collect(sandbox, "head -c 100000 /dev/zero | tr '\\0' a", output_limit=1000)
        assert response.truncated
        assert sum(len(c) for _, c in chunks) == 100_000


@pytest.fixture(scope="module", params=[True, False], ids=["exec-helper", "docker-exec"])
def docker_sandbox(request: pytest.FixtureRequest, docker_client: Any, runtime_image: str) -> Iterator[DockerSandbox]:
    config = DockerSandboxConfig(image=runtime_image, owner=SESSION_OWNER, use_exec_helper=request.param)
    with DockerSandbox.create(config, client=docker_client) as sandbox:
        yield sandbox


def test_a_hook_of_one_argument_gets_the_chunks_alone(tmp_path: Path, docker_sandbox: DockerSandbox) -> None:
    """Hooks written before stdout and stderr were told apart take the chunk alone, on every
    path (the exec helper's hands over each chunk with its stream)."""
    command = "echo out; echo err >&2"
    with LocalSandbox(tmp_path) as local:
        for sandbox in (local, docker_sandbox):
            chunks: list[bytes] = []
            response = sandbox.execute_streaming(command, chunks.append)
            assert response.exit_code == 0, response
            assert sorted(b"".join(chunks).decode().split()) == ["err", "out"]


def test_docker_sandbox_streams_as_it_prints(docker_sandbox: DockerSandbox) -> None:
    chunks, response = _collect(docker_sandbox, COUNT)
    _assert_live(chunks, response)
    assert (docker_sandbox.helper_driver.mux is not None) == docker_sandbox.config.use_exec_helper


class _Canned(BaseSandbox):
    """A transport without a live hook: output exists only once the command is over."""

    def __init__(self, output: str) -> None:
        self.output = output
        self.calls: list[dict[str, Any]] = []

    @property
    def id(self) -> str:
        return "canned"

    def execute(
        self,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int | None = None,
    ) -> p.ExecuteResponse:
        self.calls.append({"command": command, "timeout": timeout, "env": env, "cwd": cwd, "limit": output_limit})
        return p.ExecuteResponse(self.output, exit_code=0)


def test_base_fallback_hands_the_output_over_once() -> None:
    sandbox = _Canned("héllo\n")
    chunks: list[bytes] = []
    response = sandbox.execute_streaming("cmd", chunks.append, timeout=5, env={"A": "1"}, cwd="/w", output_limit=9)
    assert chunks == ["héllo\n".encode()]
    assert response.output == "héllo\n"
    assert sandbox.calls == [{"command": "cmd", "timeout": 5, "env": {"A": "1"}, "cwd": "/w", "limit": 9}]


def test_base_fallback_without_output_or_hook() -> None:
    chunks: list[bytes] = []
    assert _Canned("").execute_streaming("cmd", chunks.append).exit_code == 0
    assert chunks == []
    assert _Canned("x").execute_streaming("cmd", None).output == "x"
