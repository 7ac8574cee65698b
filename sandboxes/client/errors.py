"""Exceptions of the sandbox service client, one class per service error code.

Programs catch by class (``except QuotaExceeded``) instead of parsing HTTP statuses; every
exception still carries the raw ``code``, ``status`` and ``request_id`` so an operator can find
the request in the service's logs. Two classes have no HTTP status because no answer came back:
`ServiceUnreachable` (the request never left: safe to send again) and `ConnectionLost` (it may
have reached the service: its outcome is unknown).
"""

from __future__ import annotations

import email.utils
import time
import typing
from typing import TYPE_CHECKING, Any

from sandboxes.protocol import ErrorCode

if TYPE_CHECKING:
    import httpx

__all__ = [
    "BackendUnavailable",
    "ConnectionLost",
    "InternalError",
    "InvalidRequest",
    "NotFound",
    "OperationFailed",
    "QuotaExceeded",
    "RateLimited",
    "SandboxServiceError",
    "ServiceUnreachable",
    "TooLarge",
    "Unauthorized",
    "error_from_response",
    "error_from_transport",
]


class SandboxServiceError(Exception):
    """The service refused or failed a request; ``code`` is its ``ErrorBody.error``."""

    default_code = "error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.status = status
        self.request_id = request_id

    def __str__(self) -> str:
        where = [f"HTTP {self.status}"] if self.status is not None else []
        if self.request_id:
            where.append(f"request {self.request_id}")
        suffix = f" ({', '.join(where)})" if where else ""
        return f"{self.code}: {self.message}{suffix}"


class Unauthorized(SandboxServiceError):
    """Missing, unknown or revoked API key."""

    default_code = "unauthorized"


class NotFound(SandboxServiceError, LookupError):
    """No such sandbox for this tenant (the service answers the same for another tenant's id).
    A `LookupError` too, as `Provider.attach` raises for a sandbox that does not exist."""

    default_code = "not_found"


class QuotaExceeded(SandboxServiceError):
    """The tenant's live sandboxes, cpu or memory allowance would be exceeded. ``retry_after``:
    seconds until room may be made (HTTP 429: creations under way, or the first sandbox's
    expiry); ``None`` (HTTP 403) where no waiting helps."""

    default_code = "quota_exceeded"

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class RateLimited(SandboxServiceError):
    """Too many requests; ``retry_after`` is the service's hint in seconds, when it gave one."""

    default_code = "rate_limited"

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class TooLarge(SandboxServiceError):
    """A request body or an output over the service's size limits."""

    default_code = "too_large"


class InvalidRequest(SandboxServiceError):
    """The request does not fit the API (bad template, bad field); a bug on the caller's side."""

    default_code = "invalid_request"


class BackendUnavailable(SandboxServiceError):
    """The service is up but its sandbox backend (Docker, ...) is not answering."""

    default_code = "backend_unavailable"

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class InternalError(SandboxServiceError):
    """A bug in the service: the request id leads to its log line."""

    default_code = "internal"


class OperationFailed(SandboxServiceError):
    """The sandbox refused the operation with a protocol code (``code`` is an ``ErrorCode``,
    e.g. ``file_not_found`` for an archive of a missing path)."""

    default_code = "backend_error"


class Paused(SandboxServiceError):
    """The sandbox is paused: `RemoteSandbox.resume` it first (or create it with ``auto_resume``)."""

    default_code = "paused"


class SnapshotMismatch(SandboxServiceError):
    """A snapshot, or the sandbox restored from it, differs from its manifest; the message
    names what differs. No sandbox was left."""

    default_code = "snapshot_mismatch"


class ServiceUnreachable(SandboxServiceError):
    """The request never reached the service (refused connection, DNS, connect timeout)."""

    default_code = "unavailable"


class ConnectionLost(SandboxServiceError):
    """The connection failed after the request may have been sent: whether it ran is unknown."""

    default_code = "connection_lost"


_BY_CODE: dict[str, type[SandboxServiceError]] = {
    cls.default_code: cls
    for cls in (
        Unauthorized,
        NotFound,
        QuotaExceeded,
        RateLimited,
        TooLarge,
        InvalidRequest,
        BackendUnavailable,
        InternalError,
        Paused,
        SnapshotMismatch,
    )
}

_PROTOCOL_CODES = frozenset(typing.get_args(ErrorCode))

_BY_STATUS: dict[int, type[SandboxServiceError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    404: NotFound,
    413: TooLarge,
    422: InvalidRequest,
    429: RateLimited,
    500: InternalError,
    502: BackendUnavailable,
    503: BackendUnavailable,
    504: BackendUnavailable,
}
"""For answers without an ``ErrorBody`` (a proxy in front of the service, a framework default)."""


def error_from_response(response: httpx.Response) -> SandboxServiceError:
    """The exception for a non-2xx answer, whatever its body looks like."""
    code, message, request_id = _parse_body(response)
    request_id = request_id or response.headers.get("x-request-id")
    cls = _BY_CODE.get(code) if code else None
    if cls is None and code in _PROTOCOL_CODES:
        cls = OperationFailed
    if cls is None:
        cls = _BY_STATUS.get(response.status_code, SandboxServiceError)
    kwargs: dict[str, Any] = {"code": code, "status": response.status_code, "request_id": request_id}
    if cls in (RateLimited, BackendUnavailable, QuotaExceeded):
        kwargs["retry_after"] = parse_retry_after(response.headers.get("retry-after"))
    return cls(message, **kwargs)


def _parse_body(response: httpx.Response) -> tuple[str | None, str, str | None]:
    """An `ErrorBody`'s code, message and request id; for any other body (a proxy's, a code a
    newer service added) what can be read of it. The API's models are imported here, on an
    error's path only: a call that succeeds never needs them."""
    import pydantic

    from sandboxes import api

    try:
        error = api.ErrorBody.model_validate_json(response.content)
    except pydantic.ValidationError:
        pass
    else:
        return error.error, error.message, error.request_id
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        message = body.get("message")
        request_id = body.get("request_id")
        return (
            body["error"],
            message if isinstance(message, str) else body["error"],
            request_id if isinstance(request_id, str) else None,
        )
    if isinstance(body, dict) and "detail" in body:  # a framework-generated error
        return None, str(body["detail"])[:2000], None
    text = response.text.strip()[:2000] if response.content else ""
    return None, text or response.reason_phrase or f"HTTP {response.status_code}", None


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds from now: either a number of seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def error_from_transport(exc: httpx.TransportError, what: str) -> SandboxServiceError:
    """Classify a transport failure by whether the request can have reached the service.

    A connect failure (or waiting for a pooled connection) happens before a byte of the request
    is sent; anything later (read timeout, reset, a closed connection) may come after the service
    has started acting on it.
    """
    import httpx  # imported by whoever raised ``exc``

    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout | httpx.UnsupportedProtocol):
        return ServiceUnreachable(f"{what}: the service cannot be reached: {_describe(exc)}")
    return ConnectionLost(f"{what}: the connection failed, the outcome is unknown: {_describe(exc)}")


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
