"""What the sync and async clients share: configuration, requests described as data, the retry
policy, and the conversion of the service's JSON back into the protocol's dataclasses.

Every call is an `Op`: a request plus how to read its answer and whether it may be sent twice.
The sync and async clients differ only in the loop that sends it, so the rules about retries and
errors live here once.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, get_args

import httpx
import pydantic
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from sandboxes import api
from sandboxes import protocol as p
from sandboxes.client._light import DEFAULT_READ as DEFAULT_READ
from sandboxes.client._light import PatienceMethods, capped_grep
from sandboxes.client._light import ProcessStatus as ProcessStatus
from sandboxes.client._light import execute_timeout as execute_timeout
from sandboxes.client._light import may_retry as may_retry
from sandboxes.client._light import recovered as recovered
from sandboxes.client.errors import ConnectionLost, InvalidRequest

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class ClientConfig(PatienceMethods, BaseModel):
    """How to reach the service and how patient to be with it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    api_key: str | None = Field(default=None, repr=False)
    timeout: float = Field(default=300.0, gt=0)
    """Seconds to wait for an answer (and to send a body). Long enough for a command that runs
    until the service's default command timeout; ``execute`` with an explicit timeout waits
    that timeout plus `execute_grace` instead."""
    connect_timeout: float = Field(default=10.0, gt=0)
    retries: int = Field(default=4, ge=0)
    """Extra attempts after the first, for the calls and failures that may be repeated."""
    backoff: float = Field(default=0.25, ge=0)
    """Seconds before the first retry; doubled (with jitter) for each next one."""
    max_backoff: float = Field(default=8.0, ge=0)
    max_retry_after: float = Field(default=60.0, ge=0)
    """A ``Retry-After`` longer than this is not waited for: the error is raised at once."""
    execute_grace: float = Field(default=30.0, ge=0)
    """Seconds beyond a command's own timeout to wait for the service to report it."""
    inline_upload_bytes: int = Field(default=8 << 20, ge=0)
    """``upload_files`` sends bigger files as a streamed tar instead of base64 in JSON."""
    max_batch_bytes: int = Field(default=16 << 20, gt=0)
    """Raw bytes of inline files per upload request; more are split over several requests
    (the service caps JSON bodies, 64 MiB by default)."""
    max_download_bytes: int = Field(default=512 << 20, gt=0)
    """``download_files`` takes files the service does not answer inline (over its
    ``max_inline_download_bytes``) as a streamed tar (``GET /archive``), up to this many bytes
    each, counted as they arrive; bigger ones answer ``file_too_large``."""
    max_batch_download_bytes: int = Field(default=1 << 30, gt=0)
    """What one ``download_files`` batch may stream in all: each file at most its share
    (`sandboxes.semantics.download_share`); a bigger one answers ``file_too_large``."""

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"the service URL must start with http:// or https://, not {value!r}")
        return value


@dataclass(frozen=True, slots=True)
class Op(Generic[T]):
    """One HTTP request and the reading of its answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    json: Any = None
    params: Mapping[str, str] | None = None
    idempotent: bool = False
    """Sending it twice is harmless (GET, DELETE, reads, renew, a create with an
    ``Idempotency-Key``): it may be retried after a failure that can have reached the service.
    Others are retried only when the request certainly never left (`ServiceUnreachable`)."""
    headers: Mapping[str, str] | None = None
    """Sent with it (and with each of its retries), beside the client's own."""
    read_timeout: Any = DEFAULT_READ
    retry: bool = True
    """``False``: one attempt whatever happens (a readiness probe answers now or never)."""
    gone_is_done: bool = False
    """A DELETE retried after a lost answer finds nothing: its first attempt did the work."""
    recover: Callable[[p.ErrorCode, str], T] | None = None
    """For protocol methods: the result carrying an error code, for the failures a local backend
    reports as results too: `ConnectionLost` (``connection_lost``, as every backend reports a
    command or write whose fate is unknown) and `OperationFailed` (a protocol code the service
    answered outside a 200, e.g. a missing ``cwd``)."""

    @property
    def what(self) -> str:
        return f"{self.method} {self.path}"


def model_json(model: type[M], **fields: Any) -> dict[str, Any]:
    """A request body checked against the contract before it leaves."""
    try:
        return model(**fields).model_dump(mode="json")
    except pydantic.ValidationError as exc:
        raise InvalidRequest(f"invalid {model.__name__}: {exc}") from exc


# ---------------------------------------------------------------------- answers -> results


class Answer(Generic[T]):
    """Decodes one route's answer with the type `sandboxes.api` declares for it (the service
    describes the route with the same type); its validator is built once, here."""

    __slots__ = ("_adapter", "_kind", "_name")

    def __init__(self, kind: Any) -> None:
        self._kind = kind
        self._adapter: TypeAdapter[T] | None = None
        self._name = getattr(kind, "__name__", str(kind))

    def __call__(self, response: httpx.Response) -> T:
        return self.decode(response.content)

    def decode(self, raw: bytes | str) -> T:
        if self._adapter is None:
            self._adapter = TypeAdapter(self._kind)
        try:
            return self._adapter.validate_json(raw)
        except pydantic.ValidationError as exc:
            raise InvalidRequest(f"unexpected answer for {self._name}: {exc}") from exc


sandbox_info: Answer[api.SandboxInfo] = Answer(api.SandboxInfo)
_SANDBOX_LIST: Answer[api.SandboxList] = Answer(api.SandboxList)
sandbox_metrics: Answer[api.SandboxMetrics] = Answer(api.SandboxMetrics)
preview_token: Answer[api.PreviewToken] = Answer(api.PreviewToken)
volume_info: Answer[api.VolumeInfo] = Answer(api.VolumeInfo)
_VOLUME_LIST: Answer[api.VolumeList] = Answer(api.VolumeList)


def volume_list(response: httpx.Response) -> list[api.VolumeInfo]:
    return _VOLUME_LIST(response).volumes


ls_result: Answer[p.LsResult] = Answer(api.FILE_RESULTS["ls"])
read_result: Answer[p.ReadResult] = Answer(api.FILE_RESULTS["read"])
write_result: Answer[p.WriteResult] = Answer(api.FILE_RESULTS["write"])
edit_result: Answer[p.EditResult] = Answer(api.FILE_RESULTS["edit"])
delete_result: Answer[p.DeleteResult] = Answer(api.FILE_RESULTS["delete"])
glob_result: Answer[p.GlobResult] = Answer(api.FILE_RESULTS["glob"])
upload_results: Answer[list[p.FileUploadResponse]] = Answer(api.FILE_RESULTS["upload"])
_GREP: Answer[p.GrepResult] = Answer(api.FILE_RESULTS["grep"])
_DOWNLOAD: Answer[list[api.DownloadItem]] = Answer(api.FILE_RESULTS["download"])
_EXECUTE: Answer[api.ExecuteResult] = Answer(api.ExecuteResult)
_PROCESS: Answer[api.ProcessInfo] = Answer(api.ProcessInfo)


def sandbox_list(response: httpx.Response) -> list[api.SandboxInfo]:
    return _SANDBOX_LIST(response).sandboxes


def no_content(response: httpx.Response) -> None:
    return None


def grep_result(response: httpx.Response) -> p.GrepResult:
    """A grep's answer, held to the caps every backend keeps (`capped_grep`)."""
    return capped_grep(_GREP(response))


def download_results(response: httpx.Response) -> list[p.FileDownloadResponse]:
    return [
        p.FileDownloadResponse(
            item.path,
            None if item.content_b64 is None else base64.b64decode(item.content_b64),
            item.error,
            item.message,
        )
        for item in _DOWNLOAD(response)
    ]


def execute_response(result: api.ExecuteResult) -> p.ExecuteResponse:
    return p.ExecuteResponse(
        output=result.output,
        exit_code=result.exit_code,
        truncated=result.truncated,
        error=result.error,
        message=result.message,
        duration_ms=result.duration_ms,
    )


def execute_result(response: httpx.Response) -> p.ExecuteResponse:
    return execute_response(_EXECUTE(response))


def process_status(response: httpx.Response) -> ProcessStatus:
    info = _PROCESS(response)
    result = None if info.result is None else execute_response(info.result)
    return ProcessStatus(
        id=info.id, status=info.status, output=info.output, result=result, stdout=info.stdout, stderr=info.stderr
    )


_STREAM_TYPES = frozenset(get_args(api.StreamEvent.model_fields["type"].annotation))


def stream_event(line: str) -> api.StreamEvent | None:
    """One NDJSON line of a streamed execute; ``None`` for a type this client does not know
    (a newer service's), which it ignores."""
    try:
        return api.StreamEvent.model_validate_json(line)
    except pydantic.ValidationError as exc:
        if _unknown_type(line):
            return None
        raise ConnectionLost(f"malformed stream line: {line[:200]!r}") from exc


def _unknown_type(line: str) -> bool:
    try:
        data = json.loads(line)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("type") not in _STREAM_TYPES


def exit_response(event: api.StreamEvent) -> p.ExecuteResponse:
    """The final response an ``exit`` event carries."""
    if event.result is None:
        raise ConnectionLost("the stream's exit event carried no result")
    return execute_response(event.result)


def failed_execution(code: p.ErrorCode, message: str) -> p.ExecuteResponse:
    return p.ExecuteResponse("", error=code, message=message)


def lost_execution(message: str) -> p.ExecuteResponse:
    return failed_execution(p.CONNECTION_LOST, message)
