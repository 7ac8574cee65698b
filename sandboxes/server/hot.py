"""The hot routes, served without FastAPI's per-request machinery.

``execute``, the file operations and ``GET /v1/sandboxes/{id}`` are what an agent calls in a
loop. For each, FastAPI's own work (routing through nested routers, resolving dependencies,
building a ``Request``, exception middleware) cost the event-loop thread, the service's
bottleneck, about 0.12 ms of CPU: two thirds of everything ``GET /v1/sandboxes/{id}`` cost.
`HotPath` answers these routes directly, in front of FastAPI, when the request is an ordinary
one: a JSON body that validates against the route's model, a key that authenticates, a sandbox
of the caller's. It then does what the FastAPI route does, with the same functions
(`Authenticator`, `RateLimiter`, `Registry.get`, ``routes.execute_json`` / ``file_json`` /
``info_json``), and answers failures past that point with the functions FastAPI's exception
handlers use (`sandboxes.server.responses`); an unexpected exception goes up to the request
middleware, as it does from a FastAPI route.

Anything else (a body that does not parse or validate, a missing or wrong key, an unknown
sandbox, another tenant's sandbox, a body over the limit, a client gone mid-body, another
content type) is handed to FastAPI unchanged, with the body read so far replayed, so every
such answer is FastAPI's own. Nothing checked before the hand-over has a side effect: the rate
limiter's token is taken only once the request is certain to be served here (which is why the
sandbox is looked up before it, not after as in FastAPI; a failed lookup goes to FastAPI, which
checks in its own order, so no answer changes). The routes, their OpenAPI description and the
error handling stay in FastAPI; this module only decides who serves the common case.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandboxes import api
from sandboxes.server import responses
from sandboxes.server.auth import Tenant
from sandboxes.server.errors import ServiceError
from sandboxes.server.registry import Entry
from sandboxes.server.routes import AUTHENTICATED, Service, execute_json, file_json, info_json

_ROUTE = re.compile(
    rf"^{re.escape(api.API_PREFIX)}/sandboxes/(?P<id>[^/]+)(?:/(?P<action>execute|files/(?P<op>[a-z]+)))?$"
)
"""``/v1/sandboxes/{id}``, ``.../execute`` and ``.../files/{op}``: Starlette's ``{name}``
matches ``[^/]+`` of the decoded path, as this does."""


class HotPath:
    """ASGI middleware: serves the hot routes' ordinary requests, hands FastAPI the rest."""

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = _route(scope)
        if route is None:
            await self.app(scope, receive, send)
            return
        sandbox_id, op = route
        authorization, content_type = _headers(scope)
        body: BaseModel | None = None
        if op is not None:
            model = api.ExecuteRequest if op == "execute" else api.FILE_OPERATIONS[op]
            read: list[Message] = []
            try:
                body = await _parsed(model, await _read_body(receive, read), content_type)
            except HTTPException as exc:  # over the body limit: FastAPI reports it
                await self.app(scope, _replay(read, receive, exc), send)
                return
            if body is None:
                await self.app(scope, _replay(read, receive), send)
                return
            receive = _replay(read, receive)
        svc = self.service
        try:
            tenant = scope.get("state", {}).get(AUTHENTICATED)
            if not isinstance(tenant, Tenant):
                tenant = svc.auth.authenticate(authorization)
            entry = svc.registry.held(tenant, sandbox_id)  # no backend call before the rate check
        except ServiceError:  # FastAPI answers it (or finds the sandbox), with its own order of checks
            await self.app(scope, receive, send)
            return
        if op is not None:
            read.clear()  # served here: only the parsed body is needed, the raw bytes can go
        await self._serve(scope, receive, send, svc, tenant, op, entry, body)

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        svc: Service,
        tenant: Tenant,
        op: str | None,
        entry: Entry,
        body: Any,
    ) -> None:
        scope.setdefault("state", {})["tenant"] = tenant.id
        try:
            svc.limiter.check(tenant)
            if op is None:
                answer = info_json(entry)
            elif op == "execute":
                answer = await execute_json(svc, entry, body, receive)
            else:
                answer = await file_json(op, entry, body, svc, receive)
        except ServiceError as exc:
            await responses.service_error(svc.metrics, exc)(scope, _no_body, send)
            return
        except HTTPException as exc:
            await responses.http_error(svc.metrics, exc)(scope, _no_body, send)
            return
        # Anything else goes up to the request middleware, which answers it as it answers an
        # unexpected error of a FastAPI route.
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", str(len(answer)).encode()), (b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": answer})


def _route(scope: Scope) -> tuple[str, str | None] | None:
    """(sandbox id, ``execute`` / a file operation / ``None`` for the GET) of a hot route."""
    if scope["type"] != "http" or scope.get("root_path"):
        return None
    found = _ROUTE.match(scope["path"])
    if found is None:
        return None
    action, op = found["action"], found["op"]
    method = scope["method"]
    if action is None:
        return (found["id"], None) if method == "GET" else None
    if method != "POST" or (op is not None and op not in api.FILE_OPERATIONS):
        return None
    return found["id"], op or "execute"


def _headers(scope: Scope) -> tuple[str | None, str | None]:
    """The first ``Authorization`` and ``Content-Type``, as Starlette's ``headers.get`` gives."""
    authorization = content_type = None
    for key, value in scope["headers"]:
        if key == b"authorization" and authorization is None:
            authorization = value.decode("latin-1")
        elif key == b"content-type" and content_type is None:
            content_type = value.decode("latin-1")
    return authorization, content_type


async def _read_body(receive: Receive, read: list[Message]) -> bytes | None:
    """The whole body, every message kept in ``read``; ``None`` if the client left first."""
    while True:
        message = await receive()
        read.append(message)
        if message["type"] != "http.request":
            return None
        if not message.get("more_body", False):
            return b"".join(m.get("body", b"") for m in read)


async def _parsed(model: type[BaseModel], raw: bytes | None, content_type: str | None) -> BaseModel | None:
    """The body as FastAPI would validate it (`responses.parse_json`, off the event loop when
    big, then the model), or ``None``."""
    if raw is None or content_type != responses.JSON:
        return None
    try:
        return model.model_validate(await responses.parse_json_off_loop(raw))
    except (ValueError, ValidationError):  # JSONDecodeError is a ValueError
        return None


def _replay(read: list[Message], receive: Receive, error: Exception | None = None) -> Receive:
    """``receive`` as if nothing had been read: ``read`` again, then ``error`` or the rest."""
    pending = list(read)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        if error is not None:
            raise error
        return await receive()

    return replayed


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}
