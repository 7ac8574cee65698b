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
from sandboxes.server.store import SandboxState

__all__ = ["allow_from_text", "allow_text", "network_record", "read_network_record"]


def network_record(state: SandboxState) -> str:
    """The record of ``state``'s network (compact JSON); it may exceed `NETWORK_RECORD_LIMIT`,
    which the caller checks before recording it."""
    record = {
        "allow": state.egress_allow,
        "headers": state.egress_headers,
        "public": state.public_ports,
        "mask": state.mask_request_host,
        "ports": state.preview_public,
    }
    return json.dumps(record, separators=(",", ":"), sort_keys=True)


def read_network_record(state: SandboxState, text: str) -> None:
    """Take the network ``text`` records into ``state`` (marked set through the API and held on
    its record); a record that cannot be read is the closed network."""
    state.network_set = state.network_on_record = True
    parsed = _parsed(text)
    state.egress_allow = _allow(parsed.get("allow", []))
    state.egress_headers = _headers(parsed.get("headers"))
    public, mask = parsed.get("public"), parsed.get("mask")
    state.public_ports = public if isinstance(public, bool) else None
    state.mask_request_host = mask if isinstance(mask, str) else None
    ports = parsed.get("ports")
    if isinstance(ports, list) and all(type(port) is int and 1 <= port <= 65535 for port in ports):
        state.preview_public = sorted(set(ports))
    else:
        state.preview_public = []


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
