"""The HTTP routes of a sandbox's state, version 1: pause and resume (`sandboxes.server.
pausing`), snapshots and forks (`sandboxes.server.keeping`). A table of their own beside
`sandboxes.server.routes`', joined into the app's one."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response

from sandboxes import api
from sandboxes.server import idempotency, routes
from sandboxes.server.keeping import snapshot_info
from sandboxes.server.routes import Authed, service_of

__all__ = ["router"]

_PAUSE_ERRORS: dict[int | str, dict[str, Any]] = {
    501: {
        "model": api.ErrorBody,
        "description": "The sandbox's backend cannot pause it, or hibernate it keeping its processes' memory "
        "(`unavailable`)",
    },
}
_QUOTA: dict[int | str, dict[str, Any]] = {
    403: {"model": api.ErrorBody, "description": "Over the tenant's snapshot bytes (`quota_exceeded`)"},
}
router = APIRouter(
    prefix=api.API_PREFIX, route_class=routes.router.route_class, responses=dict(routes.router.responses)
)
"""Bodies parsed and failures documented as every ``/v1`` route's (`sandboxes.server.routes.router`)."""


@router.post("/sandboxes/{sandbox_id}/pause", response_model=api.SandboxInfo, responses=_PAUSE_ERRORS)
async def pause_sandbox(
    request: Request, sandbox_id: str, tenant: Authed, body: api.PauseSandbox | None = None
) -> api.SandboxInfo:
    """Freeze every process of the sandbox where it is (files, memory, id and tokens stay), or
    hibernate it: its files kept in a snapshot, its processes ended (``processes_kept: false``)."""
    registry = service_of(request).registry
    body = body or api.PauseSandbox()
    entry = await registry.find(tenant, sandbox_id)
    if body.mode == "hibernate":
        return (await registry.hibernate(entry, body.ttl, body.memory)).info()
    return (await registry.pause(entry, body.ttl)).info()


@router.post("/sandboxes/{sandbox_id}/resume", response_model=api.SandboxInfo, responses=_PAUSE_ERRORS)
async def resume_sandbox(request: Request, sandbox_id: str, tenant: Authed) -> api.SandboxInfo:
    """Let a paused sandbox's processes run again (one that runs already: as it is)."""
    registry = service_of(request).registry
    return (await registry.resume(await registry.find(tenant, sandbox_id))).info()


@router.post("/sandboxes/{sandbox_id}/snapshots", status_code=201, response_model=api.SnapshotInfo, responses=_QUOTA)
async def take_snapshot(
    request: Request, sandbox_id: str, tenant: Authed, body: api.CreateSnapshot
) -> api.SnapshotInfo:
    """Keep the sandbox's workspace (and ``paths``) in the snapshot store, with its manifest."""
    registry = service_of(request).registry
    entry = await registry.awake(await registry.find(tenant, sandbox_id))
    return snapshot_info(await registry.snapshot(entry, body))


@router.get("/snapshots", response_model=api.SnapshotList)
async def list_snapshots(request: Request, tenant: Authed) -> api.SnapshotList:
    store = service_of(request).registry.snapshots
    return api.SnapshotList(snapshots=[snapshot_info(s) for s in await asyncio.to_thread(store.of_tenant, tenant.id)])


@router.get("/snapshots/{snapshot_id}", response_model=api.SnapshotInfo)
async def get_snapshot(request: Request, snapshot_id: str, tenant: Authed) -> api.SnapshotInfo:
    store = service_of(request).registry.snapshots
    return snapshot_info(await asyncio.to_thread(store.get, tenant.id, snapshot_id))


@router.delete("/snapshots/{snapshot_id}", status_code=204, response_class=Response)
async def delete_snapshot(request: Request, snapshot_id: str, tenant: Authed) -> Response:
    await asyncio.to_thread(service_of(request).registry.snapshots.delete, tenant.id, snapshot_id)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/fork", status_code=201, response_model=api.ForkResult, responses=_QUOTA)
async def fork_sandbox(
    request: Request,
    sandbox_id: str,
    tenant: Authed,
    body: api.ForkSandbox,
    idempotency_key: Annotated[
        str | None, Header(description=idempotency.DESCRIPTION, json_schema_extra={"pattern": idempotency.KEY_PATTERN})
    ] = None,
) -> api.ForkResult:
    """``count`` new sandboxes with this one's workspace: one snapshot, restored into each at once."""
    registry = service_of(request).registry
    entry = await registry.awake(await registry.find(tenant, sandbox_id))
    snapshot, made = await registry.fork(tenant, entry, body.count, idempotency_key)
    return api.ForkResult(snapshot=snapshot.id, sandboxes=[child.info() for child in made])
