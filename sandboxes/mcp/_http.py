"""`mount`: the MCP server over streamable HTTP at ``/mcp`` of an ASGI app that serves the
sandboxes' public API, whose tool calls are requests to that same app, in process (an httpx
ASGI transport), with the key of the HTTP request that carried the call: every rule of the API
(keys, tenants, quotas, rate limits, sizes) applies to them as to any client's.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
from starlette.applications import Starlette

from sandboxes.client import AsyncSandboxClient
from sandboxes.mcp._access import Ctx
from sandboxes.mcp._tools import build_server

__all__ = ["PATH", "SANDBOX_HEADER", "mount"]

PATH = "/mcp"
SANDBOX_HEADER = "x-sandbox-id"
"""A request header naming the sandbox its calls act on when they name none and the session bound none."""

_AUTHORIZATION: contextvars.ContextVar[str | None] = contextvars.ContextVar("sandboxes_mcp_authorization", default=None)
"""The ``Authorization`` header of the HTTP request that carried the tool call being served."""


class _AsCaller(httpx.AsyncBaseTransport):
    """Sends each request to ``app`` in process with the ``Authorization`` of the current call."""

    def __init__(self, app: Any) -> None:
        self._inner = httpx.ASGITransport(app=app, raise_app_exceptions=False)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        authorization = _AUTHORIZATION.get()
        if authorization is None:
            request.headers.pop("authorization", None)
        else:
            request.headers["authorization"] = authorization
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _CallerAccess:
    """The caller's key from the request that carried the call; the default sandbox from its
    `SANDBOX_HEADER`."""

    def __init__(self, app: Any) -> None:
        self._client = AsyncSandboxClient("http://in-process", None, retries=2, transport=_AsCaller(app))

    def client(self, ctx: Ctx) -> AsyncSandboxClient:
        request = ctx.request_context.request
        _AUTHORIZATION.set(None if request is None else request.headers.get("authorization"))
        return self._client

    def default_sandbox(self, ctx: Ctx) -> str | None:
        request = ctx.request_context.request
        found: str | None = None if request is None else request.headers.get(SANDBOX_HEADER)
        return found

    async def aclose(self) -> None:
        await self._client.aclose()


def mount(app: Starlette, **options: Any) -> Callable[[], AbstractAsyncContextManager[None]]:
    """Serve MCP at `PATH` of ``app`` (which must authenticate `PATH` itself, as it does its
    API); what runs the sessions while ``app`` lives, for its lifespan to enter."""
    access = _CallerAccess(app)
    server = build_server(access, streamable_http_path=PATH, **options)
    app.router.routes.extend(server.streamable_http_app().routes)

    @contextlib.asynccontextmanager
    async def running() -> AsyncIterator[None]:
        try:
            async with server.session_manager.run():
                yield
        finally:
            await access.aclose()

    return running
