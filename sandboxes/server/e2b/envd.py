"""The E2B envd plane's HTTP side (``/e2b/envd``): each request names its sandbox in
``E2b-Sandbox-Id`` and proves access with that sandbox's own ``X-Access-Token`` (never an API
key); an unknown or ended sandbox is a 502, as E2B's proxy answers. ``/health`` and ``/files``
(read and write through the sandbox's download and upload, relative paths under its workdir)."""

from __future__ import annotations

import functools
import posixpath
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.formparsers import MultiPartException

from sandboxes import protocol as p
from sandboxes.server.auth import Tenant
from sandboxes.server.e2b.common import ENVD_PREFIX, E2BRoute, e2b_state, service
from sandboxes.server.e2b.metadata import from_headers, set_call, set_failure
from sandboxes.server.e2b.signed import Operation, signed_sandbox
from sandboxes.server.errors import ServiceError
from sandboxes.server.registry import Entry

__all__ = ["access", "in_lane", "router", "signed_router"]

router = APIRouter(prefix=ENVD_PREFIX, route_class=E2BRoute, include_in_schema=False)
signed_router = APIRouter(route_class=E2BRoute, include_in_schema=False)
"""The root ``/files`` the SDK's signed URLs name (`sandboxes.server.e2b.signed`)."""

ENVD_PORT = "49983"
MAX_FILES = 1000
"""The most parts a multipart upload may have (Starlette's default)."""
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
    p.INVALID_ARGUMENT: 400,
    p.FILE_TOO_LARGE: 413,
    p.NO_SPACE: 507,
    p.UNAVAILABLE: 502,
}


def _file_error(error: p.ErrorCode, message: str | None, path: str) -> ServiceError:
    status = _FILE_STATUS.get(error, 500)
    return ServiceError(error, message or f"{error}: {path}", status=status)


def _absolute(entry: Entry, path: str | None) -> str:
    if not path:
        raise ServiceError("invalid_request", "missing path", status=400)
    return path if path.startswith("/") else posixpath.join(entry.state.workdir or "/", path)


async def _files_access(request: Request, path: str | None, operation: Operation) -> Entry:
    """The sandbox of a ``/files`` request: by its access token, or by a signed URL's query."""
    unsigned = "signature" not in request.query_params and request.url.path.startswith(ENVD_PREFIX)
    if request.headers.get("x-access-token") or unsigned:
        return await access(request)
    return await signed_sandbox(request, path or "", operation)


@router.get("/files")
@signed_router.get("/files")
async def read_file(request: Request, path: str | None = None) -> Response:
    """The file's bytes; up to the service's inline download limit."""
    entry = await _files_access(request, path, "read")
    absolute = _absolute(entry, path)
    limit = entry.backend.settings.max_inline_download_bytes
    found = (await in_lane(request, entry, functools.partial(entry.sandbox.download_files_within, [absolute], limit)))[
        0
    ]
    if found.error is not None or found.content is None:
        raise _file_error(found.error or "file_not_found", found.message, absolute)
    return Response(found.content, media_type="application/octet-stream")


@router.post("/files")
@signed_router.post("/files")
async def write_files(request: Request, path: str | None = None) -> Response:
    """Multipart (field ``file``, its filename the path unless ``?path=`` names the one file)
    or one ``application/octet-stream`` body to ``?path=``; parent directories are created."""
    entry = await _files_access(request, path, "write")
    try:
        metadata = from_headers(request.headers)
    except ValueError as exc:
        raise ServiceError("invalid_request", str(exc), status=400) from None
    media = request.headers.get("content-type", "")
    if media.startswith("multipart/form-data"):
        files = await _multipart(request, path)
    elif media.startswith("application/octet-stream"):
        body = await request.body()
        if request.headers.get("content-encoding", "identity").lower() == "gzip":
            body = _gunzipped(body, service(request).settings.max_body_bytes)
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
    if metadata:
        names = [name for name, _ in files]
        response = await in_lane(request, entry, functools.partial(entry.sandbox.run_call, set_call(names, metadata)))
        failure = set_failure(response, names[0])
        if failure is not None:
            raise _file_error(failure[0], failure[1], names[0])
        for item in answer:
            item["metadata"] = metadata
    return JSONResponse(answer)


def _gunzipped(body: bytes, limit: int) -> bytes:
    """A gzip body's bytes, refused past ``limit`` (read no further) or when malformed."""
    inflater = zlib.decompressobj(wbits=31)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ServiceError("invalid_request", f"malformed gzip body: {exc}", status=400) from None
    if len(data) > limit:
        raise ServiceError("too_large", f"the gzip body inflates past {limit} bytes", status=413)
    if not inflater.eof:
        raise ServiceError("invalid_request", "the gzip body is cut short", status=400)
    return data


async def _multipart(request: Request, path: str | None) -> list[tuple[str, bytes]]:
    """The ``file`` parts of a multipart body, each with its path (its filename, or ``path``)."""
    try:
        form = await request.form(max_files=MAX_FILES, max_fields=MAX_FILES)
    except (MultiPartException, AssertionError) as exc:
        raise ServiceError("invalid_request", f"malformed multipart body: {exc}", status=400) from exc
    try:
        parts = form.getlist("file")
        if path is not None and len(parts) != 1:
            raise ServiceError("invalid_request", "?path= names one file, the body has several", status=400)
        files: list[tuple[str, bytes]] = []
        for part in parts:
            if isinstance(part, str):  # a part without a filename
                name, data = path, part.encode("utf-8")
            else:
                name, data = path if path is not None else part.filename, await part.read()
            if not name:
                raise ServiceError("invalid_request", "a file part without a path", status=400)
            files.append((name, data))
    finally:
        await form.close()
    if not files:
        raise ServiceError("invalid_request", "no file part in the multipart body", status=400)
    return files
