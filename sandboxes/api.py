"""The wire contract of the sandbox service, version 1: shared by the server and the client.

It lives at the top of the package, not in ``sandboxes.server``, so the client imports it without
depending on the server (import-linter forbids ``sandboxes.client`` -> ``sandboxes.server``).

Routes (all under ``/v1``, all but health/metrics need ``Authorization: Bearer <api key>``):

    POST   /v1/sandboxes                               CreateSandbox   -> SandboxInfo (201)
    GET    /v1/sandboxes                                               -> SandboxList
    GET    /v1/sandboxes/{id}                                          -> SandboxInfo
    POST   /v1/sandboxes/{id}/renew                     RenewSandbox    -> SandboxInfo
    DELETE /v1/sandboxes/{id}                                          -> 204
    POST   /v1/sandboxes/{id}/execute                   ExecuteRequest  -> ExecuteResult
    POST   /v1/sandboxes/{id}/execute/stream            ExecuteRequest  -> NDJSON of StreamEvent
    GET    /v1/sandboxes/{id}/execute/{cid}/stream?offset=N             -> NDJSON of StreamEvent
                                                                            (re-attach from byte N)
    POST   /v1/sandboxes/{id}/processes                 ExecuteRequest  -> ProcessInfo (202)
    GET    /v1/sandboxes/{id}/processes/{pid}                           -> ProcessInfo
    DELETE /v1/sandboxes/{id}/processes/{pid}                           -> ProcessInfo (killed)
    POST   /v1/sandboxes/{id}/files/{op}                op's request    -> op's result (JSON of the
                                                                            protocol dataclass)
           op in ls, read, write, edit, delete, grep, glob, upload, download
    PUT    /v1/sandboxes/{id}/archive?path=DIR          tar stream      -> 204 (extracted under DIR)
    GET    /v1/sandboxes/{id}/archive?path=PATH                         -> tar stream
    GET    /healthz  /readyz  /metrics

Errors are JSON ``ErrorBody`` with the protocol's vocabulary plus service codes
(``unauthorized``, ``not_found``, ``quota_exceeded``, ``rate_limited``, ``too_large``,
``invalid_request``). A sandbox of another tenant answers ``404 not_found``, like a missing one.
File operation results are the protocol's results (``error`` codes inside a 200): a missing file
is an answer, not an HTTP failure.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "API_PREFIX",
    "FILE_OPERATIONS",
    "CreateSandbox",
    "DeleteRequest",
    "DownloadItem",
    "DownloadRequest",
    "EditRequest",
    "ErrorBody",
    "ExecuteRequest",
    "ExecuteResult",
    "GlobRequest",
    "GrepRequest",
    "LsRequest",
    "ProcessInfo",
    "ReadRequest",
    "RenewSandbox",
    "SandboxInfo",
    "SandboxList",
    "ServiceErrorCode",
    "StreamEvent",
    "UploadItem",
    "UploadRequest",
    "WriteRequest",
]

API_PREFIX = "/v1"

ServiceErrorCode = Literal[
    "unauthorized",
    "not_found",
    "quota_exceeded",
    "rate_limited",
    "too_large",
    "invalid_request",
    "backend_unavailable",
    "internal",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorBody(_Model):
    error: str
    message: str
    request_id: str | None = None


class CreateSandbox(_Model):
    template: str = "default"
    env: dict[str, str] = Field(default_factory=dict)
    ttl: float | None = Field(default=None, gt=0)
    """Seconds; ``None`` takes the template's default. Capped by the service's maximum."""
    labels: dict[str, str] = Field(default_factory=dict)


class RenewSandbox(_Model):
    ttl: float = Field(gt=0)


class SandboxInfo(_Model):
    id: str
    template: str
    backend: Literal["local", "docker", "kubernetes", "ssh"]
    created_at: float
    expires_at: float | None
    labels: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    """Where the sandbox's files live in its path namespace (``/workspace`` in a container, the
    root directory of a local sandbox): the place to write files and run commands."""


class SandboxList(_Model):
    sandboxes: list[SandboxInfo]


class ExecuteRequest(_Model):
    command: str
    timeout: float | None = Field(default=None, ge=0)
    stdin_b64: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    output_limit: int | None = Field(default=None, gt=0)


class ExecuteResult(_Model):
    output: str
    exit_code: int | None
    truncated: bool = False
    error: str | None = None
    message: str | None = None
    duration_ms: float | None = None


class StreamEvent(_Model):
    """One NDJSON line of a streamed execution: ``output`` chunks in order, then one ``exit``.
    An ``output`` with empty ``data`` carries no output: the first line (with the command's
    ``id``), and a keep-alive whenever nothing else was sent for a while. Clients ignore types
    they do not know."""

    type: Literal["output", "exit"]
    data: str | None = None
    result: ExecuteResult | None = None
    id: str | None = None
    """On the first line: the command's id, to re-attach with (``GET .../execute/{id}/stream``)."""
    offset: int | None = None
    """On ``output``: the byte offset in the command's output where the text so far ends, to
    re-attach from without loss or repetition."""


class ProcessInfo(_Model):
    id: str
    status: Literal["running", "exited", "killed", "timeout"]
    output: str = ""
    result: ExecuteResult | None = None


# ---------------------------------------------------------------------- file operation requests


class LsRequest(_Model):
    path: str


class ReadRequest(_Model):
    file_path: str
    offset: int = 0
    limit: int = 2000


class WriteRequest(_Model):
    file_path: str
    content: str


class EditRequest(_Model):
    file_path: str
    old_string: str
    new_string: str
    replace_all: bool = False


class DeleteRequest(_Model):
    file_path: str


class GrepRequest(_Model):
    pattern: str
    path: str | None = None
    glob: str | None = None
    max_count: int | None = None


class GlobRequest(_Model):
    pattern: str
    path: str | None = None


class UploadItem(_Model):
    path: str
    content_b64: str


class UploadRequest(_Model):
    files: list[UploadItem]


class DownloadRequest(_Model):
    paths: list[str]


class DownloadItem(_Model):
    path: str
    content_b64: str | None = None
    error: str | None = None
    message: str | None = None


FILE_OPERATIONS: dict[str, type[_Model]] = {
    "ls": LsRequest,
    "read": ReadRequest,
    "write": WriteRequest,
    "edit": EditRequest,
    "delete": DeleteRequest,
    "grep": GrepRequest,
    "glob": GlobRequest,
    "upload": UploadRequest,
    "download": DownloadRequest,
}
"""Request model per ``/files/{op}``. Responses: the protocol result dataclass as JSON
(``dataclasses.asdict``); for upload a list of FileUploadResponse, for download a list of
DownloadItem."""
