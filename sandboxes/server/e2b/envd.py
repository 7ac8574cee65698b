"""The E2B envd plane's HTTP side (``/e2b/envd``): each request names its sandbox in
``E2b-Sandbox-Id`` and proves access with that sandbox's own ``X-Access-Token`` (never an API
key); an unknown or ended sandbox is a 502, as E2B's proxy answers. ``/health`` and ``/files``
(read and write through the sandbox's download and upload, relative paths under its workdir)."""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Callable
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from sandboxes import protocol as p
from sandboxes.server.auth import Tenant
from sandboxes.server.e2b.common import ENVD_PREFIX, E2BRoute, e2b_state, service
from sandboxes.server.errors import ServiceError
from sandboxes.server.registry import Entry

__all__ = ["access", "in_lane", "router"]

router = APIRouter(prefix=ENVD_PREFIX, route_class=E2BRoute, include_in_schema=False)

ENVD_PORT = "49983"
_T = TypeVar("_T")


async def access(request: Request) -> Entry:
    """The sandbox this envd request is for, if its access token is that sandbox's."""
    sandbox_id = request.headers.get("e2b-sandbox-id", "")
    port = request.headers.get("e2b-sandbox-port", ENVD_PORT)
    token = request.headers.get("x-access-token", "")
    if not sandbox_id:
        raise ServiceError("invalid_request", "missing E2b-Sandbox-Id header", status=400)
    if port != ENVD_PORT:
        raise ServiceError("backend_unavailable", f"port {port} of sandbox {sandbox_id} is not served", status=502)
    svc = service(request)
    tenant_id = e2b_state(request).signer.tenant_of(token, sandbox_id) if token else None
    if tenant_id is None:
        raise ServiceError("unauthorized", "missing or wrong X-Access-Token for this sandbox", status=401)
    tenant = Tenant(tenant_id, svc.settings.policy_for(tenant_id))
    request.scope.setdefault("state", {})["tenant"] = tenant_id
    svc.limiter.check(tenant)
    try:
        return await svc.registry.awake(await svc.registry.find(tenant, sandbox_id))
    except ServiceError as exc:
        if exc.code == "not_found":
            raise ServiceError("not_found", f"The sandbox {sandbox_id} was not found", status=502) from None
        if exc.code == "paused":  # what envd answers for a paused sandbox: the SDK's is_running() is False
            raise ServiceError("paused", exc.message, status=502) from None
        raise


async def in_lane(request: Request, entry: Entry, call: Callable[[], _T]) -> _T:
    """``call`` in a worker thread, in the tenant's file lane; a backend failure is a 502."""
    svc = service(request)
    tenant = entry.state.tenant
    try:
        return await svc.file_lanes.run(tenant, svc.settings.policy_for(tenant).max_file_operations, call)
    except ServiceError:
        raise
    except Exception as exc:
        raise ServiceError(
            "backend_unavailable", f"the sandbox's backend failed: {type(exc).__name__}", status=502
        ) from exc


@router.get("/health")
async def health(request: Request) -> Response:
    await access(request)
    return Response(status_code=204)


_FILE_STATUS = {
    p.FILE_NOT_FOUND: 404,
    p.PERMISSION_DENIED: 403,
    p.IS_DIRECTORY: 400,
    p.INVALID_PATH: 400,
    p.FILE_TOO_LARGE: 413,
    p.NO_SPACE: 507,
}


def _file_error(error: p.ErrorCode, message: str | None, path: str) -> ServiceError:
    status = _FILE_STATUS.get(error, 500)
    return ServiceError(error, message or f"{error}: {path}", status=status)


def _absolute(entry: Entry, path: str | None) -> str:
    if not path:
        raise ServiceError("invalid_request", "missing path", status=400)
    return path if path.startswith("/") else posixpath.join(entry.state.workdir or "/", path)


@router.get("/files")
async def read_file(request: Request, path: str | None = None) -> Response:
    """The file's bytes; up to the service's inline download limit."""
    entry = await access(request)
    absolute = _absolute(entry, path)
    limit = entry.backend.settings.max_inline_download_bytes
    found = (await in_lane(request, entry, functools.partial(entry.sandbox.download_files_within, [absolute], limit)))[
        0
    ]
    if found.error is not None or found.content is None:
        raise _file_error(found.error or "file_not_found", found.message, absolute)
    return Response(found.content, media_type="application/octet-stream")


@router.post("/files")
async def write_files(request: Request, path: str | None = None) -> Response:
    """Multipart (field ``file``, its filename the path unless ``?path=`` names the one file)
    or one ``application/octet-stream`` body to ``?path=``; parent directories are created."""
    entry = await access(request)
    body = await request.body()
    media = request.headers.get("content-type", "")
    if media.startswith("multipart/form-data"):
        files = _multipart(media, body, path)
    elif media.startswith("application/octet-stream"):
        files = [(path or "", body)]
    else:
        raise ServiceError("invalid_request", f"unsupported Content-Type {media!r}", status=400)
    files = [(_absolute(entry, name), data) for name, data in files]
    results = await in_lane(request, entry, functools.partial(entry.sandbox.upload_files, files))
    for result in results:
        if result.error is not None:
            raise _file_error(result.error, result.message, result.path)
    answer: list[dict[str, Any]] = [
        {"path": name, "name": posixpath.basename(name), "type": "file"} for name, _ in files
    ]
    return JSONResponse(answer)


def _multipart(media: str, body: bytes, path: str | None) -> list[tuple[str, bytes]]:
    head = f"Content-Type: {media}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = BytesParser(policy=policy.HTTP).parsebytes(head + body)
    if not isinstance(message, EmailMessage) or not message.is_multipart():
        raise ServiceError("invalid_request", "malformed multipart body", status=400)
    parts = [part for part in message.iter_parts() if part.get_param("name", header="content-disposition") == "file"]
    if path is not None and len(parts) != 1:
        raise ServiceError("invalid_request", "?path= names one file, the body has several", status=400)
    files: list[tuple[str, bytes]] = []
    for part in parts:
        name = path if path is not None else part.get_filename()
        data = part.get_payload(decode=True)
        if not name or not isinstance(data, bytes):
            raise ServiceError("invalid_request", "a file part without a path", status=400)
        files.append((name, data))
    if not files:
        raise ServiceError("invalid_request", "no file part in the multipart body", status=400)
    return files
