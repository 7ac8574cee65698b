"""File watches through the service over real HTTP (a uvicorn service, the local backend): the
streamed watch (NDJSON, keep-alives while quiet) and polled watchers (drained, bounded per
tenant, removed when nobody polls them), raw and through the Python client, sync and async."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import KEYS, POLICIES, Running, create, error_of, execute, running, settings_for
from support import HAS_BWRAP, needs, wait_for

from sandboxes.api import WatchEvent
from sandboxes.client import AsyncSandboxClient, SandboxClient
from sandboxes.client.errors import OperationFailed, RateLimited
from sandboxes.server.settings import TenantPolicy

pytestmark = pytest.mark.needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")

CAP = 3


def _settings(tmp: Path, **overrides: Any) -> Any:
    tenants = {**POLICIES, "alice": TenantPolicy(max_watchers=CAP)}
    return settings_for(tmp, tenants=tenants, stream_keepalive=0.3, **overrides)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
    with running(_settings(tmp_path_factory.mktemp("watch"))) as svc:
        yield svc


@pytest.fixture
def client(service: Running) -> Iterator[httpx.Client]:
    with service.client() as http:
        yield http


@pytest.fixture
def sandbox(client: httpx.Client) -> Iterator[dict[str, Any]]:
    created = create(client, template="default")
    yield created
    client.delete(f"/v1/sandboxes/{created['id']}")


def _lines(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line.strip():
            yield json.loads(line)


def _held(service: Running, tenant: str = "alice") -> int:
    return int(service.app.state.service.watches._open.get(tenant, 0))


def test_a_streamed_watch_sends_events_and_keepalives(
    service: Running, client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    params = {"path": sandbox["workdir"], "recursive": "true"}
    with client.stream("GET", f"/v1/sandboxes/{sandbox['id']}/watch", params=params) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = _lines(response)
        assert next(lines) == {"type": "start"}
        assert next(lines) == {"type": "keepalive"}  # nothing happened for the keep-alive interval
        assert execute(client, sandbox["id"], "mkdir -p d && echo x > d/f")["exit_code"] == 0
        seen = []
        for line in lines:
            seen.append(line)
            if line == {"type": "create", "name": "d/f"}:
                break
        assert {"type": "create", "name": "d"} in seen
        assert _held(service) == 1
    wait_for(lambda: _held(service) == 0, "a stream whose client left still counts as a watch")


def test_a_watch_of_a_missing_directory_is_refused_with_its_code(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    missing = f"{sandbox['workdir']}/nowhere"
    response = client.get(f"/v1/sandboxes/{sandbox['id']}/watch", params={"path": missing})
    assert response.status_code == 404
    assert error_of(response) == "file_not_found"
    response = client.post(f"/v1/sandboxes/{sandbox['id']}/watchers", json={"path": missing})
    assert response.status_code == 404
    assert error_of(response) == "file_not_found"
    response = client.post(f"/v1/sandboxes/{sandbox['id']}/watchers", json={"path": "relative"})
    assert error_of(response) == "invalid_path"


def test_polled_watchers_are_drained_bounded_per_tenant_and_private(
    service: Running, client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    base = f"/v1/sandboxes/{sandbox['id']}/watchers"
    ids = []
    for _ in range(CAP):
        response = client.post(base, json={"path": sandbox["workdir"]})
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    refused = client.post(base, json={"path": sandbox["workdir"]})
    assert refused.status_code == 429
    assert error_of(refused) == "rate_limited"
    assert execute(client, sandbox["id"], "echo x > new.txt")["exit_code"] == 0
    seen: list[dict[str, Any]] = []

    def drained() -> bool:
        answer = client.get(f"{base}/{ids[0]}/events")
        assert answer.status_code == 200, answer.text
        seen.extend(answer.json()["events"])
        return {"type": "create", "name": "new.txt"} in seen

    wait_for(drained, "the polled watcher never reported the new file")
    assert client.get(f"{base}/{ids[0]}/events").json() == {"events": [], "ended": False}  # drained
    with service.client("bob") as bob:
        assert bob.get(f"{base}/{ids[0]}/events").status_code == 404  # another tenant's sandbox
    assert client.delete(f"{base}/{ids[0]}").status_code == 204
    assert client.get(f"{base}/{ids[0]}/events").status_code == 404
    again = client.post(base, json={"path": sandbox["workdir"]})
    assert again.status_code == 201  # a slot came free
    for ident in [*ids[1:], again.json()["id"]]:
        assert client.delete(f"{base}/{ident}").status_code == 204


def test_a_watcher_nobody_polls_is_removed(tmp_path: Path) -> None:
    with running(_settings(tmp_path, watcher_idle=0.5)) as service, service.client() as http:
        sandbox = create(http, template="default")
        response = http.post(f"/v1/sandboxes/{sandbox['id']}/watchers", json={"path": sandbox["workdir"]})
        assert response.status_code == 201, response.text
        assert _held(service) == 1
        wait_for(lambda: _held(service) == 0, "an idle watcher was never removed", limit=10)
        events = http.get(f"/v1/sandboxes/{sandbox['id']}/watchers/{response.json()['id']}/events")
        assert events.status_code == 404


def test_the_client_watches_streamed_and_polled(service: Running, sandbox: dict[str, Any]) -> None:
    with SandboxClient(service.url, KEYS["alice"]) as sdk:
        remote = sdk.attach(sandbox["id"])
        workdir = sandbox["workdir"]
        with remote.watch(workdir, recursive=True) as stream:
            remote.write(f"{workdir}/a.txt", "hello")
            for event in stream:
                if event == WatchEvent(type="create", name="a.txt"):
                    break
        watcher = remote.create_watcher(workdir)
        remote.write(f"{workdir}/b.txt", "x")
        seen: list[WatchEvent] = []
        wait_for(
            lambda: (
                bool(seen.extend(remote.watcher_events(watcher).events))
                or WatchEvent(type="create", name="b.txt") in seen
            ),
            "no event for b.txt",
        )
        remote.remove_watcher(watcher)
        with pytest.raises(OperationFailed) as missing:
            remote.watch(f"{workdir}/nowhere")
        assert missing.value.code == "file_not_found"


def test_the_async_client_watches(service: Running, sandbox: dict[str, Any]) -> None:
    async def scenario() -> list[WatchEvent]:
        async with AsyncSandboxClient(service.url, KEYS["alice"]) as sdk:
            remote = sdk.attach(sandbox["id"])
            seen = []
            async with await remote.awatch(sandbox["workdir"]) as stream:
                await remote.awrite(f"{sandbox['workdir']}/c.txt", "x")
                async for event in stream:
                    seen.append(event)
                    if event.name == "c.txt":
                        break
            watcher = await remote.acreate_watcher(sandbox["workdir"])
            assert (await remote.awatcher_events(watcher)).events == []
            await remote.aremove_watcher(watcher)
            return seen

    assert asyncio.run(asyncio.wait_for(scenario(), 60))[-1] == WatchEvent(type="create", name="c.txt")


def test_the_tenants_bound_counts_streams_too(service: Running, client: httpx.Client, sandbox: dict[str, Any]) -> None:
    wait_for(lambda: _held(service) == 0, "an earlier test's watches are still open")
    with SandboxClient(service.url, KEYS["alice"], retries=0) as sdk:
        remote = sdk.attach(sandbox["id"])
        streams = [remote.watch(sandbox["workdir"]) for _ in range(CAP)]
        with pytest.raises(RateLimited):
            remote.create_watcher(sandbox["workdir"])
        for stream in streams:
            stream.close()
        wait_for(lambda: _held(service) == 0, "closed streams still count")


def test_a_streamed_watch_with_a_timeout_ends_by_itself(
    service: Running, client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    """A watch asked to last ``timeout`` seconds ends with an ``end`` event and frees its slot,
    through the raw API and the client, sync and async."""
    params = {"path": sandbox["workdir"], "timeout": "0.5"}
    with client.stream("GET", f"/v1/sandboxes/{sandbox['id']}/watch", params=params) as response:
        types = [line["type"] for line in _lines(response)]  # ends by itself: this would hang otherwise
    assert types[0] == "start"
    assert types[-1] == "end"
    with (
        SandboxClient(service.url, KEYS["alice"]) as sdk,
        sdk.attach(sandbox["id"]).watch(sandbox["workdir"], timeout=0.5) as stream,
    ):
        assert list(stream) == []
        assert (stream.ended, stream.error) == (True, "timeout")

    async def scenario() -> tuple[bool, str | None]:
        async with (
            AsyncSandboxClient(service.url, KEYS["alice"]) as sdk,
            await sdk.attach(sandbox["id"]).awatch(sandbox["workdir"], timeout=0.5) as stream,
        ):
            assert [event async for event in stream] == []
            return stream.ended, stream.error

    assert asyncio.run(asyncio.wait_for(scenario(), 30)) == (True, "timeout")
    wait_for(lambda: _held(service) == 0, "a watch that ended still counts")


def test_a_watch_timeout_out_of_range_is_refused(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    for timeout in ("0", "-1", "86401", "soon"):
        params = {"path": sandbox["workdir"], "timeout": timeout}
        response = client.get(f"/v1/sandboxes/{sandbox['id']}/watch", params=params)
        assert response.status_code == 422, (timeout, response.text)


def test_a_path_with_a_nul_byte_is_refused_as_an_invalid_path(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    """Found by schemathesis: it answered 400 ``backend_error`` (embedded null byte)."""
    bad = f"{sandbox['workdir']}/a\u0000b"
    response = client.post(f"/v1/sandboxes/{sandbox['id']}/watchers", json={"path": bad})
    assert (response.status_code, error_of(response)) == (422, "invalid_path"), response.text
    response = client.get(f"/v1/sandboxes/{sandbox['id']}/watch", params={"path": bad})
    assert (response.status_code, error_of(response)) == (422, "invalid_path"), response.text
