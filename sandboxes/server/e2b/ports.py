"""A sandbox's other ports on the E2B envd plane: with ``E2B_SANDBOX_URL`` pointed at the service,
the SDK reaches every port of a sandbox (the code interpreter's 49999, ``get_sandbox_url(port=)``)
at that one URL, naming the port in ``E2b-Sandbox-Port`` (without it, at ``{port}-{id}.{domain}``,
which `sandboxes.server.e2b.hosts` turns into the same request). A request under ``/e2b/envd`` whose
port is not envd's is relayed to that port inside the sandbox (`relay_http`), whatever its path,
once its ``X-Access-Token`` or ``E2B-Traffic-Access-Token`` proves access to the sandbox (the
envd token, `sandboxes.server.e2b.tokens`), or without one where its create asked
``allowPublicTraffic: true`` (403 without one, as E2B's proxy answers; 401 for a wrong one);
with the ``Host`` its ``maskRequestHost`` says, if it said one; a paused sandbox created with
``auto_resume`` is resumed first; E2B's answers for failures (502: no such sandbox, a paused
one, or nothing listens on the port)."""

from __future__ import annotations

from typing import Any

from starlette.datastructures import URLPath
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, NoMatchFound, request_response
from starlette.types import Receive, Scope, Send

from sandboxes.server.auth import Tenant
from sandboxes.server.e2b.common import ENVD_PREFIX, e2b_error, e2b_state, port_access, service
from sandboxes.server.e2b.envd import ENVD_PORT
from sandboxes.server.errors import ServiceError
from sandboxes.server.preview_proxy import relay_http

__all__ = ["EnvdPortRoute"]

_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def _port_of(scope: Scope) -> bytes | None:
    return next((value for key, value in scope["headers"] if key == b"e2b-sandbox-port"), None)


class EnvdPortRoute(BaseRoute):
    """The first route of the table: an envd-plane request for a port other than envd's."""

    def __init__(self) -> None:
        self.path = ENVD_PREFIX + "/{path:path}"
        self.methods = set(_METHODS)
        self._app = request_response(_relay)

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] != "http" or not (scope["path"] + "/").startswith(ENVD_PREFIX + "/"):
            return Match.NONE, {}
        port = _port_of(scope)
        if port is None or port.decode("latin-1") == ENVD_PORT:
            return Match.NONE, {}
        return Match.FULL, {}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)

    def url_path_for(self, name: str, /, **path_params: Any) -> URLPath:
        raise NoMatchFound(name, path_params)


async def _relay(request: Request) -> Response:
    try:
        return await _relayed(request)
    except ServiceError as exc:
        return e2b_error(exc.status, exc.message, exc.headers)


async def _relayed(request: Request) -> Response:
    sandbox_id = request.headers.get("e2b-sandbox-id", "")
    raw_port = request.headers.get("e2b-sandbox-port", "")
    if not sandbox_id:
        raise ServiceError("invalid_request", "missing E2b-Sandbox-Id header", status=400)
    if not raw_port.isdigit() or not 0 < int(raw_port) < 65536:
        raise ServiceError("invalid_request", f"E2b-Sandbox-Port {raw_port!r} is no port", status=400)
    token = request.headers.get("x-access-token") or request.headers.get("e2b-traffic-access-token") or ""
    svc = service(request)
    access = await port_access(request, sandbox_id)
    tenant_id = e2b_state(request).signer.tenant_of(token, sandbox_id) if token else None
    public = tenant_id is None and not token and access is not None and bool(access.public)
    if public and access is not None:
        tenant_id = access.tenant
    if tenant_id is None and not token:  # E2B's proxy: 403 for a request without the token
        message = "this sandbox's ports need its traffic access token (its create did not allow public traffic)"
        raise ServiceError("unauthorized", message, status=403)
    if tenant_id is None:
        raise ServiceError("unauthorized", "wrong access token for this sandbox", status=401)
    tenant = Tenant(tenant_id, svc.settings.policy_for(tenant_id))
    request.scope.setdefault("state", {})["tenant"] = tenant_id
    svc.limiter.check(Tenant(f"{tenant_id} (previews)", tenant.policy) if public else tenant)  # strangers apart
    try:
        entry = await svc.registry.awake(await svc.registry.find(tenant, sandbox_id))
    except ServiceError as exc:
        if exc.code == "not_found":
            raise ServiceError("not_found", f"The sandbox {sandbox_id} was not found", status=502) from None
        if exc.code == "paused":  # as envd's own port answers for a paused sandbox
            raise ServiceError("paused", exc.message, status=502) from None
        raise
    masked = None if access is None else access.host(int(raw_port))
    if masked is not None:
        kept = [(key, value) for key, value in request.scope["headers"] if key != b"host"]
        request.scope["headers"] = [(b"host", masked.encode("latin-1")), *kept]
    raw: bytes = request.scope.get("raw_path") or request.scope["path"].encode("utf-8")
    target = raw[len(ENVD_PREFIX) :] or b"/"
    query = request.scope.get("query_string", b"")
    return await relay_http(request, entry, int(raw_port), target + (b"?" + query if query else b""))
