"""envd's signed file URLs (the SDK's ``download_url`` and ``upload_url``): ``GET``/``POST /files``
with ``signature`` (and ``signature_expiration``) in the query instead of an ``X-Access-Token``.

The signature is envd's v1: ``"v1_" + base64(sha256("path:operation:username:token[:expiration]"))``
without padding, ``operation`` ``read`` or ``write``, ``username`` empty when the query names none.
The SDK joins ``/files`` to ``E2B_SANDBOX_URL`` as an absolute path, so its URL reaches this
service's root ``/files`` with no sandbox id: there the sandbox is the one whose access token
makes the signature (at most one can: each token is an HMAC of its own sandbox's id), held here
or else recorded on a shared backend (held by another replica: adopted here), the records read
at most once per interval however many signatures fail, and a sandbox made on another replica
since the last read found in the next one, not refused (`sandboxes.server.e2b.recorded`).
Refusals are envd's: 401 with ``missing signature query parameter``, ``invalid signature`` or
``signature is already expired`` (checked after the signature, as envd does)."""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import time
from collections.abc import Callable
from typing import Literal

from fastapi import Request

from sandboxes.server.auth import Tenant
from sandboxes.server.e2b.common import e2b_state, service
from sandboxes.server.e2b.recorded import INTERVAL, Recorded
from sandboxes.server.errors import ServiceError
from sandboxes.server.registry import Entry

__all__ = ["Operation", "signature", "signed_sandbox"]

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
        match = await _recorded(request, lambda r: named in (None, r.sandbox_id) and signs(r.token))
    if match is None:
        raise _refused("invalid signature")
    if expiration is not None and expiration < time.time():
        raise _refused("signature is already expired")
    return await _awake(request, *match)


async def _recorded(request: Request, signed: Callable[[Recorded], bool]) -> tuple[str, str] | None:
    """The tenant and id of the recorded sandbox ``signed`` picks: in a read of the records
    started at most `INTERVAL` before the request, else in one started after it (a sandbox made
    on another replica since the last read is in that one)."""
    arrived, recorded = time.monotonic(), e2b_state(request).recorded
    read = await recorded.read(arrived - INTERVAL, functools.partial(_records, request))
    found = next((r for r in read.sandboxes if signed(r)), None)
    if found is None and read.started < arrived:
        read = await recorded.read(arrived, functools.partial(_records, request))
        found = next((r for r in read.sandboxes if signed(r)), None)
    return None if found is None else (found.tenant, found.sandbox_id)


async def _records(request: Request) -> list[Recorded]:
    """Every tenant's live sandboxes on the shared backends, with their access tokens."""
    signer = e2b_state(request).signer
    return [Recorded(s.tenant, s.id, signer.token(s.tenant, s.id)) for s in await service(request).registry.recorded()]


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
