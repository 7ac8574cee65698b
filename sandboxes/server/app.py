"""`create_app`: the FastAPI application of the service, with what every request goes through.

The per-request machinery is one plain ASGI middleware (not Starlette's ``BaseHTTPMiddleware``,
which costs a task and a copy per request and breaks streaming back-pressure): it assigns the
request id, authenticates every ``/v1`` request (and ``/metrics``) from its headers before a
byte of its body is read (`request_tenant`, which the routes find done), so a stranger costs
the service one hash and never a body parsed or buffered, refuses oversized bodies (by
``Content-Length`` up front, by counting otherwise), and writes one structured access log line
and the request metrics when the response ends. Inside it, FastAPI's one route table; the hot
routes (execute, file operations, one sandbox's record) serve their ordinary requests on a fast
path of their own (`sandboxes.server.routes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import warnings
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic.warnings import UnsupportedFieldAttributeWarning
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandboxes import api
from sandboxes.server import operator, resources, responses, state_routes, watch_routes
from sandboxes.server.auth import Authenticator, RateLimiter, request_tenant
from sandboxes.server.backends import make_backends
from sandboxes.server.clock import Clock
from sandboxes.server.console import mount as mount_console
from sandboxes.server.e2b import mount as mount_e2b
from sandboxes.server.e2b.hosts import E2BHosts
from sandboxes.server.e2b.tokens import kept_secret
from sandboxes.server.egress import routes as egress_routes
from sandboxes.server.egress.hub import EgressHub
from sandboxes.server.errors import ServiceError
from sandboxes.server.fairness import file_threads
from sandboxes.server.logs import REQUEST_ID, unique_id
from sandboxes.server.metrics import Metrics
from sandboxes.server.port_routes import ports
from sandboxes.server.preview_proxy import HostedRoute, PreviewHosts, Previews
from sandboxes.server.previews import PREVIEW_PATH, PREVIEW_SECRET_FILE, REVOKED_DIR, PreviewAccess
from sandboxes.server.registry import Registry
from sandboxes.server.responses import error_response
from sandboxes.server.routes import Service, health, hot_routes, router
from sandboxes.server.settings import ServiceSettings
from sandboxes.server.usage import Sampler, UsageCollector

logger = logging.getLogger(__name__)
access_logger = logging.getLogger("sandboxes.server.access")

# FastAPI wraps each request body's model as ``Annotated[Model, FieldInfo(alias=<its parameter>)]``
# and silences pydantic's warning about that alias while it makes the adapter; our models build on
# first use (``defer_build``), so the adapter is built later, outside FastAPI's silence. Our body
# parameters are all named ``body``: the same warning, silenced for exactly them.
warnings.filterwarnings("ignore", r"The 'alias' attribute with value 'body'", UnsupportedFieldAttributeWarning)

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
MCP_PATH = "/mcp"
"""Where the service serves MCP over streamable HTTP when ``settings.mcp`` is on (`sandboxes.mcp.mount`)."""


class BodyTooLarge(HTTPException):
    """Raised from ``receive``; an `HTTPException` so FastAPI's body parsing lets it through."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than {limit} bytes")


def _build_models() -> None:
    """Build the validators and serializers of the API's models and of a create's options now,
    at start (they are built at first use, `sandboxes._api_base`, for the client's import):
    otherwise the first create after a start builds them on the event loop, and a burst of
    creates waits behind it. Once per process."""
    from pydantic import BaseModel

    from sandboxes import lifecycle

    for module in (api, lifecycle):
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__.startswith("sandboxes"):
                value.model_rebuild()


def create_app(settings: ServiceSettings, *, docker_client: Any = None, clock: Clock | None = None) -> FastAPI:
    """The service as an ASGI app; sandboxes are reconciled when its lifespan starts. TTLs run
    on ``clock`` (the wall clock by default; a test's moves only when told)."""
    check_settings(settings)
    metrics = Metrics()
    registry = Registry(settings, make_backends(settings, docker_client), metrics, clock)
    service = Service(settings, registry, Authenticator(settings), RateLimiter(), metrics)
    sampler = Sampler(lambda: registry.entries, settings.sample_interval, settings.sample_history)
    metrics.registry.register(UsageCollector(sampler, settings.sample_gauges_per_sandbox))
    egress = EgressHub(settings, registry.holds, refresh=registry.held_confirmed)
    mcp_sessions: Callable[[], AbstractAsyncContextManager[None]] = nullcontext
    secret = kept_secret(settings.preview_token_secret, settings.data_dir / PREVIEW_SECRET_FILE)
    previews = service.previews = Previews(
        PreviewAccess(secret, settings.revoked_previews_dir or settings.data_dir / REVOKED_DIR, clock)
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(settings.worker_threads, thread_name_prefix="sandboxes-worker")
        loop.set_default_executor(executor)
        service.command_pool = ThreadPoolExecutor(settings.command_threads, thread_name_prefix="sandboxes-command")
        files = ThreadPoolExecutor(file_threads(settings), thread_name_prefix="sandboxes-files")
        service.file_lanes.executor = files
        _build_models()
        await registry.start()
        sampling = asyncio.create_task(sampler.run())
        logger.info("service ready", extra={"templates": sorted(settings.templates), "owner": settings.owner})
        try:
            async with mcp_sessions():
                yield
        finally:
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling
            await previews.aclose()
            await egress.close()
            await registry.close()
            service.command_pool.shutdown(wait=False, cancel_futures=True)
            files.shutdown(wait=False, cancel_futures=True)
            logger.info("service stopped")

    app = FastAPI(
        title="sandboxes",
        version="1",
        summary="Isolated code execution for LLM agents",
        lifespan=lifespan,
        openapi_url=f"{api.API_PREFIX}/openapi.json",
        docs_url=None,  # Swagger UI loads its JavaScript from a public CDN: blank offline
        redoc_url=None,
    )
    app.state.service = service
    app.state.usage = sampler
    table = [*hot_routes(), *router.routes, *watch_routes.router.routes, *resources.router.routes]
    table += [*state_routes.router.routes, *ports.routes]
    app.router.routes.extend([*table, *health.routes])  # one table, no nesting
    app.router.routes.extend(operator.router.routes)
    app.router.routes.extend(egress_routes.router.routes)
    app.state.egress = egress
    registry.on_register.append(egress.attach)
    registry.on_network.append(egress.network_changed)
    mount_e2b(app)  # the E2B-compatible API under /e2b
    if settings.console:
        mount_console(app)
    if settings.mcp:
        from sandboxes.mcp import mount as mount_mcp  # the mcp extra, only when asked for

        mcp_sessions = mount_mcp(app)  # MCP over streamable HTTP at /mcp, calling this app as its caller
    _describe_templates(app, sorted(settings.templates))
    _install_error_handlers(app, metrics)
    app.add_middleware(_RequestMiddleware, service=service)
    if settings.preview_domain:  # a Host of {port}-{id}.{domain}: that port's preview, whatever the path
        app.router.routes.insert(0, HostedRoute(api.API_PREFIX))
        app.add_middleware(E2BHosts)  # E2B's requests on such a host: its envd plane's (inside the marking)
        app.add_middleware(PreviewHosts, domain=settings.preview_domain)
    return app


def check_settings(settings: ServiceSettings) -> None:
    """Refuse at start what would only fail later, one sandbox at a time."""
    for name, template in settings.templates.items():
        missing = template.missing_on_host()
        if missing is not None:
            raise RuntimeError(f"template {name!r} needs {missing}")
    if not settings.api_keys and not settings.insecure:
        raise RuntimeError("no API keys configured: set api_keys (SHA-256 of each key -> tenant), or run insecure")


def _describe_templates(app: FastAPI, templates: list[str]) -> None:
    """The OpenAPI document names this service's templates (a create with any other is a 422),
    and states each line of a streamed answer (`_describe_lines`)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            for model in ("CreateSandbox", "CreateVolume"):
                schema["components"]["schemas"][model]["properties"]["template"]["enum"] = templates
            _describe_lines(schema)
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]


def _describe_lines(schema: dict[str, Any]) -> None:
    """Each line of an NDJSON answer is a `StreamEvent` (FastAPI states no schema for a
    streamed body)."""
    components = schema["components"]["schemas"]
    definition = api.StreamEvent.model_json_schema(mode="serialization", ref_template=_COMPONENT)
    for name, nested in definition.pop("$defs", {}).items():
        components.setdefault(name, nested)
    components["StreamEvent"] = definition
    for operations in schema["paths"].values():
        for operation in operations.values():
            lines = operation["responses"].get("200", {}).get("content", {}).get("application/x-ndjson")
            if lines is not None:
                lines["schema"] = {"$ref": _COMPONENT.format(model="StreamEvent")}


_COMPONENT = "#/components/schemas/{model}"


def _allowed_methods(path: str) -> str:
    """Every method the routes with the most specific template matching ``path`` (the fewest
    parameters: ``/execute/stream`` is not ``/execute/{command_id}``) serve, for a 405's ``Allow``."""
    table = (*router.routes, *watch_routes.router.routes, *resources.router.routes, *state_routes.router.routes)
    table += (*ports.routes, *health.routes)
    routes = [route for route in table if isinstance(route, APIRoute)]
    matching = [route for route in routes if route.path_regex.match(path)]
    fewest = min((route.path.count("{") for route in matching), default=0)
    methods = [route.methods or set() for route in matching if route.path.count("{") == fewest]
    return ", ".join(sorted(set().union(*methods)))


def _install_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    async def service_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ServiceError)
        return responses.service_error(metrics, exc)

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error.get('loc', ()))}: {error.get('msg')}" for error in exc.errors()
        )
        metrics.errors.labels("invalid_request").inc()
        return error_response(422, "invalid_request", problems or "invalid request")

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 405:
            exc.headers = {**(exc.headers or {}), "Allow": _allowed_methods(request.url.path)}
        return responses.http_error(metrics, exc)

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        return responses.unexpected(metrics, exc)

    app.add_exception_handler(ServiceError, service_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)


class _RequestMiddleware:
    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # The first of a repeated header, as Starlette's ``headers.get`` gives it.
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in reversed(scope["headers"])}
        offered = headers.get("x-request-id", "")
        request_id = offered if _REQUEST_ID.match(offered) else unique_id()
        token = REQUEST_ID.set(request_id)
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        settings = self.service.settings
        is_archive = scope["method"] == "PUT" and scope["path"].endswith("/archive")
        limit = settings.max_archive_bytes if is_archive else settings.max_body_bytes
        status = [0]
        started = time.perf_counter()
        try:
            if self._needs_key(scope["path"]) and "preview_target" not in scope:  # a preview checks its own
                try:
                    request_tenant(self.service.auth, scope)
                except ServiceError as exc:  # refused on its headers: the body is never read
                    response = responses.service_error(self.service.metrics, exc)
                    await response(scope, receive, _tagged(send, request_id, status))
                    return
            declared = headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                self.service.metrics.errors.labels("too_large").inc()
                response = error_response(413, "too_large", f"request body larger than {limit} bytes")
                await response(scope, receive, _tagged(send, request_id, status))
                return
            try:
                await self.app(scope, _counted(receive, limit), _tagged(send, request_id, status))
            except Exception as exc:
                if status[0]:  # mid-response: all that can be done is to break the connection
                    raise
                logger.error("unhandled error", exc_info=exc)
                self.service.metrics.errors.labels("internal").inc()
                status[0] = 500
                response = error_response(500, "internal", "internal error; the service log has the request id")
                await response(scope, receive, send)
        finally:
            duration = (time.perf_counter() - started) * 1000
            self.service.metrics.requests.labels(f"{status[0] // 100}xx").inc()
            access_logger.info(
                "%s %s %s",
                scope["method"],
                scope["path"],
                status[0],
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status[0],
                    "duration_ms": round(duration, 3),
                    "tenant": state.get("tenant"),
                },
            )
            REQUEST_ID.reset(token)

    def _needs_key(self, path: str) -> bool:
        """Every ``/v1`` route but the OpenAPI description and the preview paths (which check
        their key, token or publicity themselves); ``/mcp`` when served; ``/metrics`` unless
        configured open."""
        if path.startswith(f"{api.API_PREFIX}/"):
            return path != f"{api.API_PREFIX}/openapi.json" and not PREVIEW_PATH.match(path)
        if path.rstrip("/") == MCP_PATH:
            return self.service.settings.mcp
        return path == "/metrics" and self.service.settings.metrics_access == "key"


def _counted(receive: Receive, limit: int) -> Receive:
    seen = [0]

    async def wrapped() -> Message:
        message = await receive()
        if message["type"] == "http.request":
            seen[0] += len(message.get("body", b""))
            if seen[0] > limit:
                raise BodyTooLarge(limit)
        return message

    return wrapped


def _tagged(send: Send, request_id: str, status: list[int]) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            status[0] = message["status"]
            message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode("latin-1"))]
        await send(message)

    return wrapped
