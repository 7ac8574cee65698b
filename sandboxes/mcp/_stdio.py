"""`run_stdio`: the MCP server on this process's stdin and stdout, for one user's agent, sending
its calls to a sandbox service with one key."""

from __future__ import annotations

import anyio

from sandboxes.client import AsyncSandboxClient
from sandboxes.mcp._access import FixedAccess
from sandboxes.mcp._tools import build_server

__all__ = ["run_stdio"]


def run_stdio(url: str, api_key: str | None, *, sandbox_id: str | None = None) -> None:
    """Serve MCP on stdio until stdin ends; calls go to the service at ``url`` as ``api_key``'s
    tenant, to ``sandbox_id`` when they name no sandbox and the session bound none."""

    async def serve() -> None:
        async with AsyncSandboxClient(url, api_key, retries=2) as client:
            await build_server(FixedAccess(client, sandbox_id)).run_stdio_async()

    anyio.run(serve)
