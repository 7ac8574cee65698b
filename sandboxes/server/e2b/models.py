"""The E2B control plane's wire shapes, as the E2B SDK's generated client reads and writes them
(camelCase names, `{code, message}` errors); fields it sends that this service does not act on
are accepted and ignored."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from sandboxes.server.egress.policy import parse_rule

__all__ = [
    "ConnectSandbox",
    "E2BError",
    "ForkRequest",
    "Network",
    "NetworkRule",
    "NetworkUpdate",
    "NewSandbox",
    "SandboxCreated",
    "SandboxDetail",
    "SnapshotRequest",
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


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_ALL_TRAFFIC_V4 = "0.0.0.0/0"
_ALL_TRAFFIC = frozenset({_ALL_TRAFFIC_V4, "::/0"})
_EVERYTHING = "*"
_FAMILIES: tuple[IPNetwork, ...] = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))
MAX_RULES = 1000
"""The most rules an allow-list holds (`sandboxes.api.CreateSandbox.egress_allow`'s bound)."""

_HeaderName = Annotated[str, StringConstraints(pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")]
_HeaderValue = Annotated[str, StringConstraints(pattern=r"^[^\r\n\x00]*$", max_length=4096)]


class Transform(_Wire):
    """``transform`` of a rule: headers set on the matching requests (replacing the sandbox's)."""

    headers: dict[_HeaderName, _HeaderValue] | None = Field(default=None, max_length=32)


class NetworkRule(_Wire):
    """One of ``rules``' entries for a host: what is done to its requests."""

    transform: Transform | None = None


class Network(_Wire):
    """``network`` of a create: the egress filter (``allowOut`` wins over ``denyOut``), the
    per-host transforms (``rules``: headers the egress proxy adds), whether the sandbox's ports
    take traffic without its token (``allowPublicTraffic``) and the ``Host`` its ports' requests
    carry (``maskRequestHost``, ``${PORT}`` replaced); the rest of E2B's options are ignored."""

    allow_out: list[str] | None = Field(default=None, alias="allowOut", max_length=MAX_RULES)
    deny_out: list[str] | None = Field(default=None, alias="denyOut", max_length=MAX_RULES)
    rules: dict[str, Annotated[list[NetworkRule], Field(max_length=16)]] | None = Field(default=None, max_length=64)
    allow_public_traffic: bool | None = Field(default=None, alias="allowPublicTraffic")
    mask_request_host: str | None = Field(
        default=None, alias="maskRequestHost", max_length=253, pattern=r"^[A-Za-z0-9.:${}_-]+$"
    )

    def headers(self) -> dict[str, dict[str, str]]:
        """``rules`` as the egress proxy's credentials: each host's headers, its rules' merged
        in order. ValueError for a key that is no host name or address."""
        found: dict[str, dict[str, str]] = {}
        for host, rules in (self.rules or {}).items():
            rule = parse_rule(host)
            if "/" in host or rule.ports or rule.host == _EVERYTHING:
                raise ValueError(f"rules: {host!r} is not a host name, *.domain or address")
            merged = found.setdefault(host.lower(), {})
            for item in rules:
                merged.update(item.transform.headers or {} if item.transform else {})
        return {host: headers for host, headers in found.items() if headers}


class NetworkUpdate(Network):
    """``PUT /sandboxes/{id}/network``: the egress filter and rules replaced whole (what it
    omits is cleared)."""

    allow_internet_access: bool | None = None

    def egress_allow(self) -> list[str] | None:
        return egress_allow(self.allow_internet_access, self)


def egress_allow(allow_internet_access: bool | None, network: Network) -> list[str] | None:
    """The service's allow-list for what E2B asks (`parse_rule`'s texts): ``allowOut`` alone
    when all traffic is denied (``allow_internet_access=False``, or ``denyOut`` holding
    ``0.0.0.0/0``); ``allowOut`` and every network ``denyOut`` leaves out (its complement) for
    a narrower ``denyOut``; every public destination (``*``) for ``allow_internet_access=True``;
    ``None`` when E2B's default stands, which here is the template's list. ValueError for a
    ``denyOut`` entry that is no address or network, or a list past `MAX_RULES`."""
    deny = network.deny_out or []
    allow = list(network.allow_out or [])
    if allow_internet_access is False or any(entry in _ALL_TRAFFIC for entry in deny):
        return allow
    if deny:
        left = _complement(_networks(deny), MAX_RULES - len(allow))
        if left is None:
            raise ValueError(f"denyOut leaves more networks than the {MAX_RULES} rules an allow-list holds")
        return allow + [str(net) for net in left]
    return [_EVERYTHING] if allow_internet_access else None


def _networks(entries: list[str]) -> list[IPNetwork]:
    try:
        return [ipaddress.ip_network(entry.strip(), strict=False) for entry in entries]
    except ValueError as exc:
        raise ValueError(f"denyOut takes addresses and networks (CIDR), not names: {exc}") from None


def _complement(taken: list[IPNetwork], limit: int = MAX_RULES) -> list[IPNetwork] | None:
    """The fewest networks covering every address ``taken`` does not, both families; ``None``
    once past ``limit`` of them (it stops there: linear in ``taken`` and ``limit``)."""
    found: list[IPNetwork] = []
    for full in _FAMILIES:
        start: Any = full.network_address
        same: list[Any] = [net for net in taken if net.version == full.version]
        for net in ipaddress.collapse_addresses(same):
            if net.network_address > start:
                found += ipaddress.summarize_address_range(start, net.network_address - 1)
            if len(found) > limit:
                return None
            start = None if net.broadcast_address == full.broadcast_address else net.broadcast_address + 1
            if start is None:
                break
        if start is not None:
            found += ipaddress.summarize_address_range(start, full.broadcast_address)
    return found if len(found) <= limit else None


def network_of(allow: list[str] | None) -> tuple[bool | None, dict[str, list[str]] | None]:
    """``allowInternetAccess`` and ``network`` for a sandbox whose allow-list is ``allow``
    (`egress_allow`'s answer, or a later change's): ``None`` for both for E2B's default (the
    template's), ``True`` for every public destination; a list ending as a narrower ``denyOut``
    is written (`egress_allow`) as that ``denyOut`` with the rules before as ``allowOut``; any
    other list as everything denied but it (``False``, ``allowOut``,
    ``denyOut: ["0.0.0.0/0"]``). Each allows what the list does, not necessarily as it was sent
    (an ``allowOut`` network inside what ``denyOut`` leaves open is not repeated)."""
    if allow is None:
        return None, None
    if allow == [_EVERYTHING]:
        return True, None
    denied = _as_deny_list(allow) if allow else None
    if denied is not None:
        rest, deny = denied
        return None, {"allowOut": rest, "denyOut": deny} if rest else {"denyOut": deny}
    return False, {"allowOut": list(allow), "denyOut": [_ALL_TRAFFIC_V4]}


def _as_deny_list(allow: list[str]) -> tuple[list[str], list[str]] | None:
    """``allowOut`` and ``denyOut`` when ``allow`` ends as `egress_allow` writes a narrower
    ``denyOut``: its rules before, and what the networks of that end leave out."""
    keys: list[tuple[int, int] | None] = []
    for text in allow:
        try:
            rule = parse_rule(text)
        except ValueError:
            return None
        net = rule.network
        keys.append(None if net is None or rule.ports else (net.version, int(net.network_address)))
    start = len(allow)  # the end's ascending run of networks: where the complement can begin
    while start > 0 and (key := keys[start - 1]) is not None and (start == len(allow) or key < keys[start]):  # type: ignore[operator]
        start -= 1
    for begin in range(start, min(start + 2, len(allow))):  # the run may have taken an allowOut network
        tail = allow[begin:]
        left_out = _complement([ipaddress.ip_network(text) for text in tail], limit=len(tail))
        if left_out is not None and [str(net) for net in _complement(left_out) or []] == tail:
            return allow[:begin], [_text(net) for net in left_out]
    return None


def _text(net: IPNetwork) -> str:
    """A network as E2B writes it: a bare address for a single one."""
    return str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net)


class AutoResume(_Wire):
    """``autoResume`` of a create: activity on a paused sandbox resumes it."""

    enabled: bool = False


class PauseRequest(_Wire):
    """``POST /sandboxes/{id}/pause``: ``memory: false`` keeps the filesystem alone."""

    memory: bool | None = None


SNAPSHOT_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""A snapshot's name: what E2B's aliases allow, and dots (no ``/`` or ``:``, which qualify a name)."""
MAX_FORKS = 100
"""E2B's bound on one fork's ``count``; each fork is a create, counted against the tenant's quota."""


class SnapshotRequest(_Wire):
    """``POST /sandboxes/{id}/snapshots``: ``memory`` unset or ``false`` (the SDK's
    ``mode="filesystem"``); the snapshot keeps files only."""

    name: str | None = Field(default=None, pattern=SNAPSHOT_NAME)
    memory: bool | None = None


class ForkRequest(_Wire):
    """``POST /sandboxes/{id}/fork``: ``count`` new sandboxes, each with a ``timeout`` (E2B's
    default: 15 s)."""

    timeout: int = Field(default=15, ge=0, le=MAX_TIMEOUT)
    count: int = Field(default=1, ge=1, le=MAX_FORKS)


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
    domain: str | None = None
    """The service's ``preview_domain``, where the SDK without ``E2B_SANDBOX_URL`` reaches the
    sandbox (``{port}-{id}.{domain}``: `sandboxes.server.e2b.hosts`); omitted when none is
    configured (the SDK then takes its ``E2B_DOMAIN``)."""


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
    network: dict[str, object] | None = None
    """Both as the sandbox is served now (`network_of`, with its rules and port options);
    omitted for E2B's default."""
    lifecycle: dict[str, str | bool] | None = None
    """``onTimeout`` (``pause`` or ``kill``) and ``autoResume``, as the create asked."""
