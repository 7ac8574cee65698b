"""SSH connections for `SSHSandbox`: one persistent transport per host, shared by its sandboxes.

Failures to connect are split into distinct exceptions, raised fast, because each asks for a
different fix: a wrong key (`SSHAuthenticationError`), a host key that does not match or is not
known (`SSHHostKeyError`), a host that cannot be reached (`SSHUnreachableError`). A connection
that drops later is reopened on the next use, with backoff.
"""

from __future__ import annotations

import io
import logging
import threading
from pathlib import Path
from typing import Any

import paramiko
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

logger = logging.getLogger(__name__)


class SSHError(Exception):
    """Base of the SSH connection errors."""


class SSHAuthenticationError(SSHError):
    """The server refused every key offered."""


class SSHHostKeyError(SSHError):
    """The server's host key is unknown or differs from known_hosts: possibly a different machine."""


class SSHUnreachableError(SSHError):
    """No SSH server answered (refused, timed out, name not resolved, connection dropped)."""


class SSHHostConfig(BaseModel):
    """How to reach and authenticate to one host. Host keys are verified against known_hosts
    unless ``insecure_accept_any_host_key`` is set, which disables protection against
    impersonation and is logged loudly."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str
    port: int = Field(default=22, gt=0, lt=65536)
    username: str
    key_path: Path | None = None
    private_key: SecretStr | None = None
    """An in-memory private key (OpenSSH or PEM text)."""
    use_agent: bool = True
    known_hosts: Path | None = Path("~/.ssh/known_hosts")
    insecure_accept_any_host_key: bool = False
    connect_timeout: float = Field(default=10.0, gt=0)
    keepalive: int = Field(default=15, ge=0)
    reconnect_attempts: int = Field(default=5, ge=1)

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.host, self.port, self.username)


def _load_private_key(text: str) -> paramiko.PKey:
    errors = []
    for kind in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return kind.from_private_key(io.StringIO(text))
        except (paramiko.SSHException, ValueError) as exc:
            errors.append(f"{kind.__name__}: {exc}")
    raise SSHAuthenticationError(f"unreadable private key ({'; '.join(errors)})")


class SSHConnection:
    """A reference-counted, self-healing transport to one host."""

    def __init__(self, config: SSHHostConfig) -> None:
        self.config = config
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.RLock()
        self.users = 0

    def transport(self) -> paramiko.Transport:
        """The live transport, reconnecting (with backoff) if it dropped."""
        with self._lock:
            if self._client is not None:
                current = self._client.get_transport()
                if current is not None and current.is_active():
                    return current
                self._close_client()
            for attempt in Retrying(
                stop=stop_after_attempt(self.config.reconnect_attempts),
                wait=wait_exponential(multiplier=0.2, max=5),
                retry=retry_if_exception_type(SSHUnreachableError),
                reraise=True,
            ):
                with attempt:
                    self._client = self._connect()
            assert self._client is not None
            transport = self._client.get_transport()
            assert transport is not None
            return transport

    def connect_once(self) -> None:
        """Connect now, without retries: configuration errors surface at once."""
        with self._lock:
            if self._client is None:
                self._client = self._connect()

    def _connect(self) -> paramiko.SSHClient:
        config = self.config
        client = paramiko.SSHClient()
        if config.insecure_accept_any_host_key:
            logger.warning(
                "INSECURE: accepting any host key from %s:%d; the connection is not protected against "
                "impersonation (insecure_accept_any_host_key=True)",
                config.host,
                config.port,
            )
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # noqa: S507 - explicit opt-in
        else:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            if config.known_hosts is not None:
                known = config.known_hosts.expanduser()
                if known.exists():
                    client.load_host_keys(str(known))
        kwargs: dict[str, Any] = {
            "hostname": config.host,
            "port": config.port,
            "username": config.username,
            "timeout": config.connect_timeout,
            "banner_timeout": config.connect_timeout,
            "auth_timeout": config.connect_timeout,
            "allow_agent": config.use_agent,
            "look_for_keys": False,
        }
        if config.private_key is not None:
            kwargs["pkey"] = _load_private_key(config.private_key.get_secret_value())
        if config.key_path is not None:
            kwargs["key_filename"] = str(config.key_path.expanduser())
        where = f"{config.username}@{config.host}:{config.port}"
        try:
            client.connect(**kwargs)
        except paramiko.BadHostKeyException as exc:
            raise SSHHostKeyError(f"host key of {where} CHANGED (not the key in known_hosts): {exc}") from exc
        except paramiko.AuthenticationException as exc:
            raise SSHAuthenticationError(f"authentication to {where} failed: {exc}") from exc
        except paramiko.SSHException as exc:
            if "known_hosts" in str(exc) or "not found in" in str(exc):
                raise SSHHostKeyError(f"host key of {where} is not in known_hosts: {exc}") from exc
            raise SSHUnreachableError(f"SSH handshake with {where} failed: {exc}") from exc
        except (OSError, EOFError) as exc:  # TimeoutError is an OSError
            raise SSHUnreachableError(f"cannot reach {where}: {exc}") from exc
        transport = client.get_transport()
        if transport is not None and config.keepalive:
            transport.set_keepalive(config.keepalive)
        return client

    def _close_client(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None

    def close(self) -> None:
        with self._lock:
            self._close_client()


class _Registry:
    """Shares one connection per (host, port, user) between sandboxes, closing it with the last."""

    def __init__(self) -> None:
        self._connections: dict[tuple[str, int, str], SSHConnection] = {}
        self._lock = threading.Lock()

    def acquire(self, config: SSHHostConfig) -> SSHConnection:
        with self._lock:
            connection = self._connections.get(config.key)
            if connection is None or connection.config != config:
                connection = SSHConnection(config)
                connection.connect_once()
                self._connections[config.key] = connection
            connection.users += 1
            return connection

    def release(self, connection: SSHConnection) -> None:
        with self._lock:
            connection.users -= 1
            if connection.users <= 0:
                connection.close()
                if self._connections.get(connection.config.key) is connection:
                    del self._connections[connection.config.key]


connections = _Registry()
