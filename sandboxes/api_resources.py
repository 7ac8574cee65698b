"""The service's wire beside its sandboxes' own calls (`sandboxes.api`): preview URLs and their
tokens, terminals (the WebSocket's messages), usage metrics, volumes, the templates, the
operator's overview and health. Shared by the server and the client, like `sandboxes.api`,
which re-exports every name here."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from sandboxes._api_base import VOLUME_NAME, PositiveInteger, _Answer, _integral, _Request

__all__ = [
    "PTY_BEARER_PREFIX",
    "PTY_SUBPROTOCOL",
    "CreateVolume",
    "Health",
    "MetricsSample",
    "Overview",
    "PortAccess",
    "PortInfo",
    "PreviewToken",
    "PreviewTokenRequest",
    "PtyControl",
    "PtyExit",
    "PtyMessage",
    "PtySize",
    "SandboxMetrics",
    "TemplateInfo",
    "TemplateList",
    "TenantUsage",
    "VolumeInfo",
    "VolumeList",
]


class PortAccess(_Request):
    public: bool
    """Whether anyone may reach the port's preview URL without a key or a token."""


class PortInfo(_Answer):
    sandbox_id: str
    port: int
    public: bool


class PreviewTokenRequest(_Request):
    ttl: float = Field(default=3600.0, ge=1, le=7 * 24 * 3600.0)
    """Seconds the token is valid (at most a week)."""


class PreviewToken(_Answer):
    """A link to share: the token grants the port's preview URL alone, until it expires or is
    revoked (``DELETE .../tokens/{token_id}``). A browser passes it as ``?preview_token=``
    once; the service then sets it as a cookie for that port's path."""

    token: str
    token_id: str
    sandbox_id: str
    port: int
    expires_at: float
    url: str
    """The preview URL's path with the token in its query."""


class TemplateInfo(_Answer):
    """A template a tenant may create sandboxes from (``GET /v1/templates``)."""

    name: str
    backend: str
    cpus: float
    memory: str
    ttl: float


class TemplateList(_Answer):
    templates: list[TemplateInfo]


class TenantUsage(_Answer):
    """One tenant's sandboxes held by this replica, against its quotas."""

    tenant: str
    sandboxes: int
    cpus: float
    memory: int
    """Bytes."""
    max_sandboxes: int
    max_cpus: float
    max_memory: int
    """Bytes."""


class Overview(_Answer):
    """``GET /v1/operator/overview``, for an operator's key only: every tenant's usage, the
    templates, and the service's health."""

    tenants: list[TenantUsage]
    templates: list[TemplateInfo]
    health: Health


class Health(_Answer):
    """``GET /healthz`` (``ok``) and ``GET /readyz`` (``ready``, or ``unavailable`` in a 503
    with the ``problems`` found)."""

    status: Literal["ok", "ready", "unavailable"]
    problems: list[str] | None = None


# ---------------------------------------------------------------------- terminals (WebSocket)

PTY_SUBPROTOCOL = "sandboxes.pty.v1"
"""The WebSocket subprotocol of ``GET /v1/sandboxes/{id}/pty``, which the service selects."""
PTY_BEARER_PREFIX = "bearer."
"""A client that cannot set headers (a browser) offers its API key as the subprotocol
``bearer.<key>`` beside `PTY_SUBPROTOCOL`; the service never echoes it."""

TerminalSide = Annotated[int, Field(ge=1, le=10000), BeforeValidator(_integral)]
"""Columns or rows of a terminal."""


class PtySize(_Request):
    """A terminal's size."""

    cols: TerminalSide
    rows: TerminalSide


class PtyControl(_Request):
    """A text message from a terminal's client: resize it, or kill it (and all it started)."""

    resize: PtySize | None = None
    kill: bool = False


class PtyExit(_Answer):
    """How a terminal's command ended: its exit code, or the error that ended it (``timeout``,
    ``connection_lost``)."""

    exit_code: int | None = None
    error: str | None = None
    message: str | None = None


class PtyMessage(_Answer):
    """A text message from the service on a terminal's WebSocket: first its ``session`` (to
    reattach with, ``?session=``), last its ``exit`` (then the socket closes)."""

    session: str | None = None
    exit: PtyExit | None = None


class MetricsSample(_Answer):
    """What a sandbox used at one instant, as its exec helper read it from the kernel; a value
    that could not be read is ``None``, never a guess."""

    timestamp: float
    """Unix seconds."""
    source: Literal["cgroup", "processes", "none"]
    """``cgroup``: the sandbox's own cgroup (every process in it); ``processes``: the sum over
    the processes of the sandbox's user (SSH, a jail without a cgroup); ``none``: neither."""
    cpu_percent: float | None
    """CPU used since the previous sample, in percent of one CPU (200: two CPUs busy)."""
    cpu_limit: float | None
    """CPUs the sandbox may use (its cgroup's bandwidth); ``None``: no limit known."""
    cpus: int | None
    """CPUs online where it runs."""
    memory_used: int | None
    memory_limit: int | None
    disk_used: int | None
    """Bytes used of the filesystem holding the workdir (its own where the backend gives it one)."""
    disk_total: int | None


class SandboxMetrics(_Answer):
    """``GET /v1/sandboxes/{id}/metrics``: the samples kept of one sandbox, oldest first."""

    sandbox_id: str
    interval: float
    """Seconds between samples (the service's ``metrics_interval``; 0: sampling is off)."""
    latest: MetricsSample | None
    samples: list[MetricsSample]


class CreateVolume(_Request):
    name: str = Field(pattern=VOLUME_NAME)
    """Unique among the tenant's volumes."""
    size_limit: PositiveInteger | None = None
    """Bytes counted against the tenant's ``max_volume_bytes``; ``None``: the service's
    ``default_volume_size``."""
    template: str = "default"
    """The template whose sandboxes mount it (its backend holds the volume)."""


class VolumeInfo(_Answer):
    name: str
    template: str
    backend: str
    size_limit: int
    created_at: float
    mounted_by: list[str] = Field(default_factory=list)
    """The tenant's sandboxes this service holds that mount it now."""


class VolumeList(_Answer):
    volumes: list[VolumeInfo]
