"""The HTTP routes of a sandbox's state, version 1: pause and resume (`sandboxes.server.
pausing`). A table of their own beside `sandboxes.server.routes`', joined into the app's one."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from sandboxes import api
from sandboxes.server import routes
from sandboxes.server.routes import Authed, service_of

__all__ = ["router"]

_PAUSE_ERRORS: dict[int | str, dict[str, Any]] = {
    501: {"model": api.ErrorBody, "description": "The sandbox's backend cannot pause it (`unavailable`)"},
}
router = APIRouter(
    prefix=api.API_PREFIX, route_class=routes.router.route_class, responses=dict(routes.router.responses)
)
"""Bodies parsed and failures documented as every ``/v1`` route's (`sandboxes.server.routes.router`)."""


@router.post("/sandboxes/{sandbox_id}/pause", response_model=api.SandboxInfo, responses=_PAUSE_ERRORS)
async def pause_sandbox(
    request: Request, sandbox_id: str, tenant: Authed, body: api.PauseSandbox | None = None
) -> api.SandboxInfo:
    """Freeze every process of the sandbox where it is; its files, memory, id and tokens stay."""
    registry = service_of(request).registry
    entry = await registry.pause(await registry.find(tenant, sandbox_id), (body or api.PauseSandbox()).ttl)
    return entry.info()


@router.post("/sandboxes/{sandbox_id}/resume", response_model=api.SandboxInfo, responses=_PAUSE_ERRORS)
async def resume_sandbox(request: Request, sandbox_id: str, tenant: Authed) -> api.SandboxInfo:
    """Let a paused sandbox's processes run again (one that runs already: as it is)."""
    registry = service_of(request).registry
    return (await registry.resume(await registry.find(tenant, sandbox_id))).info()
