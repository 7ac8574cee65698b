"""What the client shares with the CLI's light path (`sandboxes.cli._fast`) without pydantic,
tenacity nor the API models: the client's patience (timeouts, backoff), the retry policy, the
caps a grep's answer is held to, and a background process's status.

`sandboxes.client._wire` re-exports every name here; this module imports the protocol's
dataclasses alone (httpx where its settings are made), so a CLI call that imports it stays light.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from sandboxes import protocol as p
from sandboxes.client.errors import (
    BackendUnavailable,
    ConnectionLost,
    NotFound,
    OperationFailed,
    QuotaExceeded,
    RateLimited,
    SandboxServiceError,
    ServiceUnreachable,
    error_from_response,
    error_from_transport,
)
from sandboxes.semantics import GREP_MAX_MATCHES, finish_grep

if TYPE_CHECKING:
    import httpx

__all__ = [
    "DEFAULT_READ",
    "KEEPALIVE_EXPIRY",
    "Attempts",
    "Calls",
    "Patience",
    "PatienceMethods",
    "Polling",
    "ProcessStatus",
    "TransportErrors",
    "capped_grep",
    "execute_timeout",
    "limits",
    "may_retry",
    "polled_until_ended",
    "recovered",
    "retry_delay",
    "retry_now",
    "sent",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

KEEPALIVE_EXPIRY = 4.0
"""Seconds a pooled connection is kept: shorter than the server's (uvicorn: 5 s) so a pooled connection is never reused
just as the server closes it: that race would turn a harmless write into `ConnectionLost`."""


@functools.cache
def limits() -> httpx.Limits:
    """The client's connection pool limits."""
    import httpx

    return httpx.Limits(max_connections=100, max_keepalive_connections=32, keepalive_expiry=KEEPALIVE_EXPIRY)


class TransportErrors:
    """``with TransportErrors(what):`` raises httpx's failure of a connection inside it as the
    client's error for the call ``what`` (`error_from_transport`), from the original; any other
    exception passes as it is. Usable around a sync or an awaited read alike."""

    __slots__ = ("_what",)

    def __init__(self, what: str) -> None:
        self._what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            return
        import httpx

        if isinstance(exc, httpx.TransportError):
            raise error_from_transport(exc, self._what) from exc


def sent(http: httpx.Client, request: httpx.Request, *, stream: bool, what: str) -> httpx.Response:
    """``request`` sent on ``http``: a success's response, else the service's error or the
    transport's raised as the client's `SandboxServiceError` (a failed response is read and closed)."""
    with TransportErrors(what):
        response = http.send(request, stream=stream)
    if response.is_success:
        return response
    with contextlib.closing(response), TransportErrors(what):
        if stream:
            response.read()
    raise error_from_response(response)


DEFAULT_READ: Any = object()
"""Marker for "the configured read timeout" in an op's ``read_timeout`` (``None`` means no limit)."""


class Patience(Protocol):
    """The fields of `sandboxes.client.ClientConfig` the retry policy and the timeouts read."""

    @property
    def url(self) -> str: ...
    @property
    def api_key(self) -> str | None: ...
    @property
    def timeout(self) -> float: ...
    @property
    def connect_timeout(self) -> float: ...
    @property
    def backoff(self) -> float: ...
    @property
    def max_backoff(self) -> float: ...
    @property
    def max_retry_after(self) -> float: ...
    @property
    def execute_grace(self) -> float: ...


class Calls(Protocol):
    """What the retry policy reads of a call (`sandboxes.client._wire.Op`'s fields)."""

    @property
    def retry(self) -> bool: ...
    @property
    def idempotent(self) -> bool: ...


class Retried(Calls, Protocol):
    """What `Attempts` reads of a call: the retry policy's fields, and whether a `NotFound`
    after a lost answer means the call took effect (a delete)."""

    @property
    def gone_is_done(self) -> bool: ...


class Recovers(Protocol[T_co]):
    """What `recovered` reads of a call: the result standing for a failure, if it has one."""

    @property
    def recover(self) -> Callable[[p.ErrorCode, str], T_co] | None: ...


class PatienceMethods:
    """How a configuration's fields become httpx's settings: one definition for the client's
    `ClientConfig` and the CLI's light configuration."""

    def httpx_timeout(self: Patience, read: object) -> httpx.Timeout:
        import httpx

        chosen = self.timeout if read is DEFAULT_READ else cast("float | None", read)
        return httpx.Timeout(self.timeout, connect=self.connect_timeout, read=chosen, pool=self.timeout)

    def headers(self: Patience) -> dict[str, str]:
        headers = {"user-agent": "sandboxes-client/1"}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        return headers

    def base_url(self: Patience) -> str:
        return self.url.rstrip("/")

    def pool_settings(self: Patience, pool_limits: httpx.Limits | None = None) -> dict[str, Any]:
        """The keyword arguments of the client's httpx pool: its URL, headers, timeouts and limits."""
        return {
            "base_url": PatienceMethods.base_url(self),
            "headers": PatienceMethods.headers(self),
            "timeout": PatienceMethods.httpx_timeout(self, DEFAULT_READ),
            "limits": limits() if pool_limits is None else pool_limits,
        }


def may_retry(op: Calls, exc: BaseException) -> bool:
    """Whether this failure of this call may be answered by sending the call again."""
    if not op.retry:
        return False
    if isinstance(exc, ServiceUnreachable):
        return True  # nothing was sent: safe for every call
    if not op.idempotent:
        return False  # a command, write or upload never runs twice
    if isinstance(exc, QuotaExceeded):  # a 429 says when room may be made; a 403 that none will
        return exc.retry_after is not None
    return isinstance(exc, RateLimited | BackendUnavailable | ConnectionLost)


def retry_now(config: Patience, op: Calls, exc: BaseException) -> bool:
    """Whether to send ``op`` again after ``exc``: allowed, and not told to wait too long."""
    if not may_retry(op, exc):
        return False
    hint: float | None = getattr(exc, "retry_after", None)
    return hint is None or hint <= config.max_retry_after


def retry_delay(config: Patience, attempt: int, exc: BaseException | None) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (from 1): the service's
    ``Retry-After`` if it gave one, else exponential backoff with jitter."""
    hint: float | None = getattr(exc, "retry_after", None)
    if hint is not None:
        return hint
    ceiling = min(config.max_backoff, config.backoff * 2.0 ** (attempt - 1))
    return ceiling / 2 + random.uniform(0, ceiling / 2)  # noqa: S311 - jitter, not secrets


class Attempts:
    """The attempts of one call, as the sync and async connections make them: the first, then
    one more after each failure `retry_now` allows, ``retries`` more at the most, each after
    `retry_delay`. Once an attempt's connection was lost, a `NotFound` answers a
    ``gone_is_done`` call as done: the lost attempt did what the call asked."""

    __slots__ = ("_config", "_made", "_maybe_done", "_op", "_retries")

    def __init__(self, config: Patience, op: Retried, retries: int) -> None:
        self._config, self._op, self._retries = config, op, retries
        self._made = 1
        self._maybe_done = False

    def after(self, exc: SandboxServiceError) -> float | None:
        """Seconds to wait before the next attempt, the last one having failed with ``exc``;
        ``None``: the call is done all the same; raises ``exc`` when no attempt is left."""
        if isinstance(exc, ConnectionLost):
            self._maybe_done = True
        elif isinstance(exc, NotFound) and self._maybe_done and self._op.gone_is_done:
            return None
        if self._made > self._retries or not retry_now(self._config, self._op, exc):
            raise exc
        delay = retry_delay(self._config, self._made, exc)
        self._made += 1
        return delay


def recovered(op: Recovers[T], exc: SandboxServiceError) -> T:
    """The result standing for ``exc`` when ``op`` has one; re-raises ``exc`` otherwise."""
    if op.recover is not None:
        if isinstance(exc, ConnectionLost):
            return op.recover(p.CONNECTION_LOST, exc.message)
        if isinstance(exc, OperationFailed):
            return op.recover(cast("p.ErrorCode", exc.code), exc.message)
    raise exc


def execute_timeout(config: Patience, timeout: float | None) -> Any:
    """How long to wait for ``execute``'s answer: the command's own timeout plus a grace."""
    if timeout is None:
        return DEFAULT_READ
    if timeout == 0:
        return None  # the command may run forever; so may the wait
    return max(config.timeout, timeout + config.execute_grace)


def capped_grep(result: p.GrepResult) -> p.GrepResult:
    """A grep's answer held to the caps every backend keeps (`finish_grep`) whatever the service
    sent: past them the first matches, ``truncated``."""
    if result.matches is None:
        return result
    kept = finish_grep(result.matches[: GREP_MAX_MATCHES + 1], None)
    truncated = result.truncated or kept.truncated or len(result.matches) > GREP_MAX_MATCHES
    return p.GrepResult(result.error, result.message, matches=kept.matches, truncated=truncated)


@dataclass(frozen=True, slots=True)
class ProcessStatus:
    """A background command: its output so far, and its ``result`` once it has ended.
    ``stdout`` and ``stderr`` are its streams apart; ``output`` is both as one text (the stdout,
    then the stderr), as the result's is."""

    id: str
    status: str
    """``running``, ``exited``, ``killed`` or ``timeout``."""
    output: str = ""
    result: p.ExecuteResponse | None = None
    stdout: str = ""
    stderr: str = ""

    @property
    def running(self) -> bool:
        return self.status == "running"


class Polling:
    """When polling a background process stops, for the sync and async handles alike: once a
    status says it ended, or once ``timeout`` seconds passed (``None``: no limit) whatever the
    last status said."""

    __slots__ = ("_deadline",)

    def __init__(self, timeout: float | None) -> None:
        self._deadline = None if timeout is None else time.monotonic() + timeout

    def goes_on(self, status: ProcessStatus) -> bool:
        """Whether to poll again after ``status``."""
        return status.running and (self._deadline is None or time.monotonic() < self._deadline)


def polled_until_ended(poll: Callable[[], ProcessStatus], timeout: float | None, interval: float) -> ProcessStatus:
    """``poll``'s status once its process has ended, asked every ``interval`` seconds; after
    ``timeout`` seconds (``None``: no limit), the last status, running or not."""
    polling = Polling(timeout)
    while True:
        status = poll()
        if not polling.goes_on(status):
            return status
        time.sleep(interval)
