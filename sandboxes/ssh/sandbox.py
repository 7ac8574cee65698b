"""`SSHSandbox`: a sandbox on a VM (or any host) reached over SSH.

Each sandbox is a workspace directory on the host, created at `create` and removed at
`destroy`; commands run with it as their working directory. By default (``isolation="user"``)
each sandbox also runs as its own OS user leased from a pool on the host (`sandboxes.ssh._users`),
so sandboxes sharing a VM cannot read each other's files; ``isolation="none"`` runs them all as
the login user (or one ``run_as`` user). Many sandboxes share one SSH transport per host.

How commands travel: one exec helper (`sandboxes._mux`) per sandbox over one SSH channel, so a
command costs a fork on the host instead of a channel setup; without python3 on the host, one
``exec_command`` per command with the same timeout semantics. Files over 1 MiB move by SFTP,
through an ``sftp-server`` started as the sandbox's user, so permissions mean the same thing.

When the connection drops, the next operation reconnects with backoff. Operations that are
safe to repeat (reads, listings, searches) are retried on a fresh connection; a command or a
write whose fate is unknown answers ``connection_lost`` instead of running twice. A command
that never left (no connection, no channel) answers ``unavailable``.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import threading
import time
import uuid
import warnings
from collections.abc import Iterator

import paramiko

from sandboxes import _scripts
from sandboxes import protocol as p
from sandboxes._helper._kill import MARKER_ENV
from sandboxes._mux import (
    PYTHON_FLAGS,
    SERVER_SOURCE,
    Command,
    DrivenSandbox,
    GivenDefaults,
    HelperDriver,
    MuxBroken,
    MuxClient,
    TransportWords,
)
from sandboxes._output import OutputBuffer, OutputHook, execute_response
from sandboxes.base import Call
from sandboxes.lifecycle import FreezeUnavailable, Sandbox
from sandboxes.paths import InvalidPathError, normalize_path
from sandboxes.protocol import NotIsolatedWarning
from sandboxes.ssh import _users as _ssh_users
from sandboxes.ssh._channels import (
    KILL_MARKED,
    RUN,
    ChannelStream,
    EndScan,
    Relayed,
    channel_dead,
    feed,
    lost,
    sftp_error,
)
from sandboxes.ssh._connection import (
    ChannelOutput,
    SSHAuthenticationError,
    SSHConnection,
    SSHError,
    SSHHostConfig,
    SSHHostKeyError,
    SSHUnreachableError,
    connections,
    exit_status,
    run_simple,
    run_status,
)
from sandboxes.ssh._users import UserPoolError
from sandboxes.ssh.config import SSHSandboxConfig, SSHSandboxTemplate

__all__ = [
    "SSHAuthenticationError",
    "SSHError",
    "SSHHostConfig",
    "SSHHostKeyError",
    "SSHSandbox",
    "SSHSandboxConfig",
    "SSHSandboxTemplate",
    "SSHUnreachableError",
    "UserPoolError",
]

logger = logging.getLogger(__name__)

_SPARE_SESSIONS = 2
"""Channel slots an exec helper leaves free for short channels (SFTP, kills, housekeeping)."""


class SSHSandbox(DrivenSandbox, Sandbox):
    """A workspace on a host reached over SSH; its commands and file ops go through the exec
    helper it holds (`helper_driver`), to which it is the `sandboxes._mux.HelperTransport`."""

    bulk_threshold = 1 << 20

    def __init__(
        self, config: SSHSandboxConfig, workspace: str, connection: SSHConnection, user: str | None = None
    ) -> None:
        self.config = config
        self.workspace = workspace
        self.user = user
        """The OS user commands run as; ``None``: the login user."""
        self._connection = connection
        self._id = f"ssh:{config.host.host}:{config.host.port}:{workspace}"
        self._closed = False
        self._destroyed = False
        self._python_gone = False
        defaults = GivenDefaults(config.default_timeout, config.output_limit, config.env, workspace)
        self.helper_driver = HelperDriver(
            self, self._words(), defaults, enabled=config.use_exec_helper, refuse=self._refused
        )

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def create(cls, config: SSHSandboxConfig) -> SSHSandbox:
        """Connect (errors are raised at once, not retried) and make a fresh workspace, as a
        freshly leased user when isolated (`UserPoolError` when none is free)."""
        connection = connections.acquire(config.host)
        try:
            root = config.workspace_root or f"{_remote_home(connection)}/sandboxes"
            workspace = f"{normalize_path(root)}/{uuid.uuid4().hex[:16]}"
            if config.isolation == "user":
                run = _runner(connection)
                user = _ssh_users.lease(run, host=config.host.host, group=config.user_group, workspace=workspace)
                return cls(config, workspace, connection, user)
            _warn_not_isolated(config)
            if config.run_as is not None:
                _ssh_users.make_as(_runner(connection), host=config.host.host, user=config.run_as, workspace=workspace)
            else:
                run_simple(connection, _scripts.command('mkdir -p -- "$1" && chmod 700 -- "$1"', workspace))
            return cls(config, workspace, connection, config.run_as)
        except Exception:
            connections.release(connection)
            raise

    @classmethod
    def attach(cls, config: SSHSandboxConfig, workspace: str) -> SSHSandbox:
        """A sandbox on an existing workspace (of an isolated sandbox: as the user it leased);
        ``with`` only closes it, `destroy` removes it."""
        workspace = normalize_path(workspace)
        connection = connections.acquire(config.host)
        try:
            user = config.run_as
            if config.isolation == "user":
                user = _ssh_users.owner(_runner(connection), host=config.host.host, workspace=workspace)
            attached = cls(config, workspace, connection, user)
            attached.owned = False
            return attached
        except Exception:
            connections.release(connection)
            raise

    @property
    def id(self) -> str:
        return self._id

    @property
    def ref(self) -> str:
        host = self.config.host
        return f"{host.username}@{host.host}:{host.port}:{self.workspace}"

    @property
    def workdir(self) -> str:
        return str(self.workspace)

    def close(self) -> None:
        """Drop the helper and this sandbox's share of the connection; the workspace stays."""
        if self._closed:
            return
        self._closed = True
        self.helper_driver.close()
        connections.release(self._connection)

    def freeze(self) -> None:
        """``SIGSTOP`` to every process of the sandbox's user, its exec helper's included (a
        helper left running would start new processes); only a sandbox with a user of its own."""
        self._signal_all("STOP")

    def thaw(self) -> None:
        self._signal_all("CONT")

    def _signal_all(self, signal: str) -> None:
        """``kill -SIG -1`` as the sandbox's user: every process of the user but that shell."""
        if self.config.isolation != "user" or self.user is None:
            raise FreezeUnavailable(f"sandbox {self.id} has no user of its own on {self.config.host.host} to freeze")
        run_status(self._connection, _ssh_users.as_user(f"kill -{signal} -1 2>/dev/null; :", self.user, None), 30)

    def destroy(self) -> None:
        """Remove the workspace (idempotent), then close. An isolated sandbox's user is emptied
        of everything it left (processes, files) and returned to the pool. Works on a closed
        handle too: it connects again for the cleanup."""
        if self._destroyed:
            return
        self.helper_driver.close()  # an isolated helper runs as the user, whose processes are about to die
        connection = connections.acquire(self.config.host) if self._closed else self._connection
        try:
            if self.config.isolation == "user" and self.user is not None:
                run = _runner(connection)
                _ssh_users.release(run, host=self.config.host.host, user=self.user, workspace=self.workspace)
            else:
                remove = _scripts.command('rm -rf -- "$1"', self.workspace)
                if self.user is not None:
                    remove = _ssh_users.remove_as(self.user, self.workspace)
                try:
                    run_simple(connection, remove, timeout=self.operation_timeout)
                except SSHUnreachableError:
                    raise
                except SSHError as exc:
                    raise SSHError(f"could not remove workspace {self.workspace}: {exc}") from exc
            self._destroyed = True
        finally:
            if self._closed:
                connections.release(connection)
        self.close()

    # ------------------------------------------------------------------ its transport

    def _words(self) -> TransportWords:
        return TransportWords(
            logger,
            subject=self._id,
            fallback="one exec_command per command",
            restart="restarting it",
            command_lost="the connection dropped while the command ran",
            file_op_lost="the connection dropped during the file operation",
        )

    def _refused(self, command: Command) -> p.ExecuteResponse | None:
        """`sandboxes._mux.Refusal`: ``unavailable`` once closed."""
        if self._closed:
            return p.ExecuteResponse("", error=p.UNAVAILABLE, message=f"sandbox {self.id} is closed")
        return None

    @property
    def memory_limit(self) -> str:
        """`sandboxes._mux.HelperTransport`: the host's, which this sandbox does not bound."""
        return "the host's memory"

    def oom_killed(self) -> bool:
        """`sandboxes._mux.HelperTransport`: no memory cgroup of its own to look at, so an exit
        137 stays one."""
        return False

    def start_helper(self) -> MuxClient | None:
        """`sandboxes._mux.HelperTransport`: python3 on a channel of its own, as the sandbox's
        user; ``None`` once closed or while the connection's channel slots are nearly all taken
        (they are kept for short channels: SFTP, kills, housekeeping)."""
        if self._closed:
            return None
        channel = self._connection.open_session(self.config.host.connect_timeout, keep_free=_SPARE_SESSIONS)
        if channel is None:
            return None
        stream = ChannelStream(self._connection, channel)
        try:
            channel.exec_command(
                self._as_user(f"exec python3 {' '.join(PYTHON_FLAGS)} -c {shlex.quote(SERVER_SOURCE)}")
            )
            return MuxClient(stream, hello_timeout=20)
        except MuxBroken:
            self._python_gone = exit_status(channel, wait=2.0) == 127
            stream.close()
            raise
        except BaseException:
            stream.close()
            raise

    def python_missing(self) -> bool:
        """`sandboxes._mux.HelperTransport`: whether the last start's shell exited 127 (no python3)."""
        return self._python_gone

    def answer(self, error: Exception) -> p.ExecuteResponse | None:
        """`sandboxes._mux.HelperTransport`: a connection or a channel that failed before the
        command was sent (`run_alone` answers one that failed after) answers ``unavailable``."""
        if isinstance(error, (SSHError, paramiko.SSHException, OSError, EOFError)):
            return p.ExecuteResponse("", error=p.UNAVAILABLE, message=f"{type(error).__name__}: {error}")
        return None

    def _run_call(self, call: Call) -> p.ExecuteResponse:
        """Reads and listings survive a dropped connection: retried once on a fresh one."""
        response = super()._run_call(call)
        if response.error == p.CONNECTION_LOST and call.idempotent:
            response = super()._run_call(call)
        return response

    def _as_user(self, command: str) -> str:
        if self.user is None:
            return command
        tmpdir = _ssh_users.tmpdir_of(self.workspace) if self.config.isolation == "user" else None
        return _ssh_users.as_user(command, self.user, tmpdir)

    def run_alone(self, command: Command, on_output: OutputHook | None) -> p.ExecuteResponse:
        """`sandboxes._mux.HelperTransport`: ``command`` (`Command.within` the sandbox's
        defaults) on a channel of its own, one ``exec_command``, stdout and stderr merged.
        Raises only before the command was sent."""
        marker = command.env.get(MARKER_ENV) or uuid.uuid4().hex  # the caller's own, when it gave one
        started = time.monotonic()
        # Waiting for a free channel slot counts against the command's own timeout.
        channel = self._connection.open_session(command.timeout or self.config.default_timeout or 3600.0)
        assert channel is not None
        try:
            return self._converse(channel, command, marker, started, on_output)
        except (SSHError, paramiko.SSHException, OSError, EOFError) as exc:
            return lost(f"the connection failed while the command ran: {type(exc).__name__}: {exc}")
        finally:
            self._connection.close_session(channel)

    def _converse(
        self, channel: paramiko.Channel, command: Command, marker: str, started: float, on_output: OutputHook | None
    ) -> p.ExecuteResponse:
        channel.set_combine_stderr(True)
        end = uuid.uuid4().hex
        pairs = [f"{name}={value}" for name, value in command.env.items()]
        run = _scripts.command(RUN, command.workdir, marker, command.command, end, *pairs)
        channel.exec_command(self._as_user(run))
        stdin = command.stdin
        feeder = None
        if stdin:
            # From its own thread: a command that prints much before reading its input would
            # otherwise block on a full window while we block sending to it.
            feeder = threading.Thread(target=feed, args=(channel, stdin), name="ssh-stdin", daemon=True)
            feeder.start()
        else:
            channel.shutdown_write()
        try:
            return self._collect(channel, marker, EndScan(end.encode()), command, started, on_output)
        finally:
            if feeder is not None:
                # Nothing may be sent once we close the channel (see `RUN`); the host has read
                # all of stdin by now unless the connection failed, which wakes the feeder too.
                feeder.join(self.config.host.connect_timeout)

    def _collect(
        self,
        channel: paramiko.Channel,
        marker: str,
        scan: EndScan,
        command: Command,
        started: float,
        on_output: OutputHook | None,
    ) -> p.ExecuteResponse:
        """The command's answer, its output (stdout and stderr merged: `set_combine_stderr`)
        handed to ``on_output`` as it arrives, up to the end token (`RUN`) or the channel's end,
        whichever comes first: never up to the exit status, which may come before the output."""
        timeout, cwd = command.timeout, command.workdir
        output = Relayed(command.output_limit, on_output)
        deadline = started + timeout if timeout else None
        channel.settimeout(0.1)
        eof = False
        while True:
            if not (eof or scan.found):
                try:
                    chunk: bytes | None = channel.recv(65536)
                except TimeoutError:
                    chunk = None
                if chunk:
                    output.write(scan.feed(chunk))
                    continue
                if chunk == b"":
                    eof = True
                    output.write(scan.rest())
            if (eof or scan.found) and channel.exit_status_ready():
                break  # the end token or the channel's end: a job left behind may still hold its output open
            if eof or scan.found:
                channel.status_event.wait(0.1)
            if deadline is not None and time.monotonic() > deadline:
                output.write(scan.rest())
                return self._kill_after_timeout(marker, output, timeout, started)
        code = channel.exit_status
        if code == -1:  # the channel closed without an exit status
            transport = channel.get_transport()
            if transport is None or not transport.is_active():
                return lost("the connection dropped while the command ran")
            return p.ExecuteResponse(
                output.text(), error=p.BACKEND_ERROR, message="the command's shell ended without an exit status"
            )
        if code == 200 and output.getvalue() == marker.encode():
            return p.ExecuteResponse("", error=p.FILE_NOT_FOUND, message=f"working directory {cwd!r} not found")
        return execute_response(
            output, code, timed_out=False, timeout=timeout, duration_ms=(time.monotonic() - started) * 1000
        )

    def _kill_after_timeout(
        self, marker: str, output: OutputBuffer, timeout: float, started: float
    ) -> p.ExecuteResponse:
        try:
            kill = self._as_user(_scripts.command(KILL_MARKED, marker))
            run_simple(self._connection, kill, timeout=self.config.host.connect_timeout)
        except (SSHError, paramiko.SSHException, OSError, EOFError) as exc:
            return lost(f"the command timed out after {timeout}s and could not be killed ({exc}): it may still run")
        return execute_response(
            output, None, timed_out=True, timeout=timeout, duration_ms=(time.monotonic() - started) * 1000
        )

    # ------------------------------------------------------------------ SFTP bulk transfer

    @contextlib.contextmanager
    def _sftp(self) -> Iterator[paramiko.SFTPClient]:
        """An SFTP session on a counted channel slot, as the sandbox's user."""
        channel = self._connection.open_session(self.config.host.connect_timeout)
        assert channel is not None
        try:
            if self.user is None:
                channel.invoke_subsystem("sftp")
            else:
                channel.exec_command(self._as_user(_ssh_users.SFTP_SERVER))
            yield paramiko.SFTPClient(channel)
        finally:
            self._connection.close_session(channel)

    def _bulk_put(self, files: list[tuple[str, bytes]]) -> list[p.ErrorCode | None]:
        outcomes: list[p.ErrorCode | None] = []
        try:
            with self._sftp() as sftp:
                for path, data in files:
                    try:
                        with sftp.open(path, "wb") as remote:
                            remote.set_pipelined(True)
                            remote.write(data)
                        outcomes.append(None)
                    except OSError as exc:
                        if channel_dead(sftp):
                            raise
                        outcomes.append(sftp_error(exc))
        except (SSHError, paramiko.SSHException, OSError, EOFError):
            # Files already written stay reported as written; the rest may be partly written.
            failed: list[p.ErrorCode | None] = [p.CONNECTION_LOST] * (len(files) - len(outcomes))
            return outcomes + failed
        return outcomes

    def _bulk_get(self, path: str, max_bytes: int) -> bytes | p.ErrorCode:
        """Reading is safe to repeat: one retry on a fresh connection after a failure. At most
        ``max_bytes`` are taken: a file that says or turns out to be bigger is ``file_too_large``."""
        for attempt in range(2):
            try:
                with self._sftp() as sftp:
                    try:
                        with sftp.open(path, "rb") as remote:
                            if (remote.stat().st_size or 0) > max_bytes:
                                return p.FILE_TOO_LARGE
                            remote.prefetch()
                            data = bytes(remote.read(max_bytes + 1))
                            return p.FILE_TOO_LARGE if len(data) > max_bytes else data
                    except OSError as exc:
                        if channel_dead(sftp):
                            raise
                        return sftp_error(exc)
            except (SSHError, paramiko.SSHException, OSError, EOFError):
                if attempt:
                    return p.CONNECTION_LOST
        return p.CONNECTION_LOST

    def open_output_stream(self, command: str) -> ChannelOutput:
        """``command`` (``sh``) run by the sandbox's user on a channel of its own, its stdout
        streamed raw: for output too big for `execute`'s text answer (the service's archives)."""
        channel = self._connection.open_session(self.config.host.connect_timeout)
        assert channel is not None
        try:
            channel.exec_command(self._as_user(command))
        except BaseException:
            self._connection.close_session(channel)
            raise
        return ChannelOutput(self._connection, channel)


def _runner(connection: SSHConnection, timeout: float = 60.0) -> _ssh_users.Run:
    return lambda command: run_status(connection, command, timeout)


def _warn_not_isolated(config: SSHSandboxConfig) -> None:
    user = config.run_as or config.host.username
    warnings.warn(
        f"isolation='none': every sandbox on {config.host.host} runs as {user!r} and can read the others' files",
        NotIsolatedWarning,
        stacklevel=3,
    )


def _remote_home(connection: SSHConnection) -> str:
    home = run_simple(connection, 'printf %s "$HOME"').strip()
    try:
        return normalize_path(home)
    except InvalidPathError as exc:
        raise SSHError(f"unusable $HOME on {connection.config.host}: {home!r}") from exc
