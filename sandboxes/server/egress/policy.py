"""Which destinations a sandbox's egress may reach (`EgressPolicy`), decided on the addresses a
name resolves to, after resolution (`decide`): a name that resolves to an address the policy
refuses is refused, whatever the name, so re-pointing a name (DNS rebinding) gains nothing, and
the connection goes to the very address that was checked.

Addresses that are not globally routable (private, loopback, link-local with the cloud metadata
address 169.254.169.254, carrier-grade NAT, multicast, reserved, unspecified; IPv4-mapped IPv6
unwrapped) are refused unless the operator opened their range (`EgressPolicy.open_ranges`), and
even then only where a rule allows the destination.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["Decision", "EgressPolicy", "Rule", "decide", "host_matches", "parse_rule", "proxy_env"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_MAX_RULES = 1000


def host_matches(pattern: str, name: str) -> bool:
    """Whether host ``name`` (lower case) is ``pattern``, or one of its subdomains when the
    pattern is ``*.domain`` (the domain itself is not)."""
    pattern = pattern.lower()
    if pattern.startswith("*."):
        return name.endswith(pattern[1:]) and len(name) > len(pattern) - 1
    return name == pattern


def proxy_env(port: int) -> dict[str, str]:
    """What points a sandbox's commands at its egress proxy (inside it, on ``port``): the
    variables curl, pip, requests, httpx and most tools read, in both cases."""
    proxy = f"http://127.0.0.1:{port}"
    names = ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"]
    env = {name: proxy for name in names} | {name.lower(): proxy for name in names}
    return env | {"NO_PROXY": "localhost,127.0.0.1,::1", "no_proxy": "localhost,127.0.0.1,::1"}


@dataclass(frozen=True)
class Rule:
    """One allowed destination: a host name (``example.com``), its subdomains
    (``*.example.com``), any host (``*``) or a network (``10.1.0.0/16``), on some ports (none:
    every port)."""

    host: str | None
    network: IPNetwork | None
    ports: frozenset[int]

    def covers_name(self, name: str) -> bool:
        return self.host is not None and (self.host == "*" or host_matches(self.host, name))

    def covers_port(self, port: int) -> bool:
        return not self.ports or port in self.ports


def parse_rule(text: str) -> Rule:
    """A rule from its text: ``HOST[:PORT[,PORT...]]`` or ``CIDR[:PORTS]`` (an IPv6 network in
    brackets when it has ports: ``[fd00::/8]:443``); ValueError for anything else."""
    text = text.strip().lower()
    if not text or len(text) > 300:
        raise ValueError("a rule is a host, *.domain, * or a network, with optional :ports")
    target, ports = text, ""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"unclosed [ in {text!r}")
        target, ports = text[1:end], text[end + 1 :].removeprefix(":")
    elif text.count(":") == 1:
        target, ports = text.split(":")
    parsed_ports = frozenset(_port(item) for item in ports.split(",") if item) if ports else frozenset()
    if "/" in target or _is_address(target):
        return Rule(None, ipaddress.ip_network(target, strict=False), parsed_ports)
    label = target.removeprefix("*.")
    if target != "*" and not all(part and all(c.isalnum() or c == "-" for c in part) for part in label.split(".")):
        raise ValueError(f"not a host name: {target!r}")
    return Rule(target, None, parsed_ports)


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise ValueError(f"not a port: {text!r}")
    return port


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


class EgressPolicy(BaseModel):
    """A sandbox's egress: the destinations it may reach (``allow``: rule texts, see
    `parse_rule`), and the non-global ranges the operator opened to rules (``open_ranges``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allow: list[str] = Field(default_factory=list, max_length=_MAX_RULES)
    open_ranges: list[str] = Field(default_factory=list, max_length=_MAX_RULES)

    @field_validator("allow")
    @classmethod
    def _rules_parse(cls, value: list[str]) -> list[str]:
        for text in value:
            parse_rule(text)
        return value

    @field_validator("open_ranges")
    @classmethod
    def _ranges_parse(cls, value: list[str]) -> list[str]:
        for text in value:
            ipaddress.ip_network(text, strict=False)
        return value

    def rules(self) -> list[Rule]:
        return [parse_rule(text) for text in self.allow]

    def opened(self) -> list[IPNetwork]:
        return [ipaddress.ip_network(text, strict=False) for text in self.open_ranges]


@dataclass(frozen=True)
class Decision:
    """Whether a connection may go, to which address (the one checked), and why not if not."""

    allowed: bool
    reason: str
    address: IPAddress | None = None


def decide(policy: EgressPolicy, host: str, port: int, addresses: Sequence[str]) -> Decision:
    """The decision for ``host:port`` whose name resolved to ``addresses``: the first address
    both a rule and the global-or-opened check allow, or a refusal naming why. Nothing is
    connected or resolved here."""
    name = host.strip().lower().rstrip(".")
    rules = [rule for rule in policy.rules() if rule.covers_port(port)]
    if not rules:
        return Decision(False, f"no rule allows port {port}")
    opened = policy.opened()
    why = f"{name}:{port} is not in the sandbox's allow-list"
    for text in addresses:
        address = _unwrapped(ipaddress.ip_address(text))
        if not any(rule.covers_name(name) or (rule.network is not None and address in rule.network) for rule in rules):
            continue
        if not _public(address) and not any(address in network for network in opened):
            why = f"{name} resolves to {address}, a non-public address egress may not reach"
            continue
        return Decision(True, "allowed", address)
    return Decision(False, why)


def _public(address: IPAddress) -> bool:
    """Globally routable unicast (``is_global`` counts some multicast ranges as global)."""
    return address.is_global and not address.is_multicast


def _unwrapped(address: IPAddress) -> IPAddress:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address
