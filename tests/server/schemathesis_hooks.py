"""schemathesis hooks for tests/server/test_service_openapi.py (loaded through
``SCHEMATHESIS_HOOKS``).

A sandbox whose TTL passed is gone by design, so a generated TTL of a second or two would make
the stateful phase report "created resource not found" for the service doing what it was told.
A valid TTL under two minutes is raised to two minutes; invalid ones are sent as generated."""

from __future__ import annotations

from typing import Any

import schemathesis

SHORTEST = 120.0


@schemathesis.hook
def before_call(context: Any, case: Any, **kwargs: Any) -> None:
    body = case.body
    if case.method.upper() != "POST" or not isinstance(body, dict):
        return
    if not (case.path == "/sandboxes" or case.path.endswith("/renew")):
        return
    ttl = body.get("ttl")
    if isinstance(ttl, int | float) and not isinstance(ttl, bool) and 1 <= ttl < SHORTEST:
        body["ttl"] = SHORTEST
