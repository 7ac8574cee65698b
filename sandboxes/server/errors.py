"""The service's failures, as one exception type the app turns into an `ErrorBody`.

Routes raise `ServiceError` with a code from the wire vocabulary (`api.ServiceErrorCode` or a
protocol `ErrorCode`), so the HTTP status and the code can never disagree between routes.
"""

from __future__ import annotations

from collections.abc import Mapping

from sandboxes.api import WireErrorCode

_STATUS: dict[WireErrorCode, int] = {
    "unauthorized": 401,
    "not_found": 404,
    "quota_exceeded": 403,
    "rate_limited": 429,
    "too_large": 413,
    "invalid_request": 422,
    "backend_unavailable": 503,
    "internal": 500,
    "snapshot_mismatch": 422,
    # protocol codes that a route may answer with outside a 200 (archives, cwd checks)
    "file_not_found": 404,
    "invalid_path": 422,
    "permission_denied": 403,
    "not_a_directory": 422,
    "is_directory": 422,
    "no_space": 507,
    "paused": 409,
    "file_changed": 409,
    "unavailable": 501,
}


class ServiceError(Exception):
    def __init__(
        self, code: WireErrorCode, message: str, *, headers: Mapping[str, str] | None = None, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status or _STATUS.get(code, 400)
        """The code's status, unless one of its other statuses is given (``quota_exceeded``:
        403 when waiting cannot help, 429 when it can)."""
        self.headers = dict(headers or {})


def not_found(sandbox_id: str) -> ServiceError:
    """One answer for "missing" and "someone else's", so ids leak nothing across tenants."""
    return ServiceError("not_found", f"no sandbox {sandbox_id!r}")


_FRAMEWORK: dict[int, WireErrorCode] = {
    401: "unauthorized",
    404: "not_found",
    413: "too_large",
    429: "rate_limited",
    503: "backend_unavailable",
}


def code_for_status(status: int) -> WireErrorCode:
    """The code of a failure raised by the framework itself (unknown route, bad method...)."""
    return _FRAMEWORK.get(status, "invalid_request" if 400 <= status < 500 else "internal")
