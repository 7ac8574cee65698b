"""envd's signed file URLs (the SDK's ``download_url`` and ``upload_url``): ``GET``/``POST /files``
with ``signature`` (and ``signature_expiration``) in the query instead of an ``X-Access-Token``.

The signature is envd's v1: ``"v1_" + base64(sha256("path:operation:username:token[:expiration]"))``
without padding, ``operation`` ``read`` or ``write``, ``username`` empty when the query names none.
The SDK joins ``/files`` to ``E2B_SANDBOX_URL`` as an absolute path, so its URL reaches this
service's root ``/files`` with no sandbox id: there the sandbox is the one whose access token
makes the signature (at most one can: each token is an HMAC of its own sandbox's id), held here
or else recorded on a shared backend (held by another replica: adopted here), the records read
at most once per interval however many signatures fail (`sandboxes.server.e2b.recorded`).
Refusals are envd's: 401 with ``missing signature query parameter``, ``invalid signature`` or
``signature is already expired`` (checked after the signature, as envd does)."""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import hmac
import logging
import time
from typing import Literal

from fastapi import Request

from sandboxes.server import census
from sandboxes.server.auth import Tenant
from sandboxes.server.e2b.common import e2b_state, service
from sandboxes.server.e2b.recorded import Recorded
from sandboxes.server.errors import ServiceError
from sandboxes.server.registry import Entry

__all__ = ["Operation", "signature", "signed_sandbox"]

logger = logging.getLogger(__name__)

Operation = Literal["read", "write"]
_MAX_SIGNATURE = 64
"""Longer than any v1 signature (3 + 43 characters): a longer one is refused unread."""


def signature(path: str, operation: Operation, username: str, token: str, expiration: int | None) -> str:
    """envd's v1 signature of one file operation with ``token``."""
    parts = [path, operation, username, token] + ([] if expiration is None else [str(expiration)])
    digest = hashlib.sha256(":".join(parts).encode("utf-8")).digest()
    return "v1_" + base64.b64encode(digest).rstrip(b"=").decode("ascii")


def _refused(message: str) -> ServiceError:
    return ServiceError("unauthorized", message, status=401)


def _expiration(request: Request) -> int | None:
    raw = request.query_params.get("signature_expiration")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ServiceError("invalid_request", "signature_expiration is not an integer", status=400) from None


async def signed_sandbox(request: Request, path: str, operation: Operation) -> Entry:
    """The sandbox a signed ``/files`` request is for: the one named by ``E2b-Sandbox-Id`` if
    sent, else whichever sandbox held here, or recorded on a shared backend, signed it; refused
    with envd's 401 otherwise."""
    given = request.query_params.get("signature")
    if given is None:
        raise _refused("missing signature query parameter")
    expiration = _expiration(request)
    username = request.query_params.get("username", "")
    svc, e2b = service(request), e2b_state(request)
    named = request.headers.get("e2b-sandbox-id")

    def signs(token: str) -> bool:
        expected = signature(path, operation, username, token, expiration)
        return hmac.compare_digest(expected.encode("ascii"), given.encode("utf-8", "replace"))

    if len(given) > _MAX_SIGNATURE:
        raise _refused("invalid signature")
    held = [(e.state.tenant, e.state.id) for key, e in svc.registry.entries.items() if named in (None, key)]
    match = next(((tenant, key) for tenant, key in held if signs(e2b.signer.token(tenant, key))), None)
    if match is None:
        recorded = await e2b.recorded.read(functools.partial(_records, request))
        match = next(
            ((r.tenant, r.sandbox_id) for r in recorded if named in (None, r.sandbox_id) and signs(r.token)), None
        )
    if match is None:
        raise _refused("invalid signature")
    if expiration is not None and expiration < time.time():
        raise _refused("signature is already expired")
    return await _awake(request, *match)


async def _records(request: Request) -> list[Recorded]:
    """Every tenant's live sandboxes on the shared backends, with their access tokens."""
    svc, signer = service(request), e2b_state(request).signer
    try:
        states = await asyncio.to_thread(census.all_states, svc.registry.backends)
    except Exception as exc:
        logger.warning("reading the sandboxes' records failed: %s", exc, exc_info=True)
        raise ServiceError("backend_unavailable", "the backend's records cannot be read now") from exc
    now = svc.registry.clock.now()
    return [Recorded(s.tenant, s.id, signer.token(s.tenant, s.id)) for s in states if s.expires_at > now]


async def _awake(request: Request, tenant_id: str, sandbox_id: str) -> Entry:
    svc = service(request)
    tenant = Tenant(tenant_id, svc.settings.policy_for(tenant_id))
    request.scope.setdefault("state", {})["tenant"] = tenant.id
    svc.limiter.check(tenant)
    try:
        return await svc.registry.awake(await svc.registry.find(tenant, sandbox_id))
    except ServiceError as exc:
        if exc.code in ("not_found", "paused"):
            raise ServiceError(exc.code, exc.message, status=502) from None
        raise
