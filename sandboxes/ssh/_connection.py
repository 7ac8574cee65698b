"""SSH connections for `SSHSandbox`: one persistent transport per host, shared by its sandboxes.

Failures to connect are split into distinct exceptions, raised fast, because each asks for a
different fix: a wrong key (`SSHAuthenticationError`), a host key that does not match or is not
known (`SSHHostKeyError`), a host that cannot be reached (`SSHUnreachableError`). A connection
that drops later is reopened on the next use, with backoff.

A peer that stops answering without closing the connection (a frozen VM, a cut network) is
noticed by keepalive requests that expect a reply, like OpenSSH's ``ServerAliveCountMax``: the
connection is then closed, so every command waiting on it fails at once instead of hanging.

sshd accepts at most ``MaxSessions`` (default 10) channels per connection and refuses the rest;
since the sandboxes of a host share one connection, channels are counted here and a new one
waits for a free slot rather than being refused.
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import threading
import time
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
    keepalive: float = Field(default=15, ge=0)
    """Seconds between keepalive requests; ``0`` disables them (and dead-peer detection)."""
    keepalive_count_max: int = Field(default=3, ge=1)
    """Keepalive intervals without any answer after which the connection is declared dead."""
    reconnect_attempts: int = Field(default=5, ge=1)
    max_sessions: int = Field(default=10, ge=2)
    """The server's ``MaxSessions``: channels open at once on this connection."""

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
        self._sessions: set[paramiko.Channel] = set()
        """Channels open on the current transport; a reconnect starts a fresh set."""
        self._opening = 0
        self._sessions_changed = threading.Condition()
        self._stop_watch = threading.Event()

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

    def open_session(self, timeout: float, *, keep_free: int = 0) -> paramiko.Channel | None:
        """A new channel, counted against ``max_sessions``; give it back with `close_session`.

        Waits up to ``timeout`` for a free slot (then raises `SSHUnreachableError`). With
        ``keep_free``, answers ``None`` at once unless that many slots would stay free: how a
        long-lived channel (an exec helper) avoids starving the short ones."""
        transport = self.transport()
        limit = self.config.max_sessions - keep_free
        with self._sessions_changed:
            self._sessions = {c for c in self._sessions if c.get_transport() is transport}

            def used() -> int:
                return len(self._sessions) + self._opening

            if keep_free and used() >= limit:
                return None
            if not self._sessions_changed.wait_for(lambda: used() < limit, timeout):
                raise SSHUnreachableError(
                    f"all {self.config.max_sessions} sessions to {self.config.host} stayed busy for {timeout}s"
                )
            self._opening += 1
        channel = None
        try:
            channel = self._open_refused_or_not(transport)
            return channel
        finally:
            with self._sessions_changed:
                self._opening -= 1
                if channel is not None:
                    self._sessions.add(channel)
                self._sessions_changed.notify_all()

    def _open_refused_or_not(self, transport: paramiko.Transport) -> paramiko.Channel:
        """Open a channel, retrying refusals for up to ``connect_timeout``: sshd frees a closed
        session's slot only after it has processed the close, so an open that follows a close
        closely can be refused although our count says a slot is free. A refusal is an answer
        (the connection lives); a timeout or a dead transport is not, and is raised at once."""
        deadline = time.monotonic() + self.config.connect_timeout
        delay = 0.01
        while True:
            started = time.monotonic()
            try:
                return transport.open_session(timeout=max(deadline - started, 0.1))
            except paramiko.SSHException:
                answered = transport.is_active() and time.monotonic() - started < self.config.connect_timeout / 2
                if not answered or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.25)

    def close_session(self, channel: paramiko.Channel) -> None:
        with contextlib.suppress(Exception):  # a channel of a dead transport may fail to close
            channel.close()
        with self._sessions_changed:
            self._sessions.discard(channel)
            self._sessions_changed.notify_all()

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
            detail = str(exc)
            if detail == "No existing session":  # paramiko's word for a handshake that timed out
                detail = f"no SSH handshake within {config.connect_timeout}s"
            raise SSHUnreachableError(f"SSH handshake with {where} failed: {detail}") from exc
        except (OSError, EOFError) as exc:  # TimeoutError is an OSError
            raise SSHUnreachableError(f"cannot reach {where}: {exc}") from exc
        transport = client.get_transport()
        assert transport is not None
        # Without it, Nagle's algorithm holds each small write until the peer's delayed ACK of the last.
        with contextlib.suppress(OSError, AttributeError):  # not a TCP socket: nothing to tune
            transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if config.keepalive:
            threading.Thread(
                target=self._watch, args=(transport, self._stop_watch), name="ssh-keepalive", daemon=True
            ).start()
        return client

    def _watch(self, transport: paramiko.Transport, stop: threading.Event) -> None:
        """Ask for a reply every ``keepalive`` seconds; close the transport when none comes
        within ``keepalive * keepalive_count_max`` (TCP alone may wait many minutes)."""
        interval = self.config.keepalive
        patience = interval * self.config.keepalive_count_max
        while not stop.wait(interval) and transport.is_active():
            answered = threading.Event()

            def ask(done: threading.Event = answered) -> None:
                # sshd answers an unknown global request with a failure: any answer proves life.
                transport.global_request("keepalive@openssh.com", wait=True)
                done.set()

            threading.Thread(target=ask, name="ssh-keepalive-request", daemon=True).start()
            if not answered.wait(patience) and transport.is_active() and not stop.is_set():
                logger.warning(
                    "%s:%d did not answer for %.1fs: closing the connection",
                    self.config.host,
                    self.config.port,
                    patience,
                )
                transport.close()
                return

    def _close_client(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None

    def close(self) -> None:
        with self._lock:
            self._stop_watch.set()
            self._stop_watch = threading.Event()
            self._close_client()


class _Registry:
    """Shares one connection per (host, port, user) between sandboxes, closing it with the last."""

    def __init__(self) -> None:
        self._connections: dict[tuple[str, int, str], SSHConnection] = {}
        self._host_locks: dict[tuple[str, int, str], threading.Lock] = {}
        self._lock = threading.Lock()

    def acquire(self, config: SSHHostConfig) -> SSHConnection:
        """The shared connection to ``config``'s host, connecting if there is none. Connecting
        holds only that host's lock: a slow or unreachable host does not stall the others."""
        with self._lock:
            host_lock = self._host_locks.setdefault(config.key, threading.Lock())
        with host_lock:
            with self._lock:
                connection = self._connections.get(config.key)
                if connection is not None and connection.config == config:
                    connection.users += 1
                    return connection
            connection = SSHConnection(config)
            connection.connect_once()
            with self._lock:
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


def run_simple(connection: SSHConnection, command: str, timeout: float = 30.0) -> str:
    """A short housekeeping command on its own channel; raises `SSHError` if it fails, or if
    the connection does (`SSHUnreachableError`)."""
    status, output = run_status(connection, command, timeout)
    if status != 0:
        raise SSHError(f"command on {connection.config.host} failed ({status}): {output.strip()[:500]}")
    return output


def run_status(connection: SSHConnection, command: str, timeout: float) -> tuple[int, str]:
    """A short housekeeping command's exit status and output; raises `SSHUnreachableError` if
    the connection fails."""
    try:
        channel = connection.open_session(timeout)
        assert channel is not None
        try:
            channel.settimeout(timeout)
            channel.set_combine_stderr(True)
            channel.exec_command(command)
            chunks = []
            while chunk := channel.recv(65536):
                chunks.append(chunk)
            status = exit_status(channel, wait=timeout)
        finally:
            connection.close_session(channel)
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise SSHUnreachableError(f"{connection.config.host}: {type(exc).__name__}: {exc}") from exc
    return status, b"".join(chunks).decode("utf-8", "replace")


def exit_status(channel: paramiko.Channel, wait: float) -> int:
    """The channel's exit status, waiting up to ``wait`` seconds for it: it may trail the end of
    output. -1 if it never came."""
    if channel.exit_status == -1:
        channel.status_event.wait(wait)
    return int(channel.exit_status)


class ChannelOutput:
    """The stdout of a command on a channel of its own, read raw as it comes (`recv`), then its
    exit status (`exit_code`). Stderr is drained as it comes (an unread stderr would fill the
    channel's window and stall stdout) and its start kept, bounded. Silence past ``timeout``
    seconds, or a dropped connection, ends it with an unknown status."""

    _KEPT = 65536

    def __init__(self, connection: SSHConnection, channel: paramiko.Channel, *, timeout: float = 300.0) -> None:
        self._connection = connection
        self._channel = channel
        self._timeout = timeout
        self._broken = False
        self._status: int | None = None
        self.stderr = bytearray()
        channel.settimeout(0.2)

    def recv(self, size: int) -> bytes:
        """Up to ``size`` bytes of stdout; ``b""`` at its end, however it ended."""
        silent_since = time.monotonic()
        while True:
            self._drain_stderr()
            try:
                data = bytes(self._channel.recv(size))
            except TimeoutError:
                if time.monotonic() - silent_since > self._timeout:
                    self._broken = True
                    return b""
                continue
            except (paramiko.SSHException, OSError, EOFError):
                self._broken = True
                return b""
            if not data and self._status is None:
                # The status trails the end of output; a channel closed before it came never
                # gets it (the caller closes once it read the end): take it now.
                self._status = exit_status(self._channel, wait=self._connection.config.connect_timeout)
            return data

    def _drain_stderr(self) -> None:
        while self._channel.recv_stderr_ready():
            data = self._channel.recv_stderr(65536)
            self.stderr += data[: max(0, self._KEPT - len(self.stderr))]

    def exit_code(self) -> int | None:
        """The exit status once the output ended; ``None`` when it never came."""
        if self._broken or self._status is None:
            return None
        return None if self._status == -1 else self._status

    def close(self) -> None:
        self._connection.close_session(self._channel)
