"""The HTTP routes of what a sandbox uses and keeps beside its protocol: its usage samples
(`sandboxes.server.usage`) and the tenant's volumes (`sandboxes.server.volumes`). Part of the
one route table (`sandboxes.server.app` adds them beside `sandboxes.server.routes`'),
authenticated and rate-checked the same way."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response

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


@router.post("/volumes", status_code=201, response_model=api.VolumeInfo, responses=_errors(403, 409, 501))
async def create_volume(request: Request, body: api.CreateVolume, tenant: Authed) -> api.VolumeInfo:
    """A new empty volume of the tenant's, on the template's backend."""
    registry = service_of(request).registry
    return await registry.volumes.create(tenant.id, body, registry.mounted_by)


@router.get("/volumes", response_model=api.VolumeList)
async def list_volumes(request: Request, tenant: Authed) -> api.VolumeList:
    registry = service_of(request).registry
    return api.VolumeList(volumes=await asyncio.to_thread(registry.volumes.infos, tenant.id, registry.mounted_by))


@router.delete("/volumes/{name}", status_code=204, response_class=Response, responses=_errors(409))
async def delete_volume(request: Request, name: str, tenant: Authed) -> Response:
    """The volume and its files, unless a sandbox mounts it (409)."""
    registry = service_of(request).registry
    await registry.volumes.delete(tenant.id, name, registry.mounted_by)
    return Response(status_code=204)
