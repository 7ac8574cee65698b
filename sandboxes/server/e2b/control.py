"""The E2B control plane (``/e2b``): sandboxes created, listed, timed and killed for the tenant
whose API key is ``X-API-KEY``, through the service's registry (its quotas, TTLs, labels and
idempotency keys). An E2B timeout is the sandbox's TTL; its metadata is the sandbox's labels; a
template that names one of the tenant's snapshots (`sandboxes.server.e2b.snapshot_refs`) makes
the sandbox from it, on the snapshot's template."""

from __future__ import annotations

import urllib.parse
from datetime import UTC, datetime
from typing import Annotated, TypeVar

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from sandboxes.api import CreateSandbox
from sandboxes.server.auth import Tenant
from sandboxes.server.e2b.common import ENVD_VERSION, PREFIX, E2BRoute, e2b_error, e2b_state, service
from sandboxes.server.e2b.models import (
    ConnectSandbox,
    Network,
    NetworkUpdate,
    NewSandbox,
    PauseRequest,
    SandboxCreated,
    SandboxDetail,
    TimeoutRequest,
    network_of,
)
from sandboxes.server.e2b.snapshot_refs import find_snapshot
from sandboxes.server.errors import ServiceError
from sandboxes.server.registry import Entry
from sandboxes.templates import parse_memory

__all__ = ["router"]

router = APIRouter(prefix=PREFIX, route_class=E2BRoute, include_in_schema=False)

CLIENT_ID = "sandboxes"
MAX_PAGE = 100
NEXT_PAGE_HEADER = "x-next-token"

_M = TypeVar("_M", bound=BaseModel)
_ApiKey = Annotated[str | None, Header(alias="X-API-KEY")]


def _tenant(request: Request, key: str | None) -> Tenant:
    svc = service(request)
    if not key and not svc.auth.open:
        raise ServiceError("unauthorized", "missing API key: send 'X-API-KEY: <key>'")
    tenant = svc.auth.authenticate(f"Bearer {key}" if key else None)
    request.scope.setdefault("state", {})["tenant"] = tenant.id
    svc.limiter.check(tenant)
    return tenant


async def _body(request: Request, model: type[_M], *, empty: bool = False) -> _M:
    """The request's body as ``model``, read only once the caller is authenticated (a stranger's
    body is never parsed); an empty body is ``{}`` where ``empty``."""
    raw = await request.body()
    return model.model_validate_json(raw if raw or not empty else b"{}")


def _created(request: Request, entry: Entry) -> SandboxCreated:
    e2b = e2b_state(request)
    token = e2b.signer.token(entry.state.tenant, entry.state.id)
    return SandboxCreated(
        template_id=e2b.theirs(entry.state.template),
        sandbox_id=entry.state.id,
        client_id=CLIENT_ID,
        envd_version=ENVD_VERSION,
        envd_access_token=token,
        traffic_access_token=token,
        domain=service(request).settings.preview_domain,
    )


def _detail(request: Request, entry: Entry) -> SandboxDetail:
    template = entry.backend.template
    ends = entry.state.expires_at
    internet, network = _network_now(entry)
    return SandboxDetail(
        **_created(request, entry).model_dump(),
        started_at=_iso(entry.state.created_at),
        end_at=_iso(ends if ends is not None else entry.state.created_at + service(request).settings.max_ttl),
        cpu_count=max(1, round(float(getattr(template, "cpus", 1) or 1))),
        memory_mb=_megabytes(getattr(template, "memory", None)),
        disk_size_mb=0,
        metadata=dict(entry.state.labels),
        state="paused" if entry.state.paused else "running",
        allow_internet_access=internet,
        network=network,
        lifecycle={
            "onTimeout": "kill" if entry.state.on_timeout == "delete" else "pause",
            "autoResume": entry.state.auto_resume,
        },
    )


def _network_now(entry: Entry) -> tuple[bool | None, dict[str, object] | None]:
    """``allowInternetAccess`` and ``network`` as the sandbox is served now (its state: its
    create's, or a later ``update_network``'s or ``PUT .../egress``'s): its egress (`network_of`;
    ``None`` while it is E2B's default, its template's), its own headers as ``rules``, and what
    its create asked of its ports."""
    state = entry.state
    internet, egress = network_of(state.egress_allow)
    network: dict[str, object] = dict(egress or {})
    if state.egress_headers:
        network["rules"] = {host: [{"transform": {"headers": v}}] for host, v in state.egress_headers.items()}
    if state.public_ports is not None:
        network["allowPublicTraffic"] = state.public_ports
    if state.mask_request_host is not None:
        network["maskRequestHost"] = state.mask_request_host
    return internet, network or None


def _megabytes(memory: object) -> int:
    try:
        return parse_memory(str(memory)) >> 20 if memory else 0
    except ValueError:
        return 0


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")


def _json(
    model: SandboxCreated | list[SandboxDetail], status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    if isinstance(model, list):
        content: object = [item.model_dump(by_alias=True, exclude_none=True) for item in model]
    else:
        content = model.model_dump(by_alias=True, exclude_none=True)
    return JSONResponse(content, status_code=status, headers=headers)


@router.post("/sandboxes")
@router.post("/v2/sandboxes")
async def create(
    request: Request,
    api_key: _ApiKey = None,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> Response:
    tenant = _tenant(request, api_key)
    body = await _body(request, NewSandbox)
    e2b = e2b_state(request)
    ttl = max(1, e2b.settings.default_timeout if body.timeout is None else body.timeout)
    network = body.network or Network()
    try:
        egress_allow = body.egress_allow()
        headers = network.headers()
    except ValueError as exc:
        return e2b_error(400, f"network: {exc}")
    template, snapshot = e2b.ours(body.template_id), None
    if template not in service(request).settings.templates:
        snapshot = await find_snapshot(request, tenant, body.template_id)
        if snapshot is None:
            return e2b_error(400, f"unknown template {body.template_id!r}")
        template = snapshot.template
    wanted = CreateSandbox(
        template=template,
        env=body.env_vars or {},
        ttl=ttl,
        labels=body.metadata or {},
        auto_resume=body.auto_resume is not None and body.auto_resume.enabled,
        on_timeout=body.on_timeout(),
        egress_allow=egress_allow,
        snapshot=None if snapshot is None else snapshot.id,
    )
    if headers and not service(request).settings.templates[template].egress:
        return e2b_error(409, f"template {body.template_id!r} has no egress: network rules would transform nothing")
    entry, _ = await service(request).registry.create(tenant, wanted, idempotency_key)
    await _network_named(request, entry, network, headers, egress_allow is not None)
    return _json(_created(request, entry), 201)


async def _network_named(
    request: Request, entry: Entry, network: Network, headers: dict[str, dict[str, str]], allow_named: bool
) -> None:
    """What a create's ``network`` names set on its new sandbox, kept where a pod's labels cannot
    hold it (``headers``: its ``rules``' as parsed); what it leaves out stays as made: the
    defaults, or its snapshot's (`sandboxes.server.inherited`)."""
    if network.rules is not None:
        request.app.state.egress.set_headers(entry.state.id, headers)
    if network.allow_public_traffic is not None:
        entry.state.public_ports = network.allow_public_traffic
    if network.mask_request_host is not None:
        entry.state.mask_request_host = network.mask_request_host
    ports = (network.rules, network.allow_public_traffic, network.mask_request_host)
    if allow_named or any(named is not None for named in ports):  # not recorded: no sandbox left
        await service(request).registry.record_made_network(entry)


@router.get("/sandboxes/{sandbox_id}")
async def get_info(request: Request, sandbox_id: str, api_key: _ApiKey = None) -> Response:
    entry = await service(request).registry.find(_tenant(request, api_key), sandbox_id)
    return _json(_detail(request, entry))


@router.get("/sandboxes")
@router.get("/v2/sandboxes")
async def list_sandboxes(
    request: Request,
    api_key: _ApiKey = None,
    metadata: str | None = None,
    state: str | None = None,
    template: str | None = None,
    started_after: Annotated[datetime | None, Query(alias="startedAfter")] = None,
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",
    next_token: Annotated[str | None, Query(alias="nextToken", pattern="^[0-9]{1,9}$")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = MAX_PAGE,
) -> Response:
    """Newest first unless ``order=asc``; a page of ``limit``, and ``x-next-token`` while more remain."""
    tenant = _tenant(request, api_key)
    entries = await service(request).registry.list(tenant)
    if state is not None:
        states = state.split(",")
        entries = [entry for entry in entries if ("paused" if entry.state.paused else "running") in states]
    wanted = _metadata_filter(metadata)
    e2b = e2b_state(request)
    kept = [
        entry
        for entry in entries
        if all(entry.state.labels.get(key) == value for key, value in wanted.items())
        and (template is None or template in (entry.state.template, e2b.theirs(entry.state.template)))
        and (started_after is None or _started(entry) >= _aware(started_after))
    ]
    kept.sort(key=lambda entry: (entry.state.created_at, entry.state.id), reverse=order == "desc")
    start = int(next_token or 0)
    page = kept[start : start + limit]
    headers = {NEXT_PAGE_HEADER: str(start + limit)} if start + limit < len(kept) else None
    return _json([_detail(request, entry) for entry in page], headers=headers)


def _started(entry: Entry) -> datetime:
    """When the sandbox started, exactly as ``startedAt`` reports it (to the microsecond)."""
    return datetime.fromtimestamp(entry.state.created_at, UTC)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _metadata_filter(metadata: str | None) -> dict[str, str]:
    """The SDK's ``metadata`` query value: ``k=v&...`` with each key and value quoted once more."""
    if not metadata:
        return {}
    pairs = urllib.parse.parse_qsl(metadata, keep_blank_values=True, max_num_fields=64)
    return {urllib.parse.unquote(key): urllib.parse.unquote(value) for key, value in pairs}


@router.delete("/sandboxes/{sandbox_id}")
async def kill(request: Request, sandbox_id: str, api_key: _ApiKey = None) -> Response:
    await service(request).registry.delete(_tenant(request, api_key), sandbox_id)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/timeout")
async def set_timeout(request: Request, sandbox_id: str, api_key: _ApiKey = None) -> Response:
    """The sandbox ends ``timeout`` seconds from now, sooner or later than it would have."""
    tenant = _tenant(request, api_key)
    body = await _body(request, TimeoutRequest)
    await service(request).registry.renew(tenant, sandbox_id, max(1, body.timeout))
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/connect")
@router.post("/v2/sandboxes/{sandbox_id}/connect")
async def connect(request: Request, sandbox_id: str, api_key: _ApiKey = None) -> Response:
    """A running sandbox's access again; a ``timeout`` only ever extends its life."""
    tenant = _tenant(request, api_key)
    body = await _body(request, ConnectSandbox, empty=True)
    registry = service(request).registry
    entry = await registry.find(tenant, sandbox_id)
    paused = bool(entry.state.paused)
    if paused:
        entry = await registry.resume(entry)
    if body.timeout:
        ends = registry.clock.now() + body.timeout
        if entry.state.expires_at is None or ends > entry.state.expires_at:
            entry = await registry.renew(tenant, sandbox_id, body.timeout)
    return _json(_created(request, entry), 201 if paused else 200)


@router.post("/sandboxes/{sandbox_id}/pause")
async def pause(request: Request, sandbox_id: str, api_key: _ApiKey = None) -> Response:
    """Paused until a connect or a resume; its timeout stops meanwhile, as E2B's does (204; 409
    if it is paused already). ``memory: false`` (the SDK's ``mode="filesystem"``) hibernates
    it: its files kept, its processes ended, its container or jail released."""
    tenant = _tenant(request, api_key)
    body = await _body(request, PauseRequest, empty=True)
    registry = service(request).registry
    entry = await registry.find(tenant, sandbox_id)
    if body.memory is False:
        await registry.hibernate(entry, "stop")
    else:
        await registry.pause(entry, "stop")
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/resume")
async def resume(request: Request, sandbox_id: str, api_key: _ApiKey = None) -> Response:
    """A paused sandbox running again (201); 409 if it runs already."""
    tenant = _tenant(request, api_key)
    body = await _body(request, ConnectSandbox, empty=True)
    registry = service(request).registry
    entry = await registry.find(tenant, sandbox_id)
    if not entry.state.paused:
        return e2b_error(409, f"sandbox {sandbox_id} is not paused")
    entry = await registry.resume(entry)
    if body.timeout:
        entry = await registry.renew(tenant, sandbox_id, body.timeout)
    return _json(_created(request, entry), 201)


@router.put("/sandboxes/{sandbox_id}/network")
async def update_network(request: Request, sandbox_id: str, api_key: _ApiKey = None) -> Response:
    """The sandbox's egress allow-list and rules replaced (204), as a create's ``network`` sets
    them (E2B's default, all traffic: its template's list), from its next connection on; 409
    for a list or rules on a sandbox without egress."""
    tenant = _tenant(request, api_key)
    body = await _body(request, NetworkUpdate)
    entry = await service(request).registry.find(tenant, sandbox_id)
    try:
        allow = body.egress_allow()
        headers = body.headers()
        changed = request.app.state.egress.set_allow(sandbox_id, allow)
    except ValueError as exc:
        return e2b_error(400, f"network: {exc}")
    if not changed and (allow or headers or (allow is None and entry.backend.template.egress_allow)):
        return e2b_error(409, f"sandbox {sandbox_id} has no egress (its template has none): no allow-list applies")
    if changed:
        request.app.state.egress.set_headers(sandbox_id, headers)
        await service(request).registry.record_network(entry)
    return Response(status_code=204)


_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


@router.api_route("/{rest:path}", methods=_METHODS)
async def not_served(request: Request, rest: str, api_key: _ApiKey = None) -> Response:
    """What this service does not serve (template builds, volumes, teams...): to a tenant, E2B's
    error shape, so the SDK raises its own exception rather than failing to read the answer."""
    _tenant(request, api_key)
    return e2b_error(501, f"/{rest} is not implemented by this service")
