"""``GET``/``PUT /v1/sandboxes/{id}/egress``: a sandbox's egress allow-list, read and changed
at run time (`sandboxes.server.egress.hub.EgressHub`). A sandbox without egress allows
nothing (``GET`` answers an empty list) and refuses a list (409)."""

from __future__ import annotations

from fastapi import Request

from sandboxes import api
from sandboxes.server.egress.hub import EgressHub
from sandboxes.server.errors import ServiceError
from sandboxes.server.routes import Authed, api_router, service_of

__all__ = ["router"]

router = api_router()


def _hub(request: Request) -> EgressHub:
    hub: EgressHub = request.app.state.egress
    return hub


@router.get("/sandboxes/{sandbox_id}/egress", response_model=api.EgressRules)
async def get_egress(request: Request, sandbox_id: str, tenant: Authed) -> api.EgressRules:
    await service_of(request).registry.find(tenant, sandbox_id)
    allow = _hub(request).allow_list(sandbox_id)
    return api.EgressRules(allow=allow or [])  # without egress (its template has none): nothing


@router.put("/sandboxes/{sandbox_id}/egress", response_model=api.EgressRules)
async def put_egress(request: Request, sandbox_id: str, tenant: Authed, body: api.EgressRules) -> api.EgressRules:
    entry = await service_of(request).registry.find(tenant, sandbox_id)
    try:
        changed = _hub(request).set_allow(sandbox_id, body.allow)
    except ValueError as exc:
        raise ServiceError("invalid_request", f"egress: {exc}") from exc
    if not changed:
        message = f"sandbox {sandbox_id} has no egress (its template has none): no allow-list applies"
        raise ServiceError("invalid_request", message, status=409)
    await service_of(request).registry.record_network(entry)  # across a restart
    return body
