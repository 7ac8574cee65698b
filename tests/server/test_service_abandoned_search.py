"""Over real HTTP, on the local and Docker backends: a search whose client left is killed in the
sandbox (its ``find`` and ``grep`` with it) instead of running on to the operation's timeout,
through the hot path and through FastAPI alike."""

from __future__ import annotations

import base64
import json
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from service_harness import KEYS, Running, alice_fixtures, execute, running, settings_for
from support import SESSION_OWNER

from sandboxes.docker import DockerTemplate

ENDLESS = "/proc/self/pagemap"
"""A file that reads for minutes (each process's page table, hundreds of GiB): a grep of it
runs until it is killed."""


@pytest.fixture(scope="module", params=["local", "docker"])
def service(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """The operation's own timeout far beyond the test's bound: only a kill ends the search soon."""
    data_dir = tmp_path_factory.mktemp(f"abandoned-{request.param}")
    options: dict[str, Any] = {"file_operation_timeout": 300}
    if request.param == "docker":
        template = DockerTemplate(
            backend="docker",
            image=request.getfixturevalue("runtime_image"),
            cpus=0.5,
            memory="256m",
            labels={"io.sandboxes.test-session": SESSION_OWNER},
        )
        options |= {"owner": SESSION_OWNER, "templates": {"default": template}}
        with running(settings_for(data_dir, **options), docker_client=request.getfixturevalue("docker_client")) as svc:
            yield svc
        return
    with running(settings_for(data_dir, **options)) as svc:
        yield svc


client, sandbox = alice_fixtures()


def _searching(client: httpx.Client, sandbox_id: str, pattern: str) -> list[str]:
    """Processes of the sandbox with ``pattern`` in their command line (the search's ``find``,
    ``sh`` and ``grep``); the pattern goes on stdin, so it is not in this search's own."""
    answer = execute(client, sandbox_id, "grep -lsF -f - /proc/[0-9]*/cmdline; true", stdin_b64=_b64(pattern))
    return str(answer["output"]).split()


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _request(service: Running, path: str, body: dict[str, Any], *, content_type: str) -> socket.socket:
    """``POST path`` sent on a socket of its own, its answer never read: closing the socket is
    the client leaving."""
    port = int(service.url.rsplit(":", 1)[1])
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEYS['alice']}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    conn = socket.create_connection(("127.0.0.1", port), timeout=30)
    conn.sendall(head.encode() + data)
    return conn


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8"])
def test_a_grep_whose_client_left_is_killed(
    service: Running, client: httpx.Client, sandbox: dict[str, Any], content_type: str
) -> None:
    """``application/json`` is served by the hot path, the other by FastAPI's route."""
    sandbox_id = sandbox["id"]
    pattern = f"sbx-{uuid.uuid4().hex}"
    conn = _request(
        service,
        f"/v1/sandboxes/{sandbox_id}/files/grep",
        {"pattern": pattern, "path": ENDLESS},
        content_type=content_type,
    )
    with conn:
        deadline = time.monotonic() + 20
        while not _searching(client, sandbox_id, pattern):
            assert time.monotonic() < deadline, "the search never started"
            time.sleep(0.05)
    deadline = time.monotonic() + 10
    while left := _searching(client, sandbox_id, pattern):
        assert time.monotonic() < deadline, f"the abandoned search runs on: {left}"
        time.sleep(0.05)
