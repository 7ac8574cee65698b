"""`SSHSandbox`: a sandbox on a VM (or any host) reached over SSH.

Each sandbox is a workspace directory on the host, created at `create` and removed at
`destroy`; commands run with it as their working directory, optionally as another user
(``run_as``, through ``sudo -n -u``). Many sandboxes share one SSH transport per host.

How commands travel: one exec helper (`sandboxes._mux`) per sandbox over one SSH channel, so a
command costs a fork on the host instead of a channel setup; without python3 on the host, one
``exec_command`` per command with the same timeout semantics. Files over 1 MiB move by SFTP
(when commands run as the login user, so permissions mean the same thing).

When the connection drops, the next operation reconnects with backoff. Operations that are
safe to repeat (reads, listings, searches) are retried on a fresh connection; a command or a
write whose fate is unknown answers ``connection_lost`` instead of running twice.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import threading
import time
import uuid
from collections.abc import Mapping

import paramiko
from pydantic import BaseModel, ConfigDict, Field

from sandboxes import _scripts
from sandboxes import protocol as p
from sandboxes._mux import SERVER_SOURCE, MuxBroken, MuxClient
from sandboxes._output import DEFAULT_OUTPUT_LIMIT, OutputBuffer, execute_response
from sandboxes._ssh_connection import (
    SSHAuthenticationError,
    SSHConnection,
    SSHError,
    SSHHostConfig,
    SSHHostKeyError,
    SSHUnreachableError,
    connections,
)
from sandboxes.base import BaseSandbox, _Call
from sandboxes.paths import InvalidPathError, normalize_path

__all__ = [
    "SSHAuthenticationError",
    "SSHError",
    "SSHHostConfig",
    "SSHHostKeyError",
    "SSHSandbox",
    "SSHSandboxConfig",
    "SSHUnreachableError",
]

logger = logging.getLogger(__name__)

_RUN = r"""cwd=$1; marker=$2; cmd=$3; shift 3
for pair do export "$pair"; done
export SANDBOXES_EXEC_ID="$marker"
cd -- "$cwd" || exit 200
exec /bin/sh -c "$cmd"
"""
"""One command without the helper: environment pairs and cwd as quoted arguments."""

_KILL_MARKED = r"""for d in /proc/[0-9]*; do
  if grep -q "SANDBOXES_EXEC_ID=$1" "$d/environ" 2>/dev/null; then kill -9 "${d#/proc/}" 2>/dev/null; fi
done; exit 0
"""


class SSHSandboxConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    host: SSHHostConfig
    workspace_root: str | None = None
    """Where workspaces are created on the host; default ``$HOME/sandboxes``."""
    run_as: str | None = None
    default_timeout: float = Field(default=120.0, ge=0)
    output_limit: int = Field(default=DEFAULT_OUTPUT_LIMIT, gt=0)
    use_exec_helper: bool = True


class SSHSandbox(BaseSandbox):
    bulk_threshold = 1 << 20

    def __init__(self, config: SSHSandboxConfig, workspace: str, connection: SSHConnection) -> None:
        self.config = config
        self.workspace = workspace
        self._connection = connection
        self._id = f"ssh:{config.host.host}:{config.host.port}:{workspace}"
        self._mux: MuxClient | None = None
        self._mux_lock = threading.Lock()
        self._helper_unavailable = not config.use_exec_helper
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def create(cls, config: SSHSandboxConfig) -> SSHSandbox:
        """Connect (errors are raised at once, not retried) and make a fresh workspace."""
        connection = connections.acquire(config.host)
        try:
            root = config.workspace_root or f"{_remote_home(connection)}/sandboxes"
            workspace = f"{normalize_path(root)}/{uuid.uuid4().hex[:16]}"
            _run_simple(connection, _scripts.command('mkdir -p -- "$1" && chmod 700 -- "$1"', workspace))
            return cls(config, workspace, connection)
        except Exception:
            connections.release(connection)
            raise

    @classmethod
    def attach(cls, config: SSHSandboxConfig, workspace: str) -> SSHSandbox:
        connection = connections.acquire(config.host)
        return cls(config, normalize_path(workspace), connection)

    @property
    def id(self) -> str:
        return self._id

    def close(self) -> None:
        """Drop the helper and this sandbox's share of the connection; the workspace stays."""
        if self._closed:
            return
        self._closed = True
        self._drop_helper()
        connections.release(self._connection)

    def destroy(self) -> None:
        """Remove the workspace (idempotent), then close."""
        if not self._closed:
            response = self.execute(_scripts.command('rm -rf -- "$1"', self.workspace), cwd="/")
            if response.exit_code != 0:
                raise SSHError(f"could not remove workspace {self.workspace}: {response.message or response.output}")
        self.close()

    def __enter__(self) -> SSHSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # ------------------------------------------------------------------ execute

    def execute(
        self,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int | None = None,
    ) -> p.ExecuteResponse:
        data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
        timeout = self.config.default_timeout if timeout is None else timeout
        limit = self.config.output_limit if output_limit is None else output_limit
        workdir = cwd or self.workspace
        try:
            for _attempt in range(2):
                mux = self._helper()
                if mux is None:
                    return self._exec_once(command, timeout, data, dict(env or {}), workdir, limit)
                try:
                    return mux.run(command, timeout=timeout, stdin=data, env=env, cwd=workdir, output_limit=limit)
                except MuxBroken as broken:
                    self._drop_helper()
                    if broken.started:
                        return _lost(f"the connection dropped while the command ran: {broken}")
            return _lost("the exec helper failed twice before taking the command")
        except SSHError as exc:
            return p.ExecuteResponse("", error=p.UNAVAILABLE, message=str(exc))

    def _run_call(self, call: _Call) -> p.ExecuteResponse:
        """Reads and listings survive a dropped connection: retried once on a fresh one."""
        response = super()._run_call(call)
        if response.error == p.CONNECTION_LOST and call.idempotent:
            response = super()._run_call(call)
        return response

    def _helper(self) -> MuxClient | None:
        if self._helper_unavailable:
            return None
        with self._mux_lock:
            if self._mux is not None and self._mux.alive:
                return self._mux
            channel = self._connection.transport().open_session(timeout=self.config.host.connect_timeout)
            channel.exec_command(self._as_user(f"exec python3 -u -c {shlex.quote(SERVER_SOURCE)}"))
            try:
                self._mux = MuxClient(_ChannelStream(channel), hello_timeout=20)
            except MuxBroken as broken:
                if channel.exit_status_ready() and channel.recv_exit_status() == 127:
                    logger.warning("no python3 on %s: one exec_command per command", self.config.host.host)
                    self._helper_unavailable = True
                    return None
                raise SSHUnreachableError(f"exec helper did not start: {broken}") from broken
            return self._mux

    def _drop_helper(self) -> None:
        with self._mux_lock:
            if self._mux is not None:
                self._mux.close()
                self._mux = None

    def _as_user(self, command: str) -> str:
        if self.config.run_as is None:
            return command
        return f"sudo -n -u {shlex.quote(self.config.run_as)} -- /bin/sh -c {shlex.quote(command)}"

    def _exec_once(
        self, command: str, timeout: float, stdin: bytes | None, env: dict[str, str], cwd: str, limit: int
    ) -> p.ExecuteResponse:
        marker = uuid.uuid4().hex
        pairs = [f"{name}={value}" for name, value in env.items()]
        started = time.monotonic()
        channel = self._connection.transport().open_session(timeout=self.config.host.connect_timeout)
        channel.set_combine_stderr(True)
        channel.exec_command(self._as_user(_scripts.command(_RUN, cwd, marker, command, *pairs)))
        if stdin is not None:
            channel.sendall(stdin)
        channel.shutdown_write()
        output = OutputBuffer(limit)
        deadline = started + timeout if timeout else None
        timed_out = False
        channel.settimeout(0.1)
        while True:
            try:
                chunk: bytes | None = channel.recv(65536)
            except TimeoutError:
                chunk = None
            if chunk:
                output.write(chunk)
                continue
            if chunk == b"" or channel.exit_status_ready():
                break  # EOF, or exited while a background job holds the channel open
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                _run_simple(self._connection, self._as_user(_scripts.command(_KILL_MARKED, marker)))
                break
            if not self._connection.transport().is_active():
                return _lost("the connection dropped while the command ran")
        code = None if timed_out else channel.recv_exit_status()
        channel.close()
        if code == 200:
            return p.ExecuteResponse("", error=p.FILE_NOT_FOUND, message=f"working directory {cwd!r} not found")
        return execute_response(
            output, code, timed_out=timed_out, timeout=timeout, duration_ms=(time.monotonic() - started) * 1000
        )

    # ------------------------------------------------------------------ SFTP bulk transfer

    def _bulk_eligible(self, path: str, size: int | None) -> bool:
        return self.config.run_as is None and super()._bulk_eligible(path, size)

    def _sftp(self) -> paramiko.SFTPClient:
        client = self._connection.transport().open_sftp_client()
        if client is None:
            raise SSHUnreachableError("the server refused an SFTP session")
        return client

    def _bulk_put(self, files: list[tuple[str, bytes]]) -> list[p.ErrorCode | None]:
        outcomes: list[p.ErrorCode | None] = []
        with self._sftp() as sftp:
            for path, data in files:
                try:
                    with sftp.open(path, "wb") as remote:
                        remote.set_pipelined(True)
                        remote.write(data)
                    outcomes.append(None)
                except OSError as exc:
                    outcomes.append(_sftp_error(exc))
        return outcomes

    def _bulk_get(self, path: str) -> bytes | p.ErrorCode:
        with self._sftp() as sftp:
            try:
                with sftp.open(path, "rb") as remote:
                    remote.prefetch()
                    return bytes(remote.read())
            except OSError as exc:
                return _sftp_error(exc)


class _ChannelStream:
    def __init__(self, channel: paramiko.Channel) -> None:
        self._channel = channel

    def send(self, data: bytes) -> None:
        self._channel.sendall(data)

    def recv(self, size: int) -> bytes:
        return bytes(self._channel.recv(size))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._channel.close()


def _lost(message: str) -> p.ExecuteResponse:
    return p.ExecuteResponse("", error=p.CONNECTION_LOST, message=message)


def _sftp_error(exc: OSError) -> p.ErrorCode:
    import errno

    codes: dict[int, p.ErrorCode] = {
        errno.ENOENT: p.FILE_NOT_FOUND,
        errno.EACCES: p.PERMISSION_DENIED,
        errno.EPERM: p.PERMISSION_DENIED,
        errno.EISDIR: p.IS_DIRECTORY,
        errno.ENOTDIR: p.NOT_A_DIRECTORY,
        errno.ENOSPC: p.NO_SPACE,
    }
    return codes.get(exc.errno or 0, p.BACKEND_ERROR)


def _run_simple(connection: SSHConnection, command: str, timeout: float = 30.0) -> str:
    """A short housekeeping command on its own channel; raises `SSHError` if it fails."""
    channel = connection.transport().open_session(timeout=timeout)
    try:
        channel.settimeout(timeout)
        channel.set_combine_stderr(True)
        channel.exec_command(command)
        chunks = []
        while chunk := channel.recv(65536):
            chunks.append(chunk)
        status = channel.recv_exit_status()
    finally:
        channel.close()
    output = b"".join(chunks).decode("utf-8", "replace")
    if status != 0:
        raise SSHError(f"command on {connection.config.host} failed ({status}): {output.strip()[:500]}")
    return output


def _remote_home(connection: SSHConnection) -> str:
    home = _run_simple(connection, 'printf %s "$HOME"').strip()
    try:
        return normalize_path(home)
    except InvalidPathError as exc:
        raise SSHError(f"unusable $HOME on {connection.config.host}: {home!r}") from exc
