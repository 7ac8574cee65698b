"""Where a tool call goes: `Access` gives the client of the service for the call's request and
the sandbox a request names by default; the sandbox a session bound (`Bindings`) comes first.

Every call reaches the service through its public API (`sandboxes.client`): the stdio server
with the key it was started with (`FixedAccess`), the service's own ``/mcp`` with the key of the
request that carried the call (`sandboxes.mcp._http`).
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

from mcp.server.fastmcp import Context
from mcp.server.session import ServerSession

from sandboxes.client import AsyncSandboxClient

__all__ = ["Access", "Bindings", "Ctx", "FixedAccess"]

Ctx = Context[ServerSession, Any, Any]
"""A tool call's context: its session, and (over HTTP) the request that carried it."""


class Access(Protocol):
    """The service as one tool call sees it."""

    def client(self, ctx: Ctx) -> AsyncSandboxClient:
        """The client to send this call's requests with, as the caller's tenant."""
        ...

    def default_sandbox(self, ctx: Ctx) -> str | None:
        """The sandbox this call acts on when it names none and its session bound none."""
        ...


class FixedAccess:
    """One client and one default sandbox for every call: a server on stdio serves one user."""

    def __init__(self, client: AsyncSandboxClient, sandbox_id: str | None = None) -> None:
        self._client = client
        self._sandbox_id = sandbox_id

    def client(self, ctx: Ctx) -> AsyncSandboxClient:
        return self._client

    def default_sandbox(self, ctx: Ctx) -> str | None:
        return self._sandbox_id


class Bindings:
    """The sandbox each live session bound (``use_sandbox``, ``create_sandbox``); a session's
    binding goes with the session."""

    def __init__(self) -> None:
        self._bound: weakref.WeakKeyDictionary[ServerSession, str] = weakref.WeakKeyDictionary()

    def get(self, ctx: Ctx) -> str | None:
        return self._bound.get(ctx.session)

    def bind(self, ctx: Ctx, sandbox_id: str) -> None:
        self._bound[ctx.session] = sandbox_id

    def forget(self, ctx: Ctx, sandbox_id: str) -> None:
        """Unbind the session from ``sandbox_id`` if that is the one it bound."""
        if self._bound.get(ctx.session) == sandbox_id:
            del self._bound[ctx.session]
