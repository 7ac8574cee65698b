"""A sandbox's network as its record holds it, on a provider that keeps one there
(`sandboxes.lifecycle.RecordsNetwork`: a pod's annotation): its egress allow-list and headers,
E2B's public traffic and masked host, its public preview ports, as one small JSON object that
every replica reads back with the sandbox's record (`sandboxes.server.backends.state_from_record`).

Written by the service alone, but read as what it is, text on an object others can change: at
most `NETWORK_RECORD_LIMIT` characters are parsed, and one that is too long, does not parse, or
holds anything of the wrong shape reads as the closed network (nothing allowed out, no port
public), never as the template's wider one.
"""

from __future__ import annotations

import json
from typing import Any

from sandboxes.lifecycle import NETWORK_RECORD_LIMIT
from sandboxes.server.store import Network, SandboxState

__all__ = [
    "allow_from_text",
    "allow_text",
    "merged",
    "network_record",
    "parse_record",
    "read_network_record",
    "record_of",
]


def network_record(state: SandboxState) -> str:
    """The record of ``state``'s network (compact JSON); it may exceed `NETWORK_RECORD_LIMIT`,
    which the caller checks before recording it."""
    return record_of(state.network())


def record_of(network: Network) -> str:
    """The record of ``network`` (compact JSON), as `network_record` writes it."""
    record = {
        "allow": None if network.allow is None else list(network.allow),
        "headers": {host: dict(values) for host, values in network.headers},
        "public": network.public_ports,
        "mask": network.mask_request_host,
        "ports": list(network.preview_public),
    }
    return json.dumps(record, separators=(",", ":"), sort_keys=True)


def read_network_record(state: SandboxState, text: str) -> None:
    """Take the network ``text`` records into ``state`` (marked set through the API and held on
    its record); a record that cannot be read is the closed network."""
    state.network_set = state.network_on_record = True
    state.restore_network(parse_record(text))


def parse_record(text: str) -> Network:
    """The network ``text`` records; the closed network for one that cannot be read."""
    parsed = _parsed(text)
    allow = _allow(parsed.get("allow", []))
    headers = _headers(parsed.get("headers"))
    public, mask, ports = parsed.get("public"), parsed.get("mask"), parsed.get("ports")
    valid = isinstance(ports, list) and all(type(port) is int and 1 <= port <= 65535 for port in ports)
    return Network(
        None if allow is None else tuple(allow),
        tuple((host, tuple(values.items())) for host, values in headers.items()),
        public if isinstance(public, bool) else None,
        mask if isinstance(mask, str) else None,
        tuple(sorted(set(ports))) if valid and isinstance(ports, list) else (),
    )


def merged(current: Network, before: Network, after: Network) -> Network:
    """What one replica's change (its network ``before`` it, and ``after``) makes of ``current``,
    the network recorded now, which another replica may have changed since ``before`` was read:
    each part this change changed is taken from ``after``, the others kept from ``current``; the
    public ports port by port (one made public here, another made private elsewhere: both hold)."""
    made = set(after.preview_public) - set(before.preview_public)
    unmade = set(before.preview_public) - set(after.preview_public)
    return Network(
        after.allow if after.allow != before.allow else current.allow,
        after.headers if after.headers != before.headers else current.headers,
        after.public_ports if after.public_ports != before.public_ports else current.public_ports,
        after.mask_request_host if after.mask_request_host != before.mask_request_host else current.mask_request_host,
        tuple(sorted((set(current.preview_public) | made) - unmade)),
    )


def allow_text(allow: list[str]) -> str:
    """An allow-list as a label holds it where labels take any text (Docker's): compact JSON."""
    return json.dumps(allow, separators=(",", ":"))


def allow_from_text(value: str | None) -> list[str] | None:
    """The allow-list a label recorded (`allow_text`): ``None`` without one, nothing allowed for
    one that does not read back as a list of rule texts."""
    if value is None:
        return None
    try:
        allow = json.loads(value)
    except ValueError:
        return []
    return [] if allow is None else _allow(allow)


def _parsed(text: str) -> dict[str, Any]:
    """The record's object; an empty one (the closed network's reading) if it is none."""
    if len(text) > NETWORK_RECORD_LIMIT:
        return {}
    try:
        parsed = json.loads(text)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _allow(value: object) -> list[str] | None:
    """``None`` (its template's list) only where the record says so; anything not a list of
    rule texts allows nothing."""
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(rule, str) for rule in value):
        return list(value)
    return []


def _headers(value: object) -> dict[str, dict[str, str]]:
    """The headers by host, if every one is text; none otherwise."""
    if not isinstance(value, dict):
        return {}
    headers: dict[str, dict[str, str]] = {}
    for host, values in value.items():
        if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
            return {}
        headers[host] = dict(values)
    return headers
