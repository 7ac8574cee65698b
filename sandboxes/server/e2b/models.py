"""The E2B control plane's wire shapes, as the E2B SDK's generated client reads and writes them
(camelCase names, `{code, message}` errors); fields it sends that this service does not act on
are accepted and ignored."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ConnectSandbox",
    "E2BError",
    "Network",
    "NetworkUpdate",
    "NewSandbox",
    "SandboxCreated",
    "SandboxDetail",
    "TimeoutRequest",
    "egress_allow",
    "network_of",
]

MAX_TIMEOUT = 86_400 * 30
"""The largest timeout (seconds) a request may carry; the service's own maximum TTL caps it further."""


class _Wire(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class E2BError(_Wire):
    """Every failure's body: the HTTP status again, and a sentence."""

    code: int
    message: str


class NewSandbox(_Wire):
    """``POST /sandboxes`` and ``POST /v2/sandboxes``."""

    template_id: str = Field(alias="templateID", min_length=1, max_length=256)
    timeout: int | None = Field(default=None, ge=0, le=MAX_TIMEOUT)
    metadata: dict[str, str] | None = None
    env_vars: dict[str, str] | None = Field(default=None, alias="envVars")
    auto_resume: AutoResume | None = Field(default=None, alias="autoResume")
    auto_pause: bool | None = Field(default=None, alias="autoPause")
    """``lifecycle`` ``on_timeout: pause``: its timeout pauses it instead of killing it."""
    auto_pause_memory: bool | None = Field(default=None, alias="autoPauseMemory")
    """``False`` (``mode: filesystem``, ``keep_memory: False``): that pause keeps its files only."""
    allow_internet_access: bool | None = None
    """``False``: no egress at all (E2B: the same as ``denyOut: ["0.0.0.0/0"]``)."""
    network: Network | None = None

    def egress_allow(self) -> list[str] | None:
        """The service's allow-list for this create (`egress_allow`)."""
        return egress_allow(self.allow_internet_access, self.network or Network())

    def on_timeout(self) -> Literal["delete", "freeze", "hibernate"]:
        """The service's ``on_timeout`` for this create: a pause keeps memory unless told not to."""
        if not self.auto_pause:
            return "delete"
        return "hibernate" if self.auto_pause_memory is False else "freeze"


_ALL_TRAFFIC_V4 = "0.0.0.0/0"
_ALL_TRAFFIC = frozenset({_ALL_TRAFFIC_V4, "::/0"})


class Network(_Wire):
    """``network`` of a create: the egress filter (``allowOut`` wins over ``denyOut``); the
    rest of E2B's network options are not acted on."""

    allow_out: list[str] | None = Field(default=None, alias="allowOut", max_length=1000)
    deny_out: list[str] | None = Field(default=None, alias="denyOut", max_length=1000)


class NetworkUpdate(Network):
    """``PUT /sandboxes/{id}/network``: the egress filter replaced whole (what it omits is cleared)."""

    allow_internet_access: bool | None = None

    def egress_allow(self) -> list[str] | None:
        return egress_allow(self.allow_internet_access, self)


def egress_allow(allow_internet_access: bool | None, network: Network) -> list[str] | None:
    """The service's allow-list for what E2B asks: everything denied but ``allowOut`` (its
    entries are the service's rules: addresses, networks, names, ``*.`` names); ``None`` when
    E2B's default (all traffic) stands, which here is the template's list. ValueError for a
    deny-list narrower than all traffic, which an allow-list cannot say."""
    deny = network.deny_out or []
    if allow_internet_access is False or any(entry in _ALL_TRAFFIC for entry in deny):
        return list(network.allow_out or [])
    if deny:
        raise ValueError("denyOut is served only as all traffic (0.0.0.0/0) with allowOut for the exceptions")
    return None


def network_of(allow: list[str] | None) -> tuple[bool | None, dict[str, list[str]] | None]:
    """``allowInternetAccess`` and ``network`` for a sandbox created with the allow-list
    ``allow`` (`egress_allow`'s answer): ``None`` for both when the create left E2B's default;
    a list is everything denied but it, as E2B says it (``False``, ``allowOut``, ``denyOut``)."""
    if allow is None:
        return None, None
    return False, {"allowOut": list(allow), "denyOut": [_ALL_TRAFFIC_V4]}


class AutoResume(_Wire):
    """``autoResume`` of a create: activity on a paused sandbox resumes it."""

    enabled: bool = False


class PauseRequest(_Wire):
    """``POST /sandboxes/{id}/pause``: ``memory: false`` keeps the filesystem alone."""

    memory: bool | None = None


class ConnectSandbox(_Wire):
    """``POST /v2/sandboxes/{id}/connect`` (and the v1 path)."""

    timeout: int | None = Field(default=None, ge=0, le=MAX_TIMEOUT)


class TimeoutRequest(_Wire):
    """``POST /sandboxes/{id}/timeout``: the sandbox now ends ``timeout`` seconds from now."""

    timeout: int = Field(ge=0, le=MAX_TIMEOUT)


class SandboxCreated(_Wire):
    """The answer of create and connect: what the SDK needs to reach the sandbox's envd."""

    template_id: str = Field(serialization_alias="templateID")
    sandbox_id: str = Field(serialization_alias="sandboxID")
    client_id: str = Field(serialization_alias="clientID")
    envd_version: str = Field(serialization_alias="envdVersion")
    envd_access_token: str = Field(serialization_alias="envdAccessToken")
    traffic_access_token: str = Field(serialization_alias="trafficAccessToken")
    """What the SDK sends to reach the sandbox's other ports (the code interpreter's): the same
    token, which the port route accepts as the envd routes do."""
    alias: str | None = None


class SandboxDetail(SandboxCreated):
    """``GET /sandboxes/{id}`` and each item of ``GET /v2/sandboxes``."""

    started_at: str = Field(serialization_alias="startedAt")
    end_at: str = Field(serialization_alias="endAt")
    cpu_count: int = Field(serialization_alias="cpuCount")
    memory_mb: int = Field(serialization_alias="memoryMB")
    disk_size_mb: int = Field(serialization_alias="diskSizeMB")
    state: Literal["running", "paused"] = "running"
    metadata: dict[str, str] = Field(default_factory=dict)
    allow_internet_access: bool | None = Field(default=None, serialization_alias="allowInternetAccess")
    network: dict[str, list[str]] | None = None
    """Both as the create set them (`network_of`); omitted for E2B's default."""
    lifecycle: dict[str, str | bool] | None = None
    """``onTimeout`` (``pause`` or ``kill``) and ``autoResume``, as the create asked."""
