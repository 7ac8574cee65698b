"""Who may reach a sandbox's port through its preview URL (`sandboxes.server.preview_proxy`):
the tenant's API key, a preview token, or anyone once the tenant made the port public.

A preview token is ``<claims, base64url>.<HMAC-SHA256(secret, claims), base64url>``, the claims
``{"t": tenant, "s": sandbox id, "p": port, "e": expiry, "n": token id}``: nothing is stored to
accept one, and replicas sharing the secret (``preview_token_secret``, else one kept in the
data directory as the E2B tokens' is) accept each other's. A token grants that one port of that
one sandbox, until its expiry or its revocation.

A revocation is one small file per token id in the data directory (`REVOKED_DIR`, or the
settings' ``revoked_previews_dir``: 0700, outside every sandbox, each file 0600 and replaced
whole), written before the revocation is answered (a write that fails answers an error, never a
204): every replica sharing that directory, and this one after a restart, refuses the token from
its next request on, each request costing one look for one file. A file says until when it must
be kept (the longest a token lives, from its revocation): each revocation removes those whose
time passed. Which ports are public the sandbox's state holds (`SandboxState.preview_public`:
kept across a restart, inherited by a fork), read from the sandboxes this replica holds, their
record (and state file) read again as any request for them does (`Holdings.held_confirmed`).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from sandboxes.server.auth import Authenticator, Tenant, request_tenant
from sandboxes.server.clock import Clock, WallClock
from sandboxes.server.errors import ServiceError
from sandboxes.server.registry import Entry, Registry
from sandboxes.server.settings import ServiceSettings
from sandboxes.server.store import replace_private

__all__ = [
    "PREVIEW_COOKIE",
    "PREVIEW_PATH",
    "PREVIEW_SECRET_FILE",
    "REVOKED_DIR",
    "TOKEN_ID",
    "Minted",
    "PreviewAccess",
    "preview_token_of",
]

logger = logging.getLogger(__name__)

PREVIEW_PATH = re.compile(r"^/v1/sandboxes/([^/]+)/ports/(\d{1,5})/")
"""A preview URL's path (and the tunnel's, and the tokens' route): the routes authenticate it
themselves, so the request middleware does not ask for a key first."""
PREVIEW_SECRET_FILE = "preview-token-secret"  # noqa: S105 (a file name, not a secret)
"""The data directory's file holding the default signing secret of preview tokens."""
REVOKED_DIR = "revoked-previews"
"""The data directory's directory of revoked preview tokens: a file per token id."""
PREVIEW_COOKIE = "sandboxes_preview"
"""The cookie a browser keeps a preview token in, for the port's path, once it came in a query."""
_MAX_TOKEN = 2048
_MAX_TTL = 7 * 24 * 3600.0
TOKEN_ID = r"^[0-9a-f]{24}$"  # noqa: S105 (a pattern, not a secret)
"""A token id as `PreviewAccess.mint` makes them (a file name, never a path)."""
_TOKEN_ID = re.compile(TOKEN_ID)


@dataclass(frozen=True, slots=True)
class Minted:
    token: str
    token_id: str
    expires_at: float


class PreviewAccess:
    """Preview tokens signed with one secret, and the revoked ones (files in ``revoked``)."""

    def __init__(self, secret: SecretStr, revoked: Path, clock: Clock | None = None) -> None:
        self._key = secret.get_secret_value().encode("utf-8")
        self._clock = clock or WallClock()
        self._revoked = revoked
        revoked.mkdir(parents=True, exist_ok=True)
        os.chmod(revoked, 0o700)

    def mint(self, tenant: str, sandbox_id: str, port: int, ttl: float) -> Minted:
        expires_at = float(int(self._clock.now() + min(ttl, _MAX_TTL)))
        token_id = secrets.token_hex(12)
        claims = {"t": tenant, "s": sandbox_id, "p": port, "e": expires_at, "n": token_id}
        encoded = _b64(json.dumps(claims, separators=(",", ":")).encode("utf-8"))
        return Minted(f"{encoded}.{_b64(self._mac(encoded))}", token_id, expires_at)

    def tenant_of(self, token: str, sandbox_id: str, port: int) -> str | None:
        """The tenant a valid token for this sandbox's port was minted by; ``None`` if it is not
        one, has expired or was revoked (or whether it was cannot be read)."""
        if len(token) > _MAX_TOKEN:
            return None
        encoded, _, mac = token.partition(".")
        if not hmac.compare_digest(_b64(self._mac(encoded)).encode("ascii"), mac.encode("utf-8", "replace")):
            return None
        try:
            claims = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
        except (binascii.Error, ValueError):
            return None
        if not isinstance(claims, dict) or claims.get("s") != sandbox_id or claims.get("p") != port:
            return None
        expiry, tenant, token_id = claims.get("e"), claims.get("t"), claims.get("n")
        if not isinstance(expiry, float | int) or expiry <= self._clock.now() or not isinstance(tenant, str):
            return None
        if not isinstance(token_id, str) or not _TOKEN_ID.match(token_id) or self._is_revoked(token_id):
            return None
        return tenant

    def revoke(self, token_id: str) -> None:
        """Record ``token_id`` revoked, for every replica sharing the directory and every restart,
        then remove the revocations whose token has expired anyway. `ServiceError` if it cannot
        be recorded (the token may still be accepted), or it is no token id."""
        if not _TOKEN_ID.match(token_id):
            raise ServiceError("invalid_request", f"{token_id!r} is not a preview token's id")
        now = self._clock.now()
        try:
            replace_private(self._revoked / token_id, repr(now + _MAX_TTL))
        except OSError as exc:
            logger.error("could not record the revocation of preview token %s: %s", token_id, exc)
            raise ServiceError("internal", "the revocation could not be recorded: the token is not revoked") from exc
        self._forget_expired(now)

    def _is_revoked(self, token_id: str) -> bool:
        """Whether ``token_id``'s revocation is recorded; ``True`` too if that cannot be known."""
        try:
            os.stat(self._revoked / token_id)
        except FileNotFoundError:
            return False
        except OSError as exc:
            logger.warning("cannot tell whether preview token %s was revoked, refusing it: %s", token_id, exc)
        return True

    def _forget_expired(self, now: float) -> None:
        """Remove the revocations kept past the longest a token lives (unreadable ones stay)."""
        for path in self._revoked.iterdir():
            if not _TOKEN_ID.match(path.name):
                continue
            with contextlib.suppress(OSError, ValueError):
                if float(path.read_text(encoding="ascii")) <= now:
                    path.unlink()

    def _mac(self, encoded: str) -> bytes:
        return hmac.new(self._key, b"preview\x00" + encoded.encode("utf-8", "replace"), hashlib.sha256).digest()

    async def entry_for(
        self,
        scope: MutableMapping[str, Any],
        auth: Authenticator,
        settings: ServiceSettings,
        registry: Registry,
        sandbox_id: str,
        port: int,
    ) -> tuple[Entry, Tenant]:
        """The sandbox a preview request may reach, and whose rate bucket it takes from: by the
        request's key (its tenant's) when it carries one, else its preview token, else the port
        being public (a bucket of the tenant's apart: strangers on a shared link cannot spend
        its API's); ``unauthorized`` otherwise, ``not_found`` for a sandbox not the tenant's."""
        headers = scope["headers"]
        if any(key == b"authorization" for key, _ in headers):
            tenant = request_tenant(auth, scope)
            return await registry.find(tenant, sandbox_id), tenant
        token = preview_token_of(scope)
        if token is not None:
            tenant_id = self.tenant_of(token, sandbox_id, port)
            if tenant_id is None:
                raise ServiceError("unauthorized", "the preview token is not valid for this port, expired or revoked")
        else:
            tenant_id = await _public_tenant(registry, sandbox_id, port)
            if tenant_id is None:
                raise ServiceError("unauthorized", "an API key or a preview token is needed (this port is not public)")
        tenant = Tenant(tenant_id, settings.policy_for(tenant_id))
        scope.setdefault("state", {})["tenant"] = tenant_id
        entry = await registry.find(tenant, sandbox_id)
        return entry, Tenant(f"{tenant_id} (previews)", tenant.policy)  # a rate bucket apart from its API's


def preview_token_of(scope: Mapping[str, Any]) -> str | None:
    """The request's preview token: ``?preview_token=``, an ``X-Preview-Token`` header, or the
    cookie a first visit with the query set."""
    query = scope.get("query_string", b"").decode("latin-1")
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name == "preview_token" and value:
            return str(value)
    for key, value in scope["headers"]:
        if key == b"x-preview-token":
            return str(value.decode("latin-1"))
        if key == b"cookie":
            for cookie in value.decode("latin-1").split(";"):
                name, _, kept = cookie.strip().partition("=")
                if name == PREVIEW_COOKIE and kept:
                    return str(kept)
    return None


async def _public_tenant(registry: Registry, sandbox_id: str, port: int) -> str | None:
    """The tenant of the sandbox if its port was made public, through any replica sharing the
    data directory (`Holdings.network_of`); ``None`` otherwise."""
    state = await registry.network_of(sandbox_id)
    if state is None or not state.preview_is_public(port):
        return None
    return state.tenant


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")
