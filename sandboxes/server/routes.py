"""The HTTP routes of `sandboxes.api`, version 1.

Every route under ``/v1`` authenticates first, then takes a token from the tenant's rate
bucket, then looks the sandbox up among the tenant's own (another tenant's id is simply not
there: 404). File operations answer the protocol's results inside a 200; only failures of the
service itself (or of reaching the backend) are HTTP errors.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

import pydantic_core
from fastapi import APIRouter, Depends, Header, Query, Request, Response, WebSocket
from fastapi.responses import PlainTextResponse, StreamingResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.routing import Route
from starlette.types import Message, Scope, Send
from starlette.types import Receive as ASGIReceive

from sandboxes import api, protocol
from sandboxes.server import idempotency
from sandboxes.server.auth import Authenticator, CommandSlots, RateLimiter, Tenant, request_tenant
from sandboxes.server.errors import ServiceError
from sandboxes.server.execution import Receive, command_for, run_abandonable, run_detached, run_once
from sandboxes.server.fairness import FileLanes
from sandboxes.server.members import bounded_members, started
from sandboxes.server.metrics import CONTENT_TYPE, Metrics
from sandboxes.server.preview_proxy import Previews
from sandboxes.server.recorded import attach_events, kill_command, with_record
from sandboxes.server.registry import Entry, Registry
from sandboxes.server.responses import JSON, json_response, parse_json_off_loop, to_json
from sandboxes.server.settings import ServiceSettings, Template
from sandboxes.server.streamed import Readers, StreamedCommand, StreamedCommands, stream_events
from sandboxes.server.streams import buffered_body, iterate_thread
from sandboxes.server.terminals import Terminals, serve_pty
from sandboxes.server.watches import Watches

logger = logging.getLogger(__name__)
T = TypeVar("T")
Lane = Callable[[Callable[[], Any]], Awaitable[Any]]
"""Runs a blocking call in a worker thread, in some order of its own (`FileLanes.run`)."""


@dataclass
class Service:
    """Everything a route needs, hung on ``app.state.service``."""

    settings: ServiceSettings
    registry: Registry
    auth: Authenticator
    limiter: RateLimiter
    metrics: Metrics
    draining: bool = False
    commands: CommandSlots = field(default_factory=CommandSlots)
    file_lanes: FileLanes = field(default_factory=FileLanes)
    command_pool: Executor | None = None
    """Threads that wait on commands; set by the app's lifespan (``None``: the loop's default)."""
    streamed: StreamedCommands = field(default_factory=StreamedCommands)
    """Streamed commands, to re-attach to."""
    readers: Readers = field(default_factory=Readers)
    """Re-attached streams open, per tenant (at most its ``max_commands``)."""
    terminals: Terminals = field(default_factory=Terminals)
    """Terminal sessions (``/pty``), to reattach to."""
    watches: Watches = field(default_factory=Watches)
    """File watches open, per tenant (at most its ``max_watchers``), and the polled ones."""
    previews: Previews | None = None
    """The preview plane (`sandboxes.server.preview_proxy`); set by the app."""

    async def take_command_slot(self, entry: Entry) -> Callable[[], None]:
        """One of the sandbox's tenant's command slots, waiting ``command_slot_wait`` at most
        for one (see `CommandSlots`)."""
        tenant = entry.state.tenant
        return await self.commands.acquire(tenant, self.settings.policy_for(tenant), self.settings.command_slot_wait)


def service_of(request: Request) -> Service:
    svc: Service = request.app.state.service
    return svc


_bearer = HTTPBearer(auto_error=False, description="An API key of the service")


def admitted(request: Request) -> Tenant:
    """The request's tenant (`request_tenant`), with a token taken from its rate bucket: what
    every ``/v1`` route does first, on its fast path and in FastAPI's handler alike."""
    svc = service_of(request)
    tenant = request_tenant(svc.auth, request.scope)
    svc.limiter.check(tenant)
    return tenant


async def _tenant(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Tenant:
    """`admitted`, as a dependency (``credentials`` only states the key in the OpenAPI document)."""
    return admitted(request)


class _JSONRequest(Request):
    """A request whose JSON body is parsed by `parse_json`: malformed, lone surrogates and deep
    nesting are 422s, and a big body is parsed off the event loop."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = await parse_json_off_loop(await self.body())
        return self._json


@dataclass(frozen=True, slots=True)
class Hot:
    """A route's fast path: its body's model (``None``: no body) and what answers a request
    whose body validates, for a sandbox of the caller's."""

    model: type[BaseModel] | None
    serve: Callable[[Service, Entry, Any, Receive], Awaitable[bytes]]
    awake: bool = True
    """Whether the sandbox must be running (`Registry.awake`), not merely exist."""


def _hot(
    model: type[BaseModel] | None, serve: Callable[[Service, Entry, Any, Receive], Awaitable[bytes]], awake: bool = True
) -> Callable[[T], T]:
    """Give the decorated endpoint a fast path (`hot_routes`)."""

    def mark(endpoint: T) -> T:
        endpoint.hot = Hot(model, serve, awake)  # type: ignore[attr-defined]
        return endpoint

    return mark


class _Route(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Any]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            response: Response = await handler(_JSONRequest(request.scope, request.receive))
            return response

        return handle


class _Fast:
    """The endpoint of a hot route's `Route` (`hot_routes`): serves an ordinary request (a JSON
    body that validates) without FastAPI's dependency resolution and validation, through the
    same functions as the documented route's handler (`admitted`, `Registry.find`, the route's
    serve function), failures raised to the same exception handlers; any other request goes
    to the documented route, its body replayed, which answers it."""

    def __init__(self, hot: Hot, route: APIRoute) -> None:
        self.hot = hot
        self.route = route

    async def __call__(self, scope: Scope, receive: ASGIReceive, send: Send) -> None:
        request = _JSONRequest(scope, receive)
        answer = await _served(self.hot, request)
        if answer is not None:
            await json_response(answer)(scope, receive, send)
            return
        body = getattr(request, "_body", None)
        await self.route.handle(scope, receive if body is None else _replayed(body, receive), send)


def hot_routes() -> list[Route]:
    """Routes for the front of the app's route table, one per documented route with a fast path
    (`_hot`), at the same path and methods."""
    found = []
    for route in router.routes:
        hot: Hot | None = getattr(getattr(route, "endpoint", None), "hot", None)
        if isinstance(route, APIRoute) and hot is not None:
            found.append(
                Route(route.path, _Fast(hot, route), methods=sorted(route.methods or ()), include_in_schema=False)
            )
    return found


def _replayed(body: bytes, receive: ASGIReceive) -> ASGIReceive:
    """``receive`` as if the body had not been read."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


async def _served(hot: Hot, request: Request) -> bytes | None:
    """The fast path's answer; ``None`` to leave the request to the documented route. Nothing
    with a side effect (the rate token) happens before the body validated."""
    body = None
    if hot.model is not None:
        if request.headers.get("content-type") != JSON:
            return None
        try:
            body = hot.model.model_validate(await request.json())
        except HTTPException:  # a body over the limit, met while reading it
            raise
        except Exception:  # malformed, invalid, or the client gone: the documented route says so
            return None
    svc = service_of(request)
    entry = await svc.registry.find(admitted(request), request.path_params["sandbox_id"])
    if hot.awake:
        entry = await svc.registry.awake(entry)
    return await hot.serve(svc, entry, body, request.receive)


Authed = Annotated[Tenant, Depends(_tenant)]


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for failures answered as an `api.ErrorBody`."""
    return {status: {"model": api.ErrorBody, "description": _FAILURES[status]} for status in statuses}


_FAILURES = {
    401: "No valid API key (`unauthorized`)",
    403: "Over a quota that waiting does not lift (`quota_exceeded`), or a path the sandbox refuses",
    404: "No such sandbox for this tenant (`not_found`), or no such process or path",
    409: "The sandbox is paused (`paused`): resume it first; or a volume is mounted, or exists already",
    413: "The request body is over the service's limit (`too_large`)",
    422: "The request is malformed, names what does not exist, or reuses an idempotency key for another body",
    429: "Over the tenant's request rate or command slots (`rate_limited`); see `Retry-After`",
    501: "The backend has no such capability (`unavailable`)",
    503: "The sandbox's backend failed or is unreachable (`backend_unavailable`)",
    507: "The sandbox's disk is full (`no_space`)",
}


def api_router() -> APIRouter:
    """A router for the service's public API (this module's `router`, and modules that add
    to it): its prefix, its route class and its documented failures."""
    return APIRouter(prefix=api.API_PREFIX, route_class=_Route, responses=_errors(401, 404, 409, 413, 422, 429, 503))


router = api_router()
health = APIRouter()


async def _entry(request: Request, tenant: Tenant, sandbox_id: str) -> tuple[Service, Entry]:
    """The tenant's sandbox, running (a paused one resumed or refused: `Registry.awake`)."""
    svc = service_of(request)
    return svc, await svc.registry.awake(await svc.registry.find(tenant, sandbox_id))


def _template(svc: Service, entry: Entry) -> Template:
    return entry.backend.template


async def _backend(function: Callable[..., T], *args: Any, lane: Lane | None = None) -> T:
    """A blocking backend call in a worker thread (through ``lane`` when given); a backend that
    fails is a 503, not a 500."""
    try:
        if lane is not None:
            answer: T = await lane(functools.partial(function, *args))
            return answer
        return await asyncio.to_thread(function, *args)
    except (ServiceError, HTTPException):  # ours, and a body over the limit met while reading it
        raise
    except Exception as exc:
        logger.warning("backend call %s failed: %s", getattr(function, "__name__", function), exc, exc_info=True)
        raise ServiceError(
            "backend_unavailable", "the sandbox's backend failed; the service log has the request id"
        ) from exc


# ---------------------------------------------------------------------- lifecycle


@router.post("/sandboxes", status_code=201, response_model=api.SandboxInfo, responses=_errors(403, 409))
async def create_sandbox(
    request: Request,
    response: Response,
    body: api.CreateSandbox,
    tenant: Authed,
    idempotency_key: Annotated[
        str | None, Header(description=idempotency.DESCRIPTION, json_schema_extra={"pattern": idempotency.KEY_PATTERN})
    ] = None,
) -> api.SandboxInfo:
    entry, replayed = await service_of(request).registry.create(tenant, body, idempotency_key)
    if replayed:
        response.headers[idempotency.REPLAYED_HEADER] = "true"
    return entry.info()


@router.get("/sandboxes", response_model=api.SandboxList)
async def list_sandboxes(request: Request, tenant: Authed) -> api.SandboxList:
    entries = await service_of(request).registry.list(tenant)
    return api.SandboxList(sandboxes=[entry.info() for entry in entries])


async def _info(svc: Service, entry: Entry, body: None, receive: Receive) -> bytes:
    return info_json(entry)


@router.get("/sandboxes/{sandbox_id}", response_model=api.SandboxInfo)
@_hot(None, _info, awake=False)
async def get_sandbox(request: Request, sandbox_id: str, tenant: Authed) -> Response:
    return json_response(info_json(await service_of(request).registry.find(tenant, sandbox_id)))


def info_json(entry: Entry) -> bytes:
    """``GET /v1/sandboxes/{id}``'s answer."""
    return to_json(entry.info())


@router.post("/sandboxes/{sandbox_id}/renew", response_model=api.SandboxInfo)
async def renew_sandbox(request: Request, sandbox_id: str, body: api.RenewSandbox, tenant: Authed) -> api.SandboxInfo:
    entry = await service_of(request).registry.renew(tenant, sandbox_id, body.ttl)
    return entry.info()


@router.delete("/sandboxes/{sandbox_id}", status_code=204, response_class=Response)
async def delete_sandbox(request: Request, sandbox_id: str, tenant: Authed) -> Response:
    await service_of(request).registry.delete(tenant, sandbox_id)
    return Response(status_code=204)


# ---------------------------------------------------------------------- execute


async def _execute(svc: Service, entry: Entry, body: api.ExecuteRequest, receive: Receive) -> bytes:
    return await execute_json(svc, entry, body, receive)


@router.post("/sandboxes/{sandbox_id}/execute", response_model=api.ExecuteResult)
@_hot(api.ExecuteRequest, _execute)
async def execute(request: Request, sandbox_id: str, body: api.ExecuteRequest, tenant: Authed) -> Response:
    svc, entry = await _entry(request, tenant, sandbox_id)
    return json_response(await execute_json(svc, entry, body, request.receive))


async def execute_json(svc: Service, entry: Entry, body: api.ExecuteRequest, receive: Receive | None = None) -> bytes:
    """Run the command of an execute request; its answer.
    ``receive``: the request's, to kill the command if the client leaves before it ends."""
    command = command_for(body, _template(svc, entry), svc.settings)
    release = await svc.take_command_slot(entry)
    started = time.perf_counter()
    result = await run_once(entry.sandbox, command, entry.kill_marked, receive, svc.command_pool, release)
    svc.metrics.execute_seconds.labels(entry.backend.name, "sync").observe(time.perf_counter() - started)
    return to_json(result)


_NDJSON: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/x-ndjson": {}}, "description": "NDJSON lines of StreamEvent"}
}


@router.post("/sandboxes/{sandbox_id}/execute/stream", response_class=StreamingResponse, responses=_NDJSON)
async def execute_stream(request: Request, sandbox_id: str, body: api.ExecuteRequest, tenant: Authed) -> Response:
    """Start the command, detached from this connection, and follow it from its first byte."""
    svc, entry = await _entry(request, tenant, sandbox_id)
    command = command_for(body, _template(svc, entry), svc.settings)
    histogram = svc.metrics.execute_seconds.labels(entry.backend.name, "stream")
    release = await svc.take_command_slot(entry)
    started = time.perf_counter()

    def ended() -> None:
        release()
        histogram.observe(time.perf_counter() - started)

    record = StreamedCommand(sandbox_id, command.output_limit, asyncio.get_running_loop())
    command = with_record(command, record.id)  # the sandbox's record, for a replica that does not hold this one
    work, token = run_detached(entry.sandbox, command, record.write, svc.command_pool, ended)
    record.follow(work, functools.partial(entry.kill_marked, token))
    svc.streamed.add(record)
    return _ndjson(stream_events(record, 0, svc.settings.stream_keepalive))


@router.get("/sandboxes/{sandbox_id}/execute/{command_id}/stream", response_class=StreamingResponse, responses=_NDJSON)
async def attach_stream(
    request: Request, sandbox_id: str, command_id: str, tenant: Authed, offset: Annotated[int, Query(ge=0)] = 0
) -> Response:
    """Follow a streamed command again from byte ``offset`` of its output (a lost stream's last);
    one this replica does not hold, from the sandbox's record of it (`attach_events`)."""
    svc, entry = await _entry(request, tenant, sandbox_id)  # the tenant's sandbox, or 404
    events = await attach_events(
        svc.streamed, entry.sandbox, sandbox_id, command_id, offset, svc.settings.stream_keepalive
    )
    cap = svc.settings.policy_for(tenant.id).max_commands
    followed, close = await svc.readers.follow(tenant.id, cap, events)
    return _ndjson(followed, BackgroundTask(close))


@router.delete("/sandboxes/{sandbox_id}/execute/{command_id}", response_model=api.ExecuteResult)
async def kill_stream(request: Request, sandbox_id: str, command_id: str, tenant: Authed) -> api.ExecuteResult:
    """Kill a streamed command's process tree; its result, once it ended (see `kill_command`)."""
    svc, entry = await _entry(request, tenant, sandbox_id)  # the tenant's sandbox, or 404
    return await kill_command(svc.streamed, entry.sandbox, entry.kill_marked, sandbox_id, command_id)


def _ndjson(events: AsyncIterator[bytes], background: BackgroundTask | None = None) -> Response:
    headers = {"X-Accel-Buffering": "no"}
    return StreamingResponse(events, media_type="application/x-ndjson", headers=headers, background=background)


@router.websocket("/sandboxes/{sandbox_id}/pty")
async def pty(websocket: WebSocket, sandbox_id: str) -> None:
    """A terminal in the sandbox over a WebSocket (`sandboxes.server.terminals`)."""
    await serve_pty(websocket.app.state.service, websocket, sandbox_id)


@router.post("/sandboxes/{sandbox_id}/processes", status_code=202, response_model=api.ProcessInfo)
async def start_process(request: Request, sandbox_id: str, body: api.ExecuteRequest, tenant: Authed) -> api.ProcessInfo:
    svc, entry = await _entry(request, tenant, sandbox_id)
    command = command_for(body, _template(svc, entry), svc.settings)
    release = await svc.take_command_slot(entry)
    try:
        return await _backend(entry.processes.start, command, release)
    except BaseException:
        release()
        raise


@router.get("/sandboxes/{sandbox_id}/processes/{process_id}", response_model=api.ProcessInfo)
async def poll_process(request: Request, sandbox_id: str, process_id: str, tenant: Authed) -> api.ProcessInfo:
    return await _backend((await _entry(request, tenant, sandbox_id))[1].processes.get, process_id)


@router.delete("/sandboxes/{sandbox_id}/processes/{process_id}", response_model=api.ProcessInfo)
async def kill_process(request: Request, sandbox_id: str, process_id: str, tenant: Authed) -> api.ProcessInfo:
    entry = (await _entry(request, tenant, sandbox_id))[1]
    return await _backend(entry.processes.kill, process_id)


# ---------------------------------------------------------------------- files


async def file_json(op: str, entry: Entry, body: Any, svc: Service, receive: Receive | None = None) -> bytes:
    """The answer of file operation ``op`` (a protocol result as JSON), run in the tenant's lane
    (`FileLanes`) and killed past the service's ``file_operation_timeout`` (the registry sets
    it on every sandbox it holds); a download is bounded per file (bigger files are streamed
    through ``GET /archive``, never base64 in JSON); a search whose client left (``receive``,
    the request's) has its commands killed (`run_abandonable`)."""
    tenant = entry.state.tenant
    cap = svc.settings.policy_for(tenant).max_file_operations
    lane = functools.partial(svc.file_lanes.run, tenant, cap)
    if op == "download":
        limit = entry.backend.settings.max_inline_download_bytes
        return to_json(await _backend(_download, entry.sandbox, body, limit, lane=lane))
    if op in _ABANDONABLE:
        operation = functools.partial(_backend, _OPERATIONS[op], entry.sandbox, body, lane=lane)
        return to_json(await run_abandonable(operation, entry.kill_marked, receive))
    return to_json(await _backend(_OPERATIONS[op], entry.sandbox, body, lane=lane))


_ABANDONABLE = frozenset({"grep", "glob"})
"""File operations killed when their client leaves: searches, which only read, and may walk a
huge tree; the others change files (left to finish) or end soon."""


def _files(op: str, model: type[Any]) -> None:
    async def operation(request: Request, sandbox_id: str, tenant: Authed, body: Any) -> Response:
        entry = (await _entry(request, tenant, sandbox_id))[1]
        return json_response(await file_json(op, entry, body, service_of(request), request.receive))

    async def serve(svc: Service, entry: Entry, body: Any, receive: Receive) -> bytes:
        return await file_json(op, entry, body, svc, receive)

    operation.__annotations__["body"] = model  # FastAPI reads the request model from here
    operation.__name__ = f"files_{op}"
    _hot(model, serve)(operation)
    router.add_api_route(
        f"/sandboxes/{{sandbox_id}}/files/{op}",
        operation,
        methods=["POST"],
        name=f"files_{op}",
        summary=f"File operation `{op}` (protocol result in a 200)",
        responses={
            200: {"model": api.FILE_RESULTS[op], "description": "The protocol's result (`error` set on failure)"}
        },
    )


def _decode(item: api.UploadItem) -> tuple[str, bytes]:
    try:
        return item.path, base64.b64decode(item.content_b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ServiceError("invalid_request", f"content_b64 of {item.path!r} is not base64") from exc


def _upload(sandbox: Any, body: api.UploadRequest) -> Any:
    return sandbox.upload_files([_decode(item) for item in body.files])


def _download(sandbox: Any, body: api.DownloadRequest, limit: int) -> list[api.DownloadItem]:
    """Files up to ``limit`` bytes each, and a batch's files up to four times ``limit`` in all
    (each gets its share); bigger ones answer ``file_too_large`` (the client then streams them
    through ``GET /archive``)."""
    limit = min(limit, max(_MIN_SHARE, 4 * limit // max(len(body.paths), 1)))
    found = sandbox.download_files_within(body.paths, limit)
    return [
        api.DownloadItem(
            path=item.path,
            content_b64=None if item.content is None else base64.b64encode(item.content).decode("ascii"),
            error=item.error,
            message=_streamable(item.message, limit) if item.error == protocol.FILE_TOO_LARGE else item.message,
        )
        for item in found
    ]


_MIN_SHARE = 64 << 10
"""The least any file of a ``files/download`` batch may be inline, however many it names."""


def _streamable(message: str | None, limit: int) -> str:
    return f"{message or 'too large'} (the service answers files up to {limit} bytes inline; GET /archive streams it)"


_OPERATIONS: dict[str, Callable[[Any, Any], Any]] = {
    "ls": lambda s, b: s.ls(b.path),
    "read": lambda s, b: s.read(b.file_path, b.offset, b.limit),
    "write": lambda s, b: s.write(b.file_path, b.content),
    "edit": lambda s, b: s.edit(b.file_path, b.old_string, b.new_string, b.replace_all),
    "delete": lambda s, b: s.delete(b.file_path),
    "grep": lambda s, b: s.grep(b.pattern, b.path, b.glob, max_count=b.max_count),
    "glob": lambda s, b: s.glob(b.pattern, b.path),
    "upload": _upload,
}
for _op, _model in api.FILE_OPERATIONS.items():
    _files(_op, _model)


# ---------------------------------------------------------------------- archives

_ArchivePath = Annotated[str, Query(min_length=1, json_schema_extra={"pattern": api.SANDBOX_PATH})]
"""An absolute path in the sandbox."""


@router.get(
    "/sandboxes/{sandbox_id}/archive",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}},
            "description": "tar of PATH (its basename at the top)",
        },
        **_errors(403),
    },
)
async def get_archive(request: Request, sandbox_id: str, tenant: Authed, path: _ArchivePath) -> Response:
    svc, entry = await _entry(request, tenant, sandbox_id)
    produce = await _backend(entry.backend.open_archive, entry.sandbox, path)
    bounded = bounded_members(produce, svc.settings.max_archive_file_bytes, path)
    return StreamingResponse(await started(iterate_thread(bounded)), media_type="application/x-tar")


@router.put(
    "/sandboxes/{sandbox_id}/archive",
    status_code=204,
    response_class=Response,
    responses=_errors(403, 507),
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "A tar stream, extracted under PATH",
            "content": {
                media: {"schema": {"type": "string", "format": "binary"}}
                for media in ("application/x-tar", "application/octet-stream")
            },
        }
    },
)
async def put_archive(request: Request, sandbox_id: str, tenant: Authed, path: _ArchivePath) -> Response:
    entry = (await _entry(request, tenant, sandbox_id))[1]
    body = buffered_body(request.stream(), asyncio.get_running_loop())
    await _backend(entry.backend.put_archive, entry.sandbox, path, body)
    return Response(status_code=204)


# ---------------------------------------------------------------------- health


@health.get("/healthz", include_in_schema=False, response_model=api.Health)
async def healthz() -> Response:
    return _health(api.Health(status="ok"))


@health.get("/readyz", include_in_schema=False, response_model=api.Health)
async def readyz(request: Request) -> Response:
    svc = service_of(request)
    problems = []
    if svc.draining:
        problems.append("shutting down")
    if not svc.registry.ready:
        problems.append("not started")
    for name, backend in svc.registry.backends.items():
        try:
            await asyncio.to_thread(backend.check_ready)
        except Exception as exc:
            logger.warning("%s backend not ready: %s", name, exc)
            problems.append(f"{name} backend not ready (see the service log)")
    if problems:
        return _health(api.Health(status="unavailable", problems=problems), 503)
    return _health(api.Health(status="ready"))


def _health(answer: api.Health, status: int = 200) -> Response:
    return json_response(pydantic_core.to_json(answer, exclude_none=True), status)


@health.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    return PlainTextResponse(service_of(request).metrics.render(), media_type=CONTENT_TYPE)
