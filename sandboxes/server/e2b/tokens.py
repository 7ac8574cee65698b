"""Each E2B sandbox's envd access token, and the E2B plane's settings.

A token is ``<tenant, base64url>.<HMAC-SHA256(secret, tenant, sandbox id), base64url>``: the
envd plane learns from it which tenant's sandbox is meant and proves it with the MAC, so no
token is stored anywhere, and replicas that share the secret accept each other's tokens.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import secrets

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["E2BSettings", "TokenSigner"]

logger = logging.getLogger(__name__)


class E2BSettings(BaseSettings):
    """The E2B-compatible API's own settings (environment ``SANDBOXES_E2B_*``)."""

    model_config = SettingsConfigDict(env_prefix="SANDBOXES_E2B_", env_nested_delimiter="__", extra="forbid")

    token_secret: SecretStr | None = None
    """Signs the envd access tokens; replicas must share it. Unset: a random one per process, so
    a restart invalidates the tokens handed out before it."""
    templates: dict[str, str] = {"base": "default"}
    """E2B template name -> one of the service's templates; a name not here is looked up as is."""


class TokenSigner:
    """Makes and checks envd access tokens with one secret."""

    def __init__(self, secret: SecretStr | None) -> None:
        if secret is None:
            logger.info("no SANDBOXES_E2B_TOKEN_SECRET: E2B access tokens last until this process ends")
            self._key = secrets.token_bytes(32)
        else:
            self._key = secret.get_secret_value().encode("utf-8")

    def token(self, tenant: str, sandbox_id: str) -> str:
        return f"{_b64(tenant.encode('utf-8'))}.{_b64(self._mac(tenant, sandbox_id))}"

    def tenant_of(self, token: str, sandbox_id: str) -> str | None:
        """The tenant whose token for ``sandbox_id`` this is, or ``None`` if it is not one."""
        encoded, _, mac = token.partition(".")
        try:
            tenant = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode("utf-8")
        except (binascii.Error, ValueError):
            return None
        expected = _b64(self._mac(tenant, sandbox_id))
        return tenant if hmac.compare_digest(expected.encode("ascii"), mac.encode("utf-8", "replace")) else None

    def _mac(self, tenant: str, sandbox_id: str) -> bytes:
        message = f"e2b-envd\x00{tenant}\x00{sandbox_id}".encode()
        return hmac.new(self._key, message, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")
