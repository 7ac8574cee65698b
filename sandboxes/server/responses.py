"""The service's answers as bytes: JSON bodies, and the `ErrorBody` of each kind of failure.

Shared by FastAPI's exception handlers and the request middleware: one function per failure
kind, so every path answers the same failure with the same status, code, message, headers and
metric.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pydantic_core
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from sandboxes import api
from sandboxes.server.errors import ServiceError, code_for_status
from sandboxes.server.logs import REQUEST_ID
from sandboxes.server.metrics import Metrics

logger = logging.getLogger("sandboxes.server.app")

JSON = "application/json"

PARSE_INLINE = 32 << 10
"""Bodies up to this size are parsed on the event loop; bigger ones in a worker thread."""


def parse_json(raw: bytes) -> Any:
    """A request body's JSON, as every route parses it (`routes._JSONRequest`).

    pydantic-core's parser, not ``json.loads``: it refuses lone surrogates (which no path or
    command can carry to a sandbox) and nesting past a fixed depth (``json.loads`` raises
    ``RecursionError`` there, an internal error) as malformed JSON, so both are a 422."""
    try:
        return pydantic_core.from_json(raw, cache_strings=False)
    except ValueError as exc:
        raise json.JSONDecodeError(str(exc), "", 0) from None


async def parse_json_off_loop(raw: bytes) -> Any:
    """`parse_json`, in a worker thread when the body is big enough to hold up the loop."""
    if len(raw) <= PARSE_INLINE:
        return parse_json(raw)
    return await asyncio.to_thread(parse_json, raw)


def to_json(data: Any) -> bytes:
    """Compact JSON of a pydantic model, protocol dataclass, or lists/dicts of them.

    pydantic-core serialises in Rust, without walking the dataclasses in Python and
    ``json.dumps``, for the same bytes (compact, UTF-8 unescaped, as Starlette's
    `JSONResponse` writes)."""
    return pydantic_core.to_json(data)


def json_response(body: bytes, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type=JSON)


def error_response(
    status: int, code: api.WireErrorCode, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = api.ErrorBody(error=code, message=message, request_id=REQUEST_ID.get())
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def service_error(metrics: Metrics, exc: ServiceError) -> JSONResponse:
    metrics.errors.labels(exc.code).inc()
    return error_response(exc.status, exc.code, exc.message, exc.headers)


def http_error(metrics: Metrics, exc: HTTPException) -> JSONResponse:
    """A failure raised by the framework (unknown route, bad method, a body over the limit)."""
    code = code_for_status(exc.status_code)
    metrics.errors.labels(code).inc()
    message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    return error_response(exc.status_code, code, message, dict(exc.headers or {}))


def unexpected(metrics: Metrics, exc: Exception) -> JSONResponse:
    logger.error("unhandled error", exc_info=exc)
    metrics.errors.labels("internal").inc()
    return error_response(500, "internal", "internal error; the service log has the request id")
