"""A port inside a sandbox, reached through its exec helper (`sandboxes.ports`): an HTTP server
started in the sandbox by its own commands answers through the relay, on a local jail and in a
Docker container (both without a network of their own beyond loopback)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support import HAS_BWRAP, SESSION_OWNER, needs

from sandboxes import protocol as p
from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.jobs import JobRunner
from sandboxes.local import LocalSandbox
from sandboxes.ports import PortError, PortRefused, aconnect_port, connect_port
from sandboxes.state import StateBackend

PORT = 8765


def _serve(sandbox: Any, directory: str) -> str:
    """Start ``python3 -m http.server`` on 127.0.0.1:PORT in the sandbox serving ``directory``
    (a background job: it outlives the command that starts it); its job id, once it listens."""
    sandbox.upload_files([(f"{directory}/hello.txt", b"hello from inside\n")])
    job = JobRunner(sandbox).start(f"exec python3 -m http.server {PORT} --bind 127.0.0.1", cwd=directory)
    deadline = time.monotonic() + 20
    while True:
        try:
            connect_port(sandbox, PORT, timeout=5).close()
            return job.id
        except PortRefused:
            assert time.monotonic() < deadline, "the server in the sandbox never listened"
            time.sleep(0.05)


def _get(sandbox: Any, path: str) -> bytes:
    with connect_port(sandbox, PORT, timeout=10) as conn:
        conn.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        parts = []
        while chunk := conn.recv(65536):
            parts.append(chunk)
    return b"".join(parts)


def check_a_server_answers_through_the_relay(sandbox: Any, directory: str) -> None:
    """Nothing listens, then a server started in the sandbox answers, blocking and on a loop."""
    with pytest.raises(PortRefused, match=f"nothing listens on port {PORT}"):
        connect_port(sandbox, PORT, timeout=10)
    job_id = _serve(sandbox, directory)
    try:
        answer = _get(sandbox, "/hello.txt")
        assert answer.startswith(b"HTTP/1.0 200"), answer[:200]
        assert answer.endswith(b"\r\n\r\nhello from inside\n")

        async def over_a_loop() -> bytes:
            reader, writer = await aconnect_port(sandbox, PORT)
            writer.write(b"GET /hello.txt HTTP/1.0\r\n\r\n")
            await writer.drain()
            parts = []
            while chunk := await reader.read():
                parts.append(chunk)
            writer.close()
            return b"".join(parts)

        assert asyncio.run(over_a_loop()).endswith(b"hello from inside\n")
    finally:
        JobRunner(sandbox).kill(job_id)


@pytest.fixture
def docker_sandbox(docker_client: Any, runtime_image: str) -> Iterator[DockerSandbox]:
    config = DockerSandboxConfig(image=runtime_image, owner=SESSION_OWNER)
    with DockerSandbox.create(config, client=docker_client) as sandbox:
        yield sandbox


def test_a_server_in_a_local_jail_answers_through_the_relay(jail: LocalSandbox) -> None:
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
    check_a_server_answers_through_the_relay(jail, str(jail.root))


def test_a_server_in_a_docker_container_answers_through_the_relay(docker_sandbox: DockerSandbox) -> None:
    check_a_server_answers_through_the_relay(docker_sandbox, "/workspace")


def test_a_sandbox_without_an_exec_helper_answers_unavailable() -> None:
    with pytest.raises(PortError, match="runs no exec helper") as refused:
        connect_port(StateBackend(), PORT)
    assert refused.value.code == p.UNAVAILABLE


def test_a_port_out_of_range_is_an_invalid_argument(jail: LocalSandbox) -> None:
    for port in (0, 65536, -1):
        with pytest.raises(PortError) as refused:
            connect_port(jail, port)
        assert refused.value.code == p.INVALID_ARGUMENT
