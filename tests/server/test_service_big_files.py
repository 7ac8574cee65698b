"""A service (``python -m sandboxes.server``, local backend) asked for files a sandbox made for
free: a 1 GiB sparse file, 64 MiB of newlines, a pseudo-file that never ends. Its peak memory
(``VmHWM``, reset before each request) grows by less than `GROWTH` for each, whatever it holds,
and the client takes files over the service's inline bound through the streamed archive."""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import KEYS, ServiceProcess, create, execute, subprocess_config

from sandboxes import protocol as p
from sandboxes.client import AsyncSandboxClient, SandboxClient
from sandboxes.client._wire import ClientConfig

GROWTH = 256 << 20
INLINE = 1 << 20
"""The service's ``max_inline_download_bytes`` here: files over it are streamed."""


def reset_peak(pid: int) -> int:
    """Reset the process's peak resident size (``VmHWM``) to its current one; that, in bytes."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return peak(pid)


def peak(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    workdir = tmp_path_factory.mktemp("big-files")
    config = subprocess_config(workdir / "data", max_inline_download_bytes=INLINE)
    service = ServiceProcess(config, workdir).start()
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module")
def client(service: ServiceProcess) -> Iterator[httpx.Client]:
    with service.client() as client:
        yield client


@pytest.fixture(scope="module")
def sandbox(client: httpx.Client) -> Iterator[dict[str, Any]]:
    created = create(client)
    made = execute(
        client,
        created["id"],
        "truncate -s 1G sparse && head -c 67108864 /dev/zero | tr '\\0' '\\n' > newlines"
        " && head -c 3000000 /dev/urandom > mid && head -c 200000 /dev/urandom > small"
        " && sha256sum small mid && pwd",
    )
    assert made["exit_code"] == 0, made
    small, mid, root = made["output"].strip().split("\n")
    created["small_sha256"], created["mid_sha256"] = small.split()[0], mid.split()[0]
    created["root"] = root.strip()
    yield created
    client.delete(f"/v1/sandboxes/{created['id']}")


def _post(client: httpx.Client, sandbox: dict[str, Any], op: str, **body: Any) -> Any:
    response = client.post(f"/v1/sandboxes/{sandbox['id']}/files/{op}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _bounded(service: ServiceProcess, call: Any) -> Any:
    """``call()``'s answer, asserting the service's peak memory grew by less than `GROWTH`."""
    assert service.process is not None
    pid = service.process.pid
    start = reset_peak(pid)
    began = time.monotonic()
    answer = call()
    assert time.monotonic() - began < 30
    assert peak(pid) - start < GROWTH, f"the service grew by {(peak(pid) - start) >> 20} MiB"
    return answer


def test_a_big_sparse_file_is_not_downloaded_inline(
    service: ServiceProcess, client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    [item] = _bounded(service, lambda: _post(client, sandbox, "download", paths=[f"{sandbox['root']}/sparse"]))
    assert (item["error"], item["content_b64"]) == (p.FILE_TOO_LARGE, None), item
    assert "GET /archive" in item["message"]


def test_pseudo_files_are_read_within_the_bound_and_devices_refused(
    service: ServiceProcess, client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    """``/proc/self/pagemap`` says it is empty and reads ~256 GB: no more than the inline bound
    of it comes; ``status`` says empty too and comes whole; ``/dev/zero`` is refused."""
    pagemap, status, zero = _bounded(
        service,
        lambda: _post(client, sandbox, "download", paths=["/proc/self/pagemap", "/proc/self/status", "/dev/zero"]),
    )
    assert pagemap["error"] in (None, p.FILE_TOO_LARGE, p.PERMISSION_DENIED), pagemap
    assert len(base64.b64decode(pagemap["content_b64"] or "")) <= INLINE
    assert status["error"] is None, status
    assert base64.b64decode(status["content_b64"]).startswith(b"Name:\t"), status
    assert (zero["error"], zero["content_b64"]) == (p.INVALID_ARGUMENT, None), zero


def test_read_of_a_file_of_newlines_is_ten_lines(
    service: ServiceProcess, client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    result = _bounded(
        service, lambda: _post(client, sandbox, "read", file_path=f"{sandbox['root']}/newlines", limit=10)
    )
    assert result["file_data"]["content"] == "\n" * 10, str(result)[:200]
    assert (result["end_line"], result["next_offset"]) == (10, 10)


def test_read_of_a_big_sparse_file_is_refused_with_bounded_memory(
    service: ServiceProcess, client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    result = _bounded(service, lambda: _post(client, sandbox, "read", file_path=f"{sandbox['root']}/sparse", limit=10))
    assert result["error"] == p.FILE_TOO_LARGE, str(result)[:200]


def test_the_client_streams_what_the_service_does_not_answer_inline(
    service: ServiceProcess, sandbox: dict[str, Any]
) -> None:
    config = ClientConfig(url=service.url, api_key=KEYS["alice"], max_download_bytes=64 << 20)
    with SandboxClient(config=config) as remote_client:
        remote = remote_client.attach(sandbox["id"])
        mid, sparse = _bounded(
            service, lambda: remote.download_files([f"{sandbox['root']}/mid", f"{sandbox['root']}/sparse"])
        )
    assert mid.error is None, mid
    assert mid.content is not None
    assert hashlib.sha256(mid.content).hexdigest() == sandbox["mid_sha256"]
    assert (sparse.error, sparse.content) == (p.FILE_TOO_LARGE, None), sparse


async def test_the_async_client_streams_them_too(service: ServiceProcess, sandbox: dict[str, Any]) -> None:
    config = ClientConfig(url=service.url, api_key=KEYS["alice"], max_download_bytes=64 << 20)
    async with AsyncSandboxClient(config=config) as remote_client:
        remote = remote_client.attach(sandbox["id"])
        mid, sparse = await remote.adownload_files([f"{sandbox['root']}/mid", f"{sandbox['root']}/sparse"])
    assert mid.content is not None, mid
    assert hashlib.sha256(mid.content).hexdigest() == sandbox["mid_sha256"]
    assert (sparse.error, sparse.content) == (p.FILE_TOO_LARGE, None), sparse


def test_a_batch_is_bounded_in_all_and_the_client_streams_the_rest(
    service: ServiceProcess, client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    """A 200 kB file comes inline alone; forty of it are over four times the inline bound
    together, so each gets its share (under 200 kB) and answers ``file_too_large``, and the
    client streams them."""
    [alone] = _post(client, sandbox, "download", paths=[f"{sandbox['root']}/small"])
    assert alone["error"] is None, alone
    paths = [f"{sandbox['root']}/small"] * 40
    items = _bounded(service, lambda: _post(client, sandbox, "download", paths=paths))
    assert {item["error"] for item in items} == {p.FILE_TOO_LARGE}
    config = ClientConfig(url=service.url, api_key=KEYS["alice"])
    with SandboxClient(config=config) as remote_client:
        found = remote_client.attach(sandbox["id"]).download_files(paths)
    assert {hashlib.sha256(item.content or b"").hexdigest() for item in found} == {sandbox["small_sha256"]}
