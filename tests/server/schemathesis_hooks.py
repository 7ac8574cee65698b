"""schemathesis hooks for tests/server/test_service_openapi.py (loaded through
``SCHEMATHESIS_HOOKS``).

A sandbox whose TTL passed is gone by design, so a generated TTL of a second or two would make
the stateful phase report "created resource not found" for the service doing what it was told.
A valid TTL under two minutes is raised to two minutes; invalid ones are sent as generated.

An ``Idempotency-Key`` means "the same create": generated values repeat (a short string is
likely twice) with other bodies, which the service rightly refuses (422, as the IETF draft has
it). A valid key is made unique per call; invalid ones are sent as generated. Replays are
tests/server/test_service_idempotency.py's.

A streamed watch lasts until its client leaves (keep-alives keep it from going quiet), and
schemathesis reads every answer whole: a generated watch without a ``timeout``, or a valid one
over a few seconds, is sent with ``timeout`` of two seconds (the bound itself is
tests/server/test_service_watch.py's)."""

from __future__ import annotations

import re
import uuid
from typing import Any

import schemathesis

from sandboxes.server.idempotency import KEY_PATTERN

SHORTEST = 120.0
WATCH_LONGEST = 2.0


@schemathesis.hook
def before_call(context: Any, case: Any, **kwargs: Any) -> None:
    _unique_key(case)
    _bounded_watch(case)
    body = case.body
    if case.method.upper() != "POST" or not isinstance(body, dict):
        return
    if not (case.path == "/sandboxes" or case.path.endswith("/renew")):
        return
    ttl = body.get("ttl")
    if isinstance(ttl, int | float) and not isinstance(ttl, bool) and 1 <= ttl < SHORTEST:
        body["ttl"] = SHORTEST


def _unique_key(case: Any) -> None:
    for name, value in list((case.headers or {}).items()):
        if name.lower() == "idempotency-key" and isinstance(value, str) and re.match(KEY_PATTERN, value):
            case.headers[name] = f"{value[:200]}-{uuid.uuid4().hex}"


def _bounded_watch(case: Any) -> None:
    if case.method.upper() != "GET" or not case.path.endswith("/watch"):
        return
    query = case.query if isinstance(case.query, dict) else {}
    try:
        timeout = float(query.get("timeout", "inf"))
    except (TypeError, ValueError):
        return  # not a number: sent as generated, to be refused
    if timeout > WATCH_LONGEST:
        case.query = {**query, "timeout": WATCH_LONGEST}
