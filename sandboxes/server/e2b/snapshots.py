"""E2B's snapshots and fork (``/e2b``) on the service's own (`sandboxes.server.keeping`): a
snapshot keeps the sandbox's workspace in the tenant's snapshot store, counted against its
``max_snapshot_bytes``; a create naming it as its template (`sandboxes.server.e2b.control`)
makes a sandbox with its files, counted against the tenant's quota as any create; E2B deletes
one as a template. A fork is one snapshot restored into each new sandbox at once, each
answered on its own (a sandbox, or the error that stopped it), the snapshot deleted after.
Files only: processes and their memory are not kept, and a snapshot asked to keep them is
refused."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse

from sandboxes import api
from sandboxes.server.e2b.common import PREFIX, E2BRoute, e2b_error, e2b_state, service
from sandboxes.server.e2b.control import MAX_PAGE, NEXT_PAGE_HEADER, _ApiKey, _body, _created, _tenant
from sandboxes.server.e2b.models import ForkRequest, SnapshotRequest
from sandboxes.server.e2b.snapshot_refs import bare, referred, snapshot_json, visible
from sandboxes.server.errors import ServiceError
from sandboxes.server.registry import Entry

__all__ = ["router"]

logger = logging.getLogger(__name__)

router = APIRouter(prefix=PREFIX, route_class=E2BRoute, include_in_schema=False)

FILES_ONLY = (
    "this service's snapshots keep a sandbox's files, not its processes or their memory: "
    "take it with mode='filesystem' (memory: false)"
)


@router.post("/sandboxes/{sandbox_id}/snapshots")
async def create_snapshot(request: Request, sandbox_id: str, api_key: _ApiKey = None) -> Response:
    """The sandbox's workspace kept as a snapshot (201, E2B's ``SnapshotInfo``); it runs on."""
    tenant = _tenant(request, api_key)
    body = await _body(request, SnapshotRequest, empty=True)
    if body.memory:
        return e2b_error(400, FILES_ONLY)
    registry = service(request).registry
    entry = await registry.awake(await registry.find(tenant, sandbox_id))
    snapshot = await registry.snapshot(entry, api.CreateSnapshot(), name=body.name or "")
    return JSONResponse(snapshot_json(snapshot), status_code=201)


@router.get("/snapshots")
async def list_snapshots(
    request: Request,
    api_key: _ApiKey = None,
    sandbox_id: Annotated[str | None, Query(alias="sandboxID", max_length=256)] = None,
    name: Annotated[str | None, Query(max_length=512)] = None,
    next_token: Annotated[str | None, Query(alias="nextToken", pattern="^[0-9]{1,9}$")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
) -> Response:
    """The tenant's snapshots, newest first, of one sandbox or one name (or id) if asked; a page
    of ``limit``, and ``x-next-token`` while more remain."""
    kept = await visible(request, _tenant(request, api_key))
    if sandbox_id:
        kept = [snapshot for snapshot in kept if snapshot.sandbox_id == sandbox_id]
    kept = referred(kept, name) if name else kept[::-1]
    start = int(next_token or 0)
    headers = {NEXT_PAGE_HEADER: str(start + limit)} if start + limit < len(kept) else None
    return JSONResponse([snapshot_json(snapshot) for snapshot in kept[start : start + limit]], headers=headers)


@router.delete("/templates/{template_id}")
async def delete_template(request: Request, template_id: str, api_key: _ApiKey = None) -> Response:
    """The tenant's snapshot of that id, or all of that name, deleted (204); 404 if none (the
    SDK's ``delete_snapshot`` answers ``False``). The service's templates are its operator's."""
    tenant = _tenant(request, api_key)
    found = referred(await visible(request, tenant), template_id)
    if not found:
        if e2b_state(request).ours(bare(template_id)) in service(request).settings.templates:
            return e2b_error(403, f"template {template_id!r} is the service's (its configuration): not deleted")
        return e2b_error(404, f"no snapshot {template_id!r}")
    store = service(request).registry.snapshots
    for snapshot in found:
        with contextlib.suppress(ServiceError):  # deleted meanwhile: gone all the same
            await asyncio.to_thread(functools.partial(store.delete, tenant.id, snapshot.id, wait=False))
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/fork")
async def fork(request: Request, sandbox_id: str, api_key: _ApiKey = None) -> Response:
    """``count`` new sandboxes with this one's files, each living ``timeout`` seconds; one
    result each (201), a sandbox or the error that stopped it. This one runs on, untouched."""
    tenant = _tenant(request, api_key)
    body = await _body(request, ForkRequest, empty=True)
    registry = service(request).registry
    entry = await registry.awake(await registry.find(tenant, sandbox_id))
    snapshot = await registry.snapshot(entry, api.CreateSnapshot())
    state = entry.state
    wanted = api.CreateSandbox(
        template=state.template,
        env=dict(state.env),
        ttl=max(1, body.timeout),
        labels=dict(state.labels),
        auto_resume=state.auto_resume,
        snapshot=snapshot.id,  # with its network as it is now (`sandboxes.server.inherited`)
    )
    try:
        creates = [registry.create(tenant, wanted) for _ in range(body.count)]
        made = await asyncio.gather(*creates, return_exceptions=True)
    finally:
        with contextlib.suppress(ServiceError, OSError):
            await asyncio.to_thread(functools.partial(registry.snapshots.delete, tenant.id, snapshot.id, wait=False))
    return JSONResponse([_outcome(request, sandbox_id, result) for result in made], status_code=201)


def _outcome(request: Request, source: str, result: tuple[Entry, bool] | BaseException) -> dict[str, Any]:
    """E2B's ``SandboxForkResult``: the new sandbox, or the error that stopped it."""
    if isinstance(result, ServiceError):
        return {"error": {"code": result.status, "message": result.message}}
    if isinstance(result, Exception):
        logger.warning("a fork of sandbox %s failed: %s", source, result, exc_info=result)
        return {"error": {"code": 500, "message": f"a fork of sandbox {source} could not be made"}}
    if isinstance(result, BaseException):
        raise result
    return {"sandbox": _created(request, result[0]).model_dump(by_alias=True, exclude_none=True)}
