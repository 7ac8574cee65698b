"""What a tenant may learn of the service beside its sandboxes: the templates it may create from
(``GET /v1/templates``); and, for an operator's key only (`ServiceSettings.operators`), every
tenant's usage against its quotas, the templates and the service's health
(``GET /v1/operator/overview``), as the web console's operator page shows them."""

from __future__ import annotations

from fastapi import Request

from sandboxes import api
from sandboxes.server.auth import Tenant
from sandboxes.server.errors import ServiceError
from sandboxes.server.routes import Authed, Service, api_router, service_of
from sandboxes.templates import parse_memory

__all__ = ["router"]

router = api_router()


def _templates(svc: Service) -> list[api.TemplateInfo]:
    return [
        api.TemplateInfo(name=name, backend=t.backend, cpus=t.cpus, memory=t.memory, ttl=t.ttl)
        for name, t in sorted(svc.settings.templates.items())
    ]


@router.get("/templates", response_model=api.TemplateList)
async def list_templates(request: Request, tenant: Authed) -> api.TemplateList:
    return api.TemplateList(templates=_templates(service_of(request)))


@router.get("/operator/overview", response_model=api.Overview, responses={403: {"model": api.ErrorBody}})
async def overview(request: Request, tenant: Authed) -> api.Overview:
    svc = service_of(request)
    if tenant.id not in svc.settings.operators:
        raise ServiceError("permission_denied", "this key is not an operator's (settings: operators)")
    names = sorted({*svc.settings.api_keys.values(), *svc.settings.tenants})
    usages = [await _usage(svc, Tenant(name, svc.settings.policy_for(name))) for name in names]
    health = api.Health(status="unavailable" if svc.draining or not svc.registry.ready else "ready")
    return api.Overview(tenants=usages, templates=_templates(svc), health=health)


async def _usage(svc: Service, tenant: Tenant) -> api.TenantUsage:
    entries = await svc.registry.list(tenant)
    policy = tenant.policy
    return api.TenantUsage(
        tenant=tenant.id,
        sandboxes=len(entries),
        cpus=sum(entry.state.cpus for entry in entries),
        memory=sum(entry.state.memory for entry in entries),
        max_sandboxes=policy.max_sandboxes,
        max_cpus=policy.max_cpus,
        max_memory=parse_memory(policy.max_memory),
    )
