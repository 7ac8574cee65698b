"""The HTTP routes of what a sandbox uses and keeps beside its protocol: its usage samples
(`sandboxes.server.usage`). Part of the one route table (`sandboxes.server.app` adds them
beside `sandboxes.server.routes`'), authenticated and rate-checked the same way."""

from __future__ import annotations

from fastapi import APIRouter, Request

from sandboxes import api
from sandboxes.server.routes import Authed, _errors, _Route, service_of
from sandboxes.server.usage import Sampler

__all__ = ["router"]

router = APIRouter(prefix=api.API_PREFIX, route_class=_Route, responses=_errors(401, 404, 413, 422, 429, 503))


def _sampler(request: Request) -> Sampler:
    sampler: Sampler = request.app.state.usage
    return sampler


@router.get("/sandboxes/{sandbox_id}/metrics", response_model=api.SandboxMetrics)
async def sandbox_metrics(request: Request, sandbox_id: str, tenant: Authed) -> api.SandboxMetrics:
    """The samples of the sandbox's usage kept so far, oldest first (none before its exec
    helper first ran)."""
    entry = await service_of(request).registry.find(tenant, sandbox_id)
    return _sampler(request).samples(entry.state.id)
