"""The wire contract of the sandbox service, version 1: shared by the server and the client.

It lives at the top of the package, not in ``sandboxes.server``, so the client imports it without
depending on the server (import-linter forbids ``sandboxes.client`` -> ``sandboxes.server``).

Routes (all under ``/v1``, all but health/metrics need ``Authorization: Bearer <api key>``):

    POST   /v1/sandboxes                               CreateSandbox   -> SandboxInfo (201)
    GET    /v1/sandboxes                                               -> SandboxList
    GET    /v1/sandboxes/{id}                                          -> SandboxInfo
    POST   /v1/sandboxes/{id}/renew                     RenewSandbox    -> SandboxInfo
    DELETE /v1/sandboxes/{id}                                          -> 204
    POST   /v1/sandboxes/{id}/pause                     PauseSandbox    -> SandboxInfo (paused)
    POST   /v1/sandboxes/{id}/resume                                    -> SandboxInfo (running)
    POST   /v1/sandboxes/{id}/snapshots                 CreateSnapshot  -> SnapshotInfo (201)
    POST   /v1/sandboxes/{id}/fork                      ForkSandbox     -> ForkResult (201)
    GET    /v1/snapshots                                               -> SnapshotList
    GET    /v1/snapshots/{sid}                                         -> SnapshotInfo
    DELETE /v1/snapshots/{sid}                                         -> 204
    POST   /v1/sandboxes/{id}/execute                   ExecuteRequest  -> ExecuteResult
    POST   /v1/sandboxes/{id}/execute/stream            ExecuteRequest  -> NDJSON of StreamEvent
    GET    /v1/sandboxes/{id}/execute/{cid}/stream?offset=N             -> NDJSON of StreamEvent
                                                                            (re-attach from byte N)
    POST   /v1/sandboxes/{id}/processes                 ExecuteRequest  -> ProcessInfo (202)
    GET    /v1/sandboxes/{id}/processes/{pid}                           -> ProcessInfo
    DELETE /v1/sandboxes/{id}/processes/{pid}                           -> ProcessInfo (killed)
    POST   /v1/sandboxes/{id}/files/{op}                op's request    -> FILE_RESULTS[op]
           op in ls, read, write, edit, delete, grep, glob, upload, download
    PUT    /v1/sandboxes/{id}/archive?path=DIR          tar stream      -> 204 (extracted under DIR)
    GET    /v1/sandboxes/{id}/archive?path=PATH                         -> tar stream
    GET    /v1/sandboxes/{id}/metrics                                  -> SandboxMetrics
    POST   /v1/volumes                                  CreateVolume    -> VolumeInfo (201)
    GET    /v1/volumes                                                 -> VolumeList
    DELETE /v1/volumes/{name}                                          -> 204 (refused while mounted)
    GET    /v1/sandboxes/{id}/watch?path=DIR&recursive=B                -> NDJSON of WatchEvent
    POST   /v1/sandboxes/{id}/watchers                  CreateWatcher   -> WatcherInfo (201)
    GET    /v1/sandboxes/{id}/watchers/{wid}/events                     -> WatcherEvents (drained)
    DELETE /v1/sandboxes/{id}/watchers/{wid}                            -> 204
    PUT    /v1/sandboxes/{id}/ports/{port}              PortAccess      -> PortInfo (public or not)
    POST   /v1/sandboxes/{id}/ports/{port}/tokens       PreviewTokenRequest -> PreviewToken (201)
    DELETE /v1/sandboxes/{id}/ports/{port}/tokens/{tid}                 -> 204 (revoked)
    ANY    /v1/sandboxes/{id}/ports/{port}/{path}       relayed to 127.0.0.1:port in the sandbox
           (the key, a preview token or a public port; WebSockets too)
    GET    /v1/sandboxes/{id}/ports/{port}/connect      WebSocket: a raw TCP tunnel (the key)
    GET    /healthz  /readyz                                           -> Health
    GET    /metrics                                                    -> Prometheus text

Errors are JSON ``ErrorBody`` with the protocol's vocabulary plus service codes
(``unauthorized``, ``not_found``, ``quota_exceeded``, ``rate_limited``, ``too_large``,
``invalid_request``). A sandbox of another tenant answers ``404 not_found``, like a missing one.
File operation results are the protocol's results (``error`` codes inside a 200): a missing file
is an answer, not an HTTP failure.

Every answer is declared here, once: the service describes its routes with these types and the
client decodes what it receives with the same ones (pydantic validates the protocol's result
dataclasses as it validates these models).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, WithJsonSchema
from pydantic.config import JsonDict

from sandboxes import protocol
from sandboxes._api_base import VOLUME_NAME, Integer, PositiveInteger, _Answer, _Model, _Request
from sandboxes.api_resources import (
    PTY_BEARER_PREFIX,
    PTY_SUBPROTOCOL,
    CreateVolume,
    Health,
    MetricsSample,
    Overview,
    PortAccess,
    PortInfo,
    PreviewToken,
    PreviewTokenRequest,
    PtyControl,
    PtyExit,
    PtyMessage,
    PtySize,
    SandboxMetrics,
    TemplateInfo,
    TemplateList,
    TenantUsage,
    VolumeInfo,
    VolumeList,
)
from sandboxes.protocol import ErrorCode

__all__ = [
    "API_PREFIX",
    "FILE_OPERATIONS",
    "FILE_RESULTS",
    "PTY_BEARER_PREFIX",
    "PTY_SUBPROTOCOL",
    "CreateSandbox",
    "CreateSnapshot",
    "CreateVolume",
    "CreateWatcher",
    "DeleteRequest",
    "DownloadItem",
    "DownloadRequest",
    "EditRequest",
    "EgressRules",
    "ErrorBody",
    "ExecuteRequest",
    "ExecuteResult",
    "ForkResult",
    "ForkSandbox",
    "GlobRequest",
    "GrepRequest",
    "Health",
    "LsRequest",
    "MetricsSample",
    "Overview",
    "PauseSandbox",
    "PortAccess",
    "PortInfo",
    "PreviewToken",
    "PreviewTokenRequest",
    "ProcessInfo",
    "PtyControl",
    "PtyExit",
    "PtyMessage",
    "PtySize",
    "ReadRequest",
    "RenewSandbox",
    "SandboxInfo",
    "SandboxList",
    "SandboxMetrics",
    "ServiceErrorCode",
    "SnapshotInfo",
    "SnapshotList",
    "StreamEvent",
    "TemplateInfo",
    "TemplateList",
    "TenantUsage",
    "UploadItem",
    "UploadRequest",
    "VolumeInfo",
    "VolumeList",
    "VolumeMount",
    "WatchEvent",
    "WatcherEvents",
    "WatcherInfo",
    "WireErrorCode",
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
    "snapshot_mismatch",
]

WireErrorCode = ServiceErrorCode | ErrorCode
"""What an `ErrorBody` may carry: a failure of the service, or a protocol code a route answers
outside a 200 (a missing ``cwd``, an archive's path)."""


"""`Integer`, above zero (a constraint before the validator, so the schema states it)."""


def _env_name(name: str) -> str:
    if not name or "=" in name or "\x00" in name:
        raise ValueError(f"invalid environment variable name {name!r} (not empty, no '=', no NUL)")
    return name


def _env_value(value: str) -> str:
    if "\x00" in value:
        raise ValueError("an environment variable's value cannot contain NUL")
    return value


def _no_nul(text: str) -> str:
    if "\x00" in text:
        raise ValueError("cannot contain NUL (no process can be given one)")
    return text


_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")


def _base64(text: str) -> str:
    if _BASE64.fullmatch(text) is None:
        raise ValueError("not base64 (standard alphabet, padded)")
    return text


# Each string type below is checked by a function whose error says what is wrong in words, and
# stated in the OpenAPI document as the pattern of the same rule, for generated clients.
EnvName = Annotated[str, AfterValidator(_env_name), WithJsonSchema({"type": "string", "pattern": r"^[^=\x00]+$"})]
"""An environment variable's name: not empty, no ``=``, no NUL."""

EnvValue = Annotated[str, AfterValidator(_env_value), WithJsonSchema({"type": "string", "pattern": r"^[^\x00]*$"})]
"""An environment variable's value: no NUL."""

ProcessText = Annotated[str, AfterValidator(_no_nul), WithJsonSchema({"type": "string", "pattern": r"^[^\x00]*$"})]
"""What reaches a process as an argument or a directory (a command, its cwd): no NUL."""

Base64 = Annotated[str, AfterValidator(_base64), WithJsonSchema({"type": "string", "pattern": f"^{_BASE64.pattern}$"})]
"""Standard, padded base64: exactly what the service decodes."""

_LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def _label_key(key: str) -> str:
    if _LABEL_KEY.fullmatch(key) is None:
        raise ValueError(f"invalid label {key!r} (name: [A-Za-z0-9._-], starting alphanumeric, 63 max)")
    return key


def _label_value(value: str) -> str:
    if len(value) > 1024 or "\x00" in value:
        raise ValueError("invalid label value (1 KiB max, no NUL)")
    return value


LabelKey = Annotated[
    str, AfterValidator(_label_key), WithJsonSchema({"type": "string", "pattern": f"^{_LABEL_KEY.pattern}$"})
]
LabelValue = Annotated[
    str, AfterValidator(_label_value), WithJsonSchema({"type": "string", "maxLength": 1024, "pattern": r"^[^\x00]*$"})
]


_CLOSED: JsonDict = {"additionalProperties": False}
"""For a mapping whose keys have a pattern: a key that does not match is refused, as stated."""


def _env() -> Any:
    return Field(default_factory=dict, json_schema_extra=_CLOSED)


class ErrorBody(_Answer):
    error: WireErrorCode
    message: str
    request_id: str | None = None


class VolumeMount(_Request):
    """A tenant's volume mounted in a new sandbox."""

    name: str = Field(pattern=VOLUME_NAME)
    path: str = Field(pattern=r"^/[^\x00]*$", max_length=1024)
    """Absolute, in the sandbox; not ``/`` nor the sandbox's workdir itself."""
    read_only: bool = False


_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(\.{_OCTET}){{3}}"
_H16 = r"[0-9a-fA-F]{1,4}"
_IPV6 = (
    rf"(({_H16}:){{7}}{_H16}|({_H16}:){{1,7}}:|({_H16}:){{1,6}}:{_H16}|({_H16}:){{1,5}}(:{_H16}){{1,2}}"
    rf"|({_H16}:){{1,4}}(:{_H16}){{1,3}}|({_H16}:){{1,3}}(:{_H16}){{1,4}}|({_H16}:){{1,2}}(:{_H16}){{1,5}}"
    rf"|{_H16}:(:{_H16}){{1,6}}|:((:{_H16}){{1,7}}|:))"
)
_PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
_PORTS = rf"(:{_PORT}(,{_PORT})*)?"
_HOST = r"(\*|(\*\.)?[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*)"
EGRESS_RULE = (
    rf"^({_HOST}{_PORTS}|{_IPV4}(/(3[0-2]|[12]?[0-9]))?{_PORTS}"
    rf"|{_IPV6}(/(12[0-8]|1[01][0-9]|[1-9]?[0-9]))?|\[{_IPV6}(/(12[0-8]|1[01][0-9]|[1-9]?[0-9]))?\]{_PORTS})$"
)
"""An egress rule's text, as the service's parser takes it: ``HOST[:PORTS]`` (a name, ``*.name``
or ``*``), an IPv4 address or network with optional ``:PORTS``, an IPv6 one (in brackets when
it has ports); ``PORTS`` is ``port[,port...]``."""

EgressRule = Annotated[str, Field(min_length=1, max_length=300, pattern=EGRESS_RULE)]

SANDBOX_PATH = r"^/[^\x00]*$"
"""An absolute path of a sandbox's, without NUL (`sandboxes.paths.normalize_path` checks the
rest: no ``..`` component, components of at most 255 bytes)."""


class CreateSandbox(_Request):
    template: str = "default"
    """One of the service's templates (the OpenAPI document lists this service's)."""
    env: dict[EnvName, EnvValue] = _env()
    ttl: float | None = Field(default=None, ge=1)
    """Seconds, at least one; ``None`` takes the template's default. Capped by the service's maximum."""
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=64, json_schema_extra=_CLOSED)
    volumes: list[VolumeMount] = Field(default_factory=list, max_length=16)
    """The tenant's volumes (of this template's backend) to mount, each at its own path."""
    auto_resume: bool = False
    """Paused, an operation on it resumes it first instead of answering ``paused``."""
    on_timeout: Literal["delete", "freeze", "hibernate"] = "delete"
    """What the end of its TTL does: ``delete`` it; or pause it, ``freeze`` (processes and
    memory kept; ``hibernate`` where the backend has no freezer) or ``hibernate`` (files kept),
    kept paused at most the service's ``max_ttl`` more, then deleted."""
    snapshot: str | None = Field(default=None, pattern=r"^[a-z0-9]{1,64}$")
    """A snapshot of the tenant's (``POST .../snapshots``) to restore into it, verified against
    its manifest: any difference and it is not made (``snapshot_mismatch``, naming what). It
    starts with the network the snapshot recorded of its sandbox (its allow-list, unless
    ``egress_allow`` is given)."""
    egress_allow: list[EgressRule] | None = Field(default=None, max_length=1000)
    """The egress allow-list it starts with instead of its template's (rules as in
    `EgressRules`; ``[]``: nothing is reached), on a template with egress only; ``None``: the
    template's (its ``snapshot``'s, if it recorded one). It may name any destination, as ``PUT
    .../egress`` may; non-public ranges stay the operator's (the template's ``egress_open_ranges``)."""


class EgressRules(_Model):
    """``GET``/``PUT /v1/sandboxes/{id}/egress``: the destinations the sandbox's egress proxy lets
    through (``example.com``, ``*.example.com``, ``*``, ``10.0.0.0/8``, each with optional
    ``:port,port``), checked on the addresses a name resolves to. A change applies to the next
    connection."""

    model_config = ConfigDict(extra="forbid")

    allow: list[EgressRule] = Field(max_length=1000)


class RenewSandbox(_Request):
    ttl: float = Field(ge=1)


class CreateSnapshot(_Request):
    workspace: bool = True
    """Keep the sandbox's workspace (its ``workdir``), restored into the new sandbox's own."""
    paths: list[Annotated[str, Field(min_length=1, max_length=1024, pattern=SANDBOX_PATH)]] = Field(
        default_factory=list, max_length=64
    )
    """Absolute paths besides, each restored where it was."""


class SnapshotInfo(_Answer):
    id: str
    sandbox_id: str
    """The sandbox it was taken of."""
    template: str
    backend: str
    created_at: float
    bytes: int
    """What it costs of the tenant's ``max_snapshot_bytes``."""
    files: int
    """Entries (files, directories, symbolic links) in its manifest."""
    paths: list[str]
    """What it kept: the sandbox's workspace first, if it did."""


class SnapshotList(_Answer):
    snapshots: list[SnapshotInfo]


class ForkSandbox(_Request):
    count: Integer = Field(default=1, ge=1, le=64)
    """New sandboxes, each with the files and the network (its egress allow-list as it is now)
    of the one forked."""


class ForkResult(_Answer):
    snapshot: str
    """The snapshot they were restored from (the tenant's, to delete or use again)."""
    sandboxes: list[SandboxInfo]


class PauseSandbox(_Request):
    mode: Literal["freeze", "hibernate"] = "freeze"
    """``freeze``: its processes stop where they are, memory kept; ``hibernate``: its workspace
    is kept in a snapshot and its container or jail released (processes end), to be made again
    from the snapshot, verified, at resume."""
    ttl: Literal["keep", "stop"] = "keep"
    """Whether the sandbox's TTL runs while it is paused (``keep``: it may expire paused) or
    stops (``stop``: what was left is given back at resume)."""
    memory: bool = False
    """``hibernate`` only: keep its processes' memory too (a CRIU checkpoint), not only its
    files. No backend of this service can: such a hibernate answers ``unavailable`` (501) and
    leaves the sandbox running (docs/service.md#pause-snapshots-and-fork says why)."""


class SandboxInfo(_Answer):
    id: str
    template: str
    backend: str
    """The kind of backend its template names (``local``, ``docker``, ``kubernetes``, ``ssh``...)."""
    created_at: float
    expires_at: float | None
    labels: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    """Where the sandbox's files live in its path namespace (``/workspace`` in a container, the
    root directory of a local sandbox): the place to write files and run commands."""
    state: Literal["running", "paused"] = "running"
    """``paused``: frozen (``POST .../pause``); operations answer ``paused`` until it resumes."""
    processes_kept: bool | None = None
    """While paused: whether its processes come back at resume where they were (``true``:
    frozen) or not (``false``: hibernated, or frozen in a local jail the service's restart
    ended; only its files were kept); ``null`` while it runs."""


class SandboxList(_Answer):
    sandboxes: list[SandboxInfo]


class ExecuteRequest(_Request):
    command: ProcessText
    timeout: float | None = Field(default=None, ge=0)
    stdin_b64: Base64 | None = None
    env: dict[EnvName, EnvValue] = _env()
    cwd: ProcessText | None = None
    output_limit: PositiveInteger | None = None


class ExecuteResult(_Answer):
    output: str
    exit_code: int | None
    truncated: bool = False
    error: ErrorCode | None = None
    message: str | None = None
    duration_ms: float | None = None


class StreamEvent(_Answer):
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
    stream: Literal["stderr", "merged"] | None = None
    """On ``output``: the stream the text came from; absent: stdout. ``merged``: the backend ran
    the command without the exec helper, and its stdout and stderr came through one pipe."""


class WatchEvent(_Answer):
    """One event of a file watch (`sandboxes.watching`, the service's watch routes): what
    happened to ``name``, a path relative to the watched directory (``""``: the directory
    itself), of envd's kinds; ``overflow``: events were lost here (no name). On the service's
    stream only: ``start`` first, once the watch is in place, ``keepalive`` while nothing
    happens, and ``end`` last when the watch ended by itself (``error`` and ``message`` say
    why). Clients ignore types they do not know."""

    type: Literal["create", "write", "remove", "rename", "chmod", "overflow", "start", "keepalive", "end"]
    name: str | None = None
    error: ErrorCode | None = None
    message: str | None = None


class CreateWatcher(_Request):
    path: str = Field(json_schema_extra={"pattern": SANDBOX_PATH})
    """An absolute directory of the sandbox."""
    recursive: bool = False


class WatcherInfo(_Answer):
    id: str


class WatcherEvents(_Answer):
    """What a polled watcher queued since the last poll (at most its bound, then one
    ``overflow``), and whether it ended (``error`` and ``message`` say why)."""

    events: list[WatchEvent]
    ended: bool = False
    error: ErrorCode | None = None
    message: str | None = None


class ProcessInfo(_Answer):
    """A background process: its output so far and, once it ended, its ``result``. ``stdout``
    and ``stderr`` are its two streams apart (the sandbox keeps the head and the tail of each,
    up to the process's output limit); ``output`` (and the result's) is both as one text: the
    stdout, then the stderr."""

    id: str
    status: Literal["running", "exited", "killed", "timeout"]
    output: str = ""
    result: ExecuteResult | None = None
    stdout: str = ""
    stderr: str = ""


# ---------------------------------------------------------------------- file operation requests


class LsRequest(_Request):
    path: str


class ReadRequest(_Request):
    file_path: str
    offset: Integer = 0
    limit: Integer = 2000


class WriteRequest(_Request):
    file_path: str
    content: str


class EditRequest(_Request):
    file_path: str
    old_string: str
    new_string: str
    replace_all: bool = False


class DeleteRequest(_Request):
    file_path: str


class GrepRequest(_Request):
    pattern: str
    path: str | None = None
    glob: str | None = None
    max_count: Integer | None = None


class GlobRequest(_Request):
    pattern: str
    path: str | None = None


class UploadItem(_Request):
    path: str
    content_b64: Base64


class UploadRequest(_Request):
    files: list[UploadItem]


class DownloadRequest(_Request):
    paths: list[str]


class DownloadItem(_Answer):
    path: str
    content_b64: str | None = None
    error: ErrorCode | None = None
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
"""Request model per ``/files/{op}``."""

FILE_RESULTS: dict[str, Any] = {
    "ls": protocol.LsResult,
    "read": protocol.ReadResult,
    "write": protocol.WriteResult,
    "edit": protocol.EditResult,
    "delete": protocol.DeleteResult,
    "grep": protocol.GrepResult,
    "glob": protocol.GlobResult,
    "upload": list[protocol.FileUploadResponse],
    "download": list[DownloadItem],
}
"""Response type per ``/files/{op}``: the protocol's result (its dataclass as JSON), a list of
them for upload, and for download a list of `DownloadItem` (content in base64)."""
