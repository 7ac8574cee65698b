"""What both E2B planes share: their state on the app, and failures answered in E2B's shape
(``{code, message}`` with the HTTP status as ``code``), never the service's own error body."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from sandboxes.server.e2b.landing import Landings
from sandboxes.server.e2b.recorded import RecordedSandboxes
from sandboxes.server.e2b.running import RunningCommands
from sandboxes.server.e2b.tokens import E2BSettings, TokenSigner
from sandboxes.server.errors import ServiceError
from sandboxes.server.routes import Service

__all__ = [
    "ENVD_PREFIX",
    "PREFIX",
    "E2BRoute",
    "E2BState",
    "PortAccess",
    "e2b_error",
    "e2b_state",
    "port_access",
    "service",
]

logger = logging.getLogger(__name__)

PREFIX = "/e2b"
"""Where the control plane is served; the envd plane is under `ENVD_PREFIX`."""
ENVD_PREFIX = f"{PREFIX}/envd"

MAX_POLLED_WATCHERS = 4096
"""Polled watchers whose write landings are followed at once (the oldest forgotten past it)."""
ENVD_VERSION = "0.6.4"
"""The envd version advertised: the SDK then sends no user (the template's applies), closes a
command's stdin (0.5.2), uploads octet-stream and gzip bodies (0.5.7), file metadata (0.6.2), watch
events' entries (0.6.3) and a watch's ``allow_network_mounts`` (0.6.4: the service watches a
network mount whether asked or not, so the flag it lets through changes nothing)."""


@dataclass(frozen=True)
class PortAccess:
    """How a sandbox's ports other than envd's are reached, as its create's ``network`` asked
    (its state's `SandboxState.public_ports` and ``mask_request_host``): without its token
    (``public``), and with which ``Host`` (``mask``, ``${PORT}`` replaced)."""

    tenant: str
    public: bool | None = None
    mask: str | None = None

    def host(self, port: int) -> str | None:
        return None if self.mask is None else self.mask.replace("${PORT}", str(port))


async def port_access(request: Request, sandbox_id: str) -> PortAccess | None:
    """How the sandbox's ports are reached, as set through any replica sharing the data directory
    (`Holdings.network_of`); ``None``: nothing says (its token needed)."""
    state = await service(request).registry.network_of(sandbox_id)
    if state is None:
        return None
    return PortAccess(state.tenant, state.public_ports, state.mask_request_host)


@dataclass
class E2BState:
    """What the E2B API keeps on ``app.state.e2b``: its settings, its token signer, the
    commands started through envd while they run, each polled watcher's `Landings`, and the
    last read of the records signed `/files` requests look sandboxes up in."""

    settings: E2BSettings
    signer: TokenSigner
    commands: RunningCommands = field(default_factory=RunningCommands)
    recorded: RecordedSandboxes = field(default_factory=RecordedSandboxes)
    _landings: dict[tuple[str, str], Landings] = field(default_factory=dict)

    def landings(self, sandbox_id: str, watcher_id: str) -> Landings:
        """The polled watcher's `Landings`, kept across its polls."""
        key = (sandbox_id, watcher_id)
        if key not in self._landings and len(self._landings) >= MAX_POLLED_WATCHERS:
            del self._landings[next(iter(self._landings))]
        return self._landings.setdefault(key, Landings())

    def forget_landings(self, sandbox_id: str, watcher_id: str) -> None:
        self._landings.pop((sandbox_id, watcher_id), None)

    def ours(self, template: str) -> str:
        """The service's template for an E2B template name."""
        return self.settings.templates.get(template, template)

    def theirs(self, template: str) -> str:
        """The E2B name a sandbox of the service's ``template`` is reported with."""
        return next((name for name, ours in self.settings.templates.items() if ours == template), template)


def e2b_state(request: Request) -> E2BState:
    state: E2BState = request.app.state.e2b
    return state


def service(request: Request) -> Service:
    svc: Service = request.app.state.service
    return svc


def e2b_error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=headers)


class E2BRoute(APIRoute):
    """A route whose failures are answered in E2B's shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except ServiceError as exc:
                return e2b_error(exc.status, exc.message, exc.headers)
            except (RequestValidationError, ValidationError) as exc:
                return e2b_error(400, _problems(exc.errors()))
            except HTTPException as exc:
                return e2b_error(exc.status_code, str(exc.detail), dict(exc.headers or {}))

        return handle


def _problems(errors: Any) -> str:
    parts = [f"{'.'.join(str(part) for part in error.get('loc', ()))}: {error.get('msg')}" for error in errors]
    return "; ".join(parts) or "invalid request"
