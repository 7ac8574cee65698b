"""The file-watch routes (`sandboxes.server.watches`): a streamed watch of a directory of the
sandbox as NDJSON of `api.WatchEvent`, and polled watchers, created, drained and removed."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request, Response
from fastapi.responses import StreamingResponse

from sandboxes import api
from sandboxes.server.routes import _NDJSON, Authed, _entry, _ndjson, api_router

__all__ = ["router"]

router = api_router()

_AbsolutePath = Annotated[str, Query(min_length=1, json_schema_extra={"pattern": api.SANDBOX_PATH})]
"""An absolute directory in the sandbox."""

_Lifetime = Annotated[
    float | None,
    Query(
        gt=0,
        le=86_400,
        description="Seconds after which the watch ends by itself (an `end` event whose error is `timeout`); "
        "none: until the client leaves.",
    ),
]


@router.get("/sandboxes/{sandbox_id}/watch", response_class=StreamingResponse, responses=_NDJSON)
async def watch_stream(
    request: Request,
    sandbox_id: str,
    tenant: Authed,
    path: _AbsolutePath,
    recursive: bool = False,
    timeout: _Lifetime = None,  # noqa: ASYNC109 - the watch's lifetime, not a wait here
) -> Response:
    """Watch a directory of the sandbox: NDJSON of `api.WatchEvent` (`sandboxes.server.watches`)."""
    svc, entry = await _entry(request, tenant, sandbox_id)
    cap, keepalive = svc.settings.policy_for(tenant.id).max_watchers, svc.settings.stream_keepalive
    return _ndjson(await svc.watches.stream(tenant.id, cap, entry.sandbox, path, recursive, keepalive, timeout))


@router.post("/sandboxes/{sandbox_id}/watchers", status_code=201, response_model=api.WatcherInfo)
async def create_watcher(request: Request, sandbox_id: str, body: api.CreateWatcher, tenant: Authed) -> api.WatcherInfo:
    svc, entry = await _entry(request, tenant, sandbox_id)
    cap = svc.settings.policy_for(tenant.id).max_watchers
    return await svc.watches.create(tenant.id, cap, sandbox_id, entry.sandbox, body, svc.settings.watcher_idle)


@router.get(
    "/sandboxes/{sandbox_id}/watchers/{watcher_id}/events",
    response_model=api.WatcherEvents,
    response_model_exclude_none=True,
)
async def watcher_events(request: Request, sandbox_id: str, watcher_id: str, tenant: Authed) -> api.WatcherEvents:
    svc = (await _entry(request, tenant, sandbox_id))[0]  # the tenant's sandbox, or 404
    return svc.watches.drain(tenant.id, sandbox_id, watcher_id, svc.settings.watcher_idle)


@router.delete("/sandboxes/{sandbox_id}/watchers/{watcher_id}", status_code=204, response_class=Response)
async def remove_watcher(request: Request, sandbox_id: str, watcher_id: str, tenant: Authed) -> Response:
    (await _entry(request, tenant, sandbox_id))[0].watches.remove(tenant.id, sandbox_id, watcher_id)
    return Response(status_code=204)
