"""Each E2B sandbox's envd access token, and the E2B plane's settings.

A token is ``<tenant, base64url>.<HMAC-SHA256(secret, tenant, sandbox id), base64url>``: the
envd plane learns from it which tenant's sandbox is meant and proves it with the MAC, so no
token is stored anywhere, and replicas that share the secret accept each other's tokens.

The secret is ``SANDBOXES_E2B_TOKEN_SECRET`` where set (replicas share it); else a random one
kept in the service's data directory (`SECRET_FILE`, created once, mode 0600), so a restarted
service still accepts the tokens it handed out before.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import secrets
import stat
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["SECRET_FILE", "E2BSettings", "TokenSigner", "kept_secret", "signing_secret"]

logger = logging.getLogger(__name__)


class E2BSettings(BaseSettings):
    """The E2B-compatible API's own settings (environment ``SANDBOXES_E2B_*``)."""

    model_config = SettingsConfigDict(env_prefix="SANDBOXES_E2B_", env_nested_delimiter="__", extra="forbid")

    token_secret: SecretStr | None = None
    """Signs the envd access tokens; replicas must share it. Unset: the one kept in the service's
    data directory (`signing_secret`)."""
    templates: dict[str, str] = {"base": "default", "code-interpreter-v1": "code-interpreter"}
    """E2B template name -> one of the service's templates; a name not here is looked up as is.
    ``code-interpreter-v1`` (what `e2b_code_interpreter.Sandbox` creates) needs a service template
    named ``code-interpreter`` (the image ``sandboxes/code-interpreter``, see docs/e2b.md)."""
    default_timeout: int = Field(default=300, ge=1)
    """The timeout (seconds) of a sandbox whose create sends none: E2B's API's default."""


SECRET_FILE = "e2b-token-secret"  # noqa: S105 (a file name, not a secret)
"""The data directory's file holding the default signing secret (64 hex digits)."""
_SECRET_MAX = 4096


def signing_secret(settings: E2BSettings, data_dir: Path) -> SecretStr:
    """The configured secret, else the data directory's `SECRET_FILE`, made the first time:
    written whole under a temporary name, then linked into place, so concurrent first starts
    agree on one and none reads it half written. A file others may read is refused."""
    return kept_secret(settings.token_secret, data_dir / SECRET_FILE)


def kept_secret(configured: SecretStr | None, path: Path) -> SecretStr:
    """``configured``, else the secret kept in ``path`` (made the first time, as `signing_secret`
    says): the E2B tokens' and the preview tokens' (`sandboxes.server.previews`)."""
    if configured is not None:
        return configured
    data_dir = path.parent
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        _create(path)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as source:
        if stat.S_IMODE(os.fstat(source.fileno()).st_mode) & 0o077:
            raise RuntimeError(f"{path} may be read by others: make it 0600 (chmod 600 {path})")
        secret = source.read(_SECRET_MAX).decode("ascii", "replace").strip()
    if len(secret) < 32:
        raise RuntimeError(f"{path} holds no secret (32 characters at least): remove it to make a new one")
    return SecretStr(secret)


def _create(path: Path) -> None:
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_hex(32).encode("ascii"))
            out.flush()
            os.fsync(out.fileno())
        os.link(temporary, path)
        logger.info("made a signing secret (%s)", path.name, extra={"path": str(path)})
    except FileExistsError:
        pass  # another process made it first: its secret is the one
    finally:
        temporary.unlink(missing_ok=True)


class TokenSigner:
    """Makes and checks envd access tokens with one secret."""

    def __init__(self, secret: SecretStr | None) -> None:
        if secret is None:  # a signer of its own, whose tokens no other accepts
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
