"""The service's own ``/mcp`` (streamable HTTP, on when ``settings.mcp``) through the official SDK's
client: tenant keys as bearer tokens, and every tool call a request of the public API as that
tenant, so the API's keys, tenants and quotas hold for it (uvicorn on 127.0.0.1, local sandboxes)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from mcp_episode import create, every_tool, http_session, ok, refused
from server.service_harness import KEYS, UNTHROTTLED, Running, running, settings_for
from support import HAS_BWRAP

pytestmark = pytest.mark.needs(HAS_BWRAP, "the local backend needs bubblewrap")

_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
_STREAMS = {"Accept": "application/json, text/event-stream"}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    settings = settings_for(tmp_path_factory.mktemp("mcp-http"), tenants=UNTHROTTLED, mcp=True)
    with running(settings) as svc:
        yield svc


async def test_every_tool_over_streamable_http(service: Running) -> None:
    async with http_session(f"{service.url}/mcp", KEYS["alice"]) as session:
        await every_tool(session)


def test_mcp_needs_a_tenants_key(service: Running) -> None:
    with httpx.Client(base_url=service.url, headers=_STREAMS) as http:
        missing = http.post("/mcp", json=_INITIALIZE)
        wrong = http.post("/mcp", json=_INITIALIZE, headers={"Authorization": "Bearer nope"})
        good = http.post("/mcp", json=_INITIALIZE, headers={"Authorization": f"Bearer {KEYS['alice']}"})
    for refusal in (missing, wrong):
        assert refusal.status_code == 401, refusal.text
        assert refusal.json()["error"] == "unauthorized"
        assert refusal.headers["www-authenticate"] == "Bearer"
    assert good.status_code == 200, good.text
    assert good.headers["mcp-session-id"]


def test_mcp_is_off_unless_configured(tmp_path_factory: pytest.TempPathFactory) -> None:
    with running(settings_for(tmp_path_factory.mktemp("mcp-off"))) as off, off.client("alice") as http:
        assert http.post("/mcp", json=_INITIALIZE, headers=_STREAMS).status_code == 404


async def test_calls_are_the_tenants_own(service: Running) -> None:
    """Another tenant's sandbox is not found, whichever way it is named; a tenant's quota holds."""
    async with http_session(f"{service.url}/mcp", KEYS["alice"]) as alice:
        sandbox_id = await create(alice)
        try:
            async with http_session(f"{service.url}/mcp", KEYS["bob"]) as bob:
                assert (await refused(bob, "use_sandbox", sandbox_id=sandbox_id)).startswith("error: not_found: ")
                assert (await refused(bob, "ls", sandbox_id=sandbox_id)).startswith("error: not_found: ")
                assert sandbox_id not in await ok(bob, "list_sandboxes")
            async with http_session(f"{service.url}/mcp", KEYS["bob"], **{"X-Sandbox-Id": sandbox_id}) as bob:
                assert (await refused(bob, "execute", command="true")).startswith("error: not_found: ")
        finally:
            await ok(alice, "destroy_sandbox")
    async with http_session(f"{service.url}/mcp", KEYS["tiny"]) as tiny:
        await create(tiny)
        assert (await refused(tiny, "create_sandbox")).startswith("error: quota_exceeded: ")
        await ok(tiny, "destroy_sandbox")


async def test_a_header_names_the_sessions_sandbox(service: Running) -> None:
    with service.client("alice") as http:
        created = http.post("/v1/sandboxes", json={"template": "default"}).json()
    try:
        async with http_session(f"{service.url}/mcp", KEYS["alice"], **{"X-Sandbox-Id": created["id"]}) as session:
            assert (await ok(session, "execute", command="echo by-header")).startswith("by-header\n")
    finally:
        with service.client("alice") as http:
            http.delete(f"/v1/sandboxes/{created['id']}")
