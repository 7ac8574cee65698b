"""`DockerSandbox`: a sandbox in a Docker container, driven through the Docker API.

How commands reach the container: one long-lived exec helper (`sandboxes._mux`) per sandbox,
attached over a single ``docker exec`` stream, answers each command with a fork instead of a
fresh ``docker exec``. If the helper dies it is restarted on the next command;
if the image has no python3 to run it, each command falls back to its own ``docker exec``, with
the same timeout semantics (the process tree is found by an environment marker and killed).

How files move: small files inline through ``execute`` (one round trip for a whole batch); big
ones in the workspace volume in bounded chunks through ``execute`` in, and raw through a
``cat`` of their own ``docker exec`` out: always as the sandbox's user, never through the
engine's archive API, which works as root and follows the links the sandbox made.

Creating, pooling and sweeping containers is `sandboxes.docker.provider`'s business.
"""

from __future__ import annotations

import contextlib
import io
import logging
import posixpath
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from sandboxes import _parse, _scripts
from sandboxes import protocol as p
from sandboxes._helper._kill import MARKER_ENV
from sandboxes._mux import (
    HAS_PYTHON_SH,
    OOM_COUNT_SH,
    PYTHON_FLAGS,
    SERVER_SOURCE,
    Command,
    DrivenSandbox,
    HelperDriver,
    MuxBroken,
    MuxClient,
    OomCount,
    TransportWords,
    python_missing,
)
from sandboxes._output import OutputBuffer, OutputHook, execute_response
from sandboxes._staged import CHUNK_BYTES as STAGE_CHUNK_BYTES
from sandboxes._staged import TIMEOUT as _STAGE_TIMEOUT
from sandboxes._staged import remove_staged, stage_file
from sandboxes.base import Call, write_call
from sandboxes.docker._containers import create_container, remove_sandbox, slim_container
from sandboxes.docker._io import (
    TOO_MUCH,
    ExecOutput,
    ExecSocket,
    exec_ended,
    exit_recorded,
    polled_exit_code,
    read_exec_stdout,
)
from sandboxes.docker.config import LABEL_MANAGED, DockerSandboxConfig
from sandboxes.lifecycle import Sandbox
from sandboxes.paths import InvalidPathError, is_within, normalize_path

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container

logger = logging.getLogger(__name__)


BULK_THRESHOLD = 1 << 20
"""Files above this size move as tar streams rather than inline through ``execute``."""


EXIT_CODE_WAIT = 10.0
"""Seconds an exec whose output ended may take before the engine records its exit code."""
_FREEZE_ATTEMPTS = 6
"""Tries of ``docker pause`` when the runtime gave up freezing (`pause_container`)."""


def _freeze_gave_up(exc: BaseException) -> bool:
    """Whether ``exc`` is the runtime's "unable to freeze", which a later try may not meet."""
    import docker.errors

    return isinstance(exc, docker.errors.APIError) and "unable to freeze" in str(exc.explanation)


def pause_container(container: Container) -> None:
    """``docker pause`` of ``container``, paused already or not. The runtime gives up ("unable
    to freeze") when a process does not reach the frozen state in its time, which a loaded host
    brings about; that is tried again a few times."""
    for attempt in Retrying(
        retry=retry_if_exception(_freeze_gave_up),
        stop=stop_after_attempt(_FREEZE_ATTEMPTS),
        wait=wait_exponential(multiplier=0.1, max=2.0),
        reraise=True,
    ):
        with attempt:
            _pause_once(container)


def _pause_once(container: Container) -> None:
    import docker.errors

    try:
        container.pause()
    except docker.errors.APIError as exc:
        if "already paused" not in str(exc.explanation):  # the engine's 409 or 500 alike
            raise


_SMALL_OUTPUT = 4096
"""Output kept from an internal script (`DockerSandbox._run_small`)."""

_READ_AS_USER = r"""f=$1
if [ ! -f "$f" ]; then why "$f"; [ "$c" = 12 ] && [ -e "$f" ] && c=16; exit "$c"; fi
{ [ -f /proc/self/fd/3 ] || exit 16; [ "$(stat -L -c %s /proc/self/fd/3)" -le "$2" ] || exit 17
  exec head -c "$(($2 + 1))" <&3; } 3< "$f" 2>/dev/null
why "$f"; exit "$c"
"""
"""Copy ``$1`` to stdout as the sandbox's user, at most ``$2 + 1`` bytes (17: its size says it
is bigger; more than ``$2`` sent: it held more, as a pseudo-file whose size says 0 does, and the
reader counts them): checked, then opened once, and what was opened checked again (through
``/proc/self/fd``) to be a regular file, so a path swapped meanwhile for a FIFO or a device does
not stream forever; a link followed only where the user may follow it."""


_KILL_ATTEMPTS = 20
"""Tries of a timed-out command's kill (`DockerSandbox._kill_marked`) while runc cannot start it."""
_EXIT_EXEC_FAILED = 126
_RUNC_FAILED = "OCI runtime exec failed"
"""How the engine says runc could not start an exec's process (exit 126, in the stream; or an
API error): at the pids limit, runc's own ``init`` loses its race to fork in the container."""


class _RuncLost(Exception):
    """runc could not start an exec's process (`_RUNC_FAILED`): nothing of it ran."""


def _runc_lost(exc: BaseException) -> bool:
    import docker.errors

    return isinstance(exc, _RuncLost) or (isinstance(exc, docker.errors.APIError) and _RUNC_FAILED in str(exc))


class _MayHaveRun(Exception):
    """The engine failed a one-exec command after its start was sent: ``connection_lost``."""


def _engine_errors() -> tuple[type[Exception], ...]:
    """What docker-py raises when the engine refuses or fails a call: an API error (a paused
    container's 409, a removed one's 404) or no answer at all (requests' errors). The protocol's operations answer
    them in its vocabulary, never raise them."""
    import docker.errors
    import requests

    return (docker.errors.DockerException, requests.RequestException)


class DockerSandbox(DrivenSandbox, Sandbox):
    """One container. Thread-safe: many commands and file operations may run at once. Its
    commands and file ops go through the exec helper it holds (`helper_driver`), to which it is
    the `sandboxes._mux.HelperTransport`."""

    config: DockerSandboxConfig

    def __init__(
        self, container: Container, client: docker.DockerClient, config: DockerSandboxConfig, *, owned: bool = True
    ) -> None:
        self.container = slim_container(container)
        self.client = client
        self.config = config
        self.owned = owned
        self._oom = OomCount()
        self._reap_init = (container.labels or {}).get(LABEL_MANAGED) == "true"
        """Whether every orphan its init adopts is a command's (see `sandboxes._helper._server`):
        only in the containers `create_container` made, whose init runs nothing else."""
        self.helper_driver = HelperDriver(self, self._words(), config, enabled=config.use_exec_helper)

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def create(
        cls, config: DockerSandboxConfig | None = None, *, client: docker.DockerClient | None = None
    ) -> DockerSandbox:
        import docker as docker_sdk

        config = config or DockerSandboxConfig()
        client = client or docker_sdk.from_env()
        return cls(create_container(client, config), client, config)

    @classmethod
    def attach(
        cls, container_id: str, *, client: docker.DockerClient | None = None, config: DockerSandboxConfig | None = None
    ) -> DockerSandbox:
        """Drive an existing container; `destroy` still removes it, `close` leaves it running."""
        import docker as docker_sdk

        client = client or docker_sdk.from_env()
        return cls(client.containers.get(container_id), client, config or DockerSandboxConfig(), owned=False)

    @property
    def id(self) -> str:
        return str(self.container.id)

    @property
    def ref(self) -> str:
        return self.id

    @property
    def workdir(self) -> str:
        return self.config.workdir

    @property
    def user_ids(self) -> tuple[int, int]:
        return self.config.uid_gid

    def stop(self) -> None:
        self.close()
        import docker.errors

        with contextlib.suppress(docker.errors.NotFound):
            self.container.stop(timeout=1)

    def freeze(self) -> None:
        """``docker pause``: the container's cgroup freezer stops every process in it
        (`pause_container`)."""
        pause_container(self.container)

    def thaw(self) -> None:
        """``docker unpause``; a container that is not paused is left as it is."""
        import docker.errors

        try:
            self.container.unpause()
        except docker.errors.APIError as exc:
            if "not paused" not in str(exc.explanation):
                raise

    def destroy(self) -> None:
        """Remove the container and its workspace volume. Idempotent; other errors surface.

        (``delete(path)`` is the protocol's file operation; this is the sandbox's lifecycle.)"""
        self.close()
        remove_sandbox(self.client, self.container.id)

    # ------------------------------------------------------------------ execute

    def _words(self) -> TransportWords:
        return TransportWords(
            logger,
            subject=self.id[:12],
            fallback="one docker exec per command",
            restart="restarting it",
            command_lost="exec helper died during the command",
            file_op_lost="exec helper died during the file operation",
        )

    # ------------------------------------------------------------------ its transport

    @property
    def memory_limit(self) -> str:
        """`sandboxes._mux.HelperTransport`: the config's."""
        return self.config.memory

    def answer(self, error: Exception) -> p.ExecuteResponse | None:
        """`sandboxes._mux.HelperTransport`: the engine's failures, around the helper's start as
        around the fallback's exec."""
        if isinstance(error, _MayHaveRun):
            return p.ExecuteResponse("", error=p.CONNECTION_LOST, message=str(error))
        if isinstance(error, _engine_errors()):  # before anything was started: a helper's or an exec's creation
            return p.ExecuteResponse("", error=p.UNAVAILABLE, message=f"the docker engine refused: {error}")
        return None

    @property
    def _reap_env(self) -> dict[str, str]:
        return {"SANDBOXES_REAP_INIT": "1"} if self._reap_init else {}

    def python_missing(self) -> bool:
        """`sandboxes._mux.HelperTransport`: whether the image's shell says python3 is not there.
        A question that failed (its exec could not start: a full pids limit) cannot tell, and
        the helper is tried later."""
        try:
            _, answer = self._run_small(HAS_PYTHON_SH, timeout=10)
        except Exception:
            return False
        return python_missing(answer)

    def start_helper(self) -> MuxClient:
        """`sandboxes._mux.HelperTransport`: ``python3`` in a ``docker exec`` of its own."""
        api = self.client.api
        exec_id = api.exec_create(
            self.id,
            ["python3", *PYTHON_FLAGS, "-c", SERVER_SOURCE, *(["--reap-init"] if self._reap_init else [])],
            stdin=True,
            stdout=True,
            stderr=True,
            user=self.config.user,
            workdir=self.config.workdir,
        )["Id"]
        stream = ExecSocket(api.exec_start(exec_id, socket=True))
        try:
            mux = MuxClient(stream, hello_timeout=20)
        except MuxBroken as broken:
            raise MuxBroken(f"{broken}; helper stderr: {bytes(stream.stderr[-500:])!r}") from broken
        self._oom.forget()
        return mux

    def run_alone(self, command: Command, on_output: OutputHook | None) -> p.ExecuteResponse:
        """`sandboxes._mux.HelperTransport`: one ``docker exec`` for ``command`` (`Command.within`
        the sandbox's defaults): the slow path, for images without python3. The engine failing
        the exec's creation raises its own error (nothing ran); failing anything after,
        `_MayHaveRun` (the exec's start may have reached the engine)."""
        api = self.client.api
        env = command.env
        marker = env.get(MARKER_ENV) or uuid.uuid4().hex  # the caller's own, when it gave one
        started = time.monotonic()
        exec_id = api.exec_create(
            self.id,
            ["/bin/sh", "-c", _scripts.command(_scripts.RUN_IN, command.workdir, command.command)],
            stdin=command.stdin is not None,
            environment={**env, **self._reap_env, MARKER_ENV: marker},
            user=self.config.user,
        )["Id"]
        stream: ExecSocket | None = None
        try:
            stream = ExecSocket(api.exec_start(exec_id, socket=True), merge_stderr=True)
            return self._await_exec(exec_id, stream, marker, started, command, on_output)
        except _engine_errors() as failed:  # a paused container refuses the kill and the inspect
            raise _MayHaveRun(f"the docker engine failed during the command: {failed}") from failed
        finally:
            if stream is not None:  # also when the engine failed: the reader thread must end
                stream.close()

    def _await_exec(
        self,
        exec_id: str,
        stream: ExecSocket,
        marker: str,
        started: float,
        command: Command,
        on_output: OutputHook | None,
    ) -> p.ExecuteResponse:
        """`run_alone`'s started exec, to its end or its deadline (then its tree is killed)."""
        api = self.client.api
        stdin, timeout, cwd = command.stdin, command.timeout, command.workdir
        output = OutputBuffer(command.output_limit)
        reader = threading.Thread(target=_pump, args=(stream, output, on_output), daemon=True)
        reader.start()
        if stdin is not None:  # fed beside the wait: a command that leaves it unread still times out
            threading.Thread(target=_feed, args=(stream, stdin), daemon=True).start()
        deadline = started + timeout if timeout else None
        timed_out = False
        while reader.is_alive():
            reader.join(0.05)
            if not reader.is_alive():  # the usual end: no inspect here, the exit code's is enough
                break
            if exec_ended(api.exec_inspect(exec_id)):
                reader.join(0.2)  # a background job may hold the stream open; do not wait for it
                break
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                self._kill_marked(marker)
                reader.join(2.0)
                break
        stream.close()
        code = None if timed_out else _exit_code(api, exec_id)
        if code == _scripts.EXIT_NO_CWD and not self._cwd_exists(cwd):
            return p.ExecuteResponse("", error=p.FILE_NOT_FOUND, message=f"working directory {cwd!r} not found")
        return execute_response(
            output, code, timed_out=timed_out, timeout=timeout, duration_ms=(time.monotonic() - started) * 1000
        )

    def _cwd_exists(self, cwd: str) -> bool:
        return self._run_small(_scripts.command(_scripts.CWD_EXISTS, cwd))[0] == 0

    def _kill_marked(self, marker: str) -> None:
        """The kill of a one-exec command's tree, in an exec of its own, tried again while runc
        fails to start that exec (`_runc_lost`): it does now and then when the command keeps
        every pid of the container taken, and a command past its timeout must not outlive it."""
        script = _scripts.command(_scripts.KILL_MARKED + 'kill_marked "$1"; kill_orphans', marker)
        retrying = Retrying(
            retry=retry_if_exception(_runc_lost),
            stop=stop_after_attempt(_KILL_ATTEMPTS),
            wait=wait_exponential(multiplier=0.02, max=0.5),
            reraise=True,
        )
        try:
            retrying(self._run_kill, script)
        except Exception as failed:
            if not _runc_lost(failed):
                raise
            logger.warning("the kill of a timed-out command in %s never started: %s", self.id[:12], failed)

    def _run_kill(self, script: str) -> None:
        code, output = self._run_small(script)
        if code == _EXIT_EXEC_FAILED and _RUNC_FAILED in output:
            raise _RuncLost(output)

    def _run_small(self, script: str, timeout: float = 30.0) -> tuple[int | None, str]:
        """(exit code, output) of an internal script in its own ``docker exec``, bounded.

        Not ``exec_run``, which buffers all the output: a command can open the script's stdout
        through /proc (same uid) and write gigabytes, or hold it open forever. Here the output
        is capped at `_SMALL_OUTPUT` and nobody waits past ``timeout`` or the script's end."""
        api = self.client.api
        argv = ["/bin/sh", "-c", script]
        exec_id = api.exec_create(self.id, argv, user=self.config.user, environment=self._reap_env)["Id"]
        stream = ExecSocket(api.exec_start(exec_id, socket=True), merge_stderr=True)
        output = OutputBuffer(_SMALL_OUTPUT)
        reader = threading.Thread(target=_pump, args=(stream, output), daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout
        while reader.is_alive() and time.monotonic() < deadline:
            reader.join(0.05)
            if reader.is_alive() and exec_ended(api.exec_inspect(exec_id)):
                reader.join(0.2)
                break
        stream.close()
        return api.exec_inspect(exec_id)["ExitCode"], output.text()

    def oom_killed(self) -> bool:
        """`sandboxes._mux.HelperTransport`: whether the container's memory cgroup killed
        something since we last looked (an engine that fails the look: it cannot tell, and the
        command's answer stands)."""
        try:
            text = self._probe(OOM_COUNT_SH)
        except _engine_errors():
            return False
        return self._oom.killed(text)

    def _probe(self, command: str) -> str:
        """A tiny internal command, bypassing `execute` (whose OOM check would recurse)."""
        probed = self.helper_driver.probe(command)
        return probed if probed is not None else self._run_small(command, timeout=10)[1].strip()

    # ------------------------------------------------------------------ bulk file transfer

    bulk_threshold = BULK_THRESHOLD

    def _bulk_eligible(self, path: str, size: int | None) -> bool:
        """Only the workspace volume, the one place bulk transfers write to; elsewhere big files
        go inline."""
        return super()._bulk_eligible(path, size) and self._in_volume(path)

    def _bulk_put(self, files: list[tuple[str, bytes]]) -> list[p.ErrorCode | None]:
        """Each file written by the sandbox's user into its staged name (`sandboxes._staged`),
        never by the engine's ``put_archive``: that writes as root from outside and follows the
        links the sandbox made, so a directory swapped for a link to ``/etc`` after
        `_prepare_bulk` checked it led it into the read-only root."""
        return [self._stage(staged, data) for staged, data in files]

    def _stage(self, staged: str, data: bytes) -> p.ErrorCode | None:
        try:
            call = write_call(staged, data)
            if self.native_file_ops and (answer := self._run_native(call)) is not None:
                return self._staged_natively(staged, call, answer)
            if len(data) > STAGE_CHUNK_BYTES:
                return self._stage_in_own_exec(staged, data)
            return stage_file(self, staged, io.BytesIO(data), len(data))  # BytesIO shares, not copies, data
        except _parse.ScriptFailed as exc:
            logger.warning("bulk upload into %s failed: %s", self.id[:12], exc.message)
            return exc.code
        except _MayHaveRun:
            return p.CONNECTION_LOST
        except _engine_errors():
            return p.UNAVAILABLE

    def _staged_natively(self, staged: str, call: Call, answer: p.ExecuteResponse) -> p.ErrorCode | None:
        """The exec helper writes the staged file itself, as it writes any file (`sandboxes._mux.
        _files`): as the sandbox's user, no process started, each frame's bytes straight into
        the file, so its memory stays one frame whatever the size, and no process is started.
        This is its answer's file-level error, ``None`` once the staged file is whole. A write
        cut off (the helper died, or stopped taking the bytes: `sandboxes._mux._stall`) leaves
        the helper's own temporary file beside the staged name, which the commit does not
        know: it goes here."""
        try:
            return _parse.check(answer, staged)
        except _parse.ScriptFailed:
            assert call.native is not None
            remove_staged(self, f"{posixpath.dirname(staged)}/.sandboxes-write.{call.native[3]}")
            raise

    def _stage_in_own_exec(self, staged: str, data: bytes) -> p.ErrorCode | None:
        """A file of more than one chunk streamed whole into the staging script's stdin, in a
        ``docker exec`` of its own (no native write: no helper, or native ops off): the same
        script, run by the same user, as the chunks through `execute`, so the kernel checks
        every byte alike; its own exec, because the engine's pipe carries stdin faster than the
        helper relays it in frames. A transfer cut short leaves a short staged file, which the
        commit's size check refuses."""
        command = _scripts.command(_scripts.STAGE_CHUNK, staged, "new")
        try:
            answer = self.run_alone(Command(command, _STAGE_TIMEOUT, 65536, data, cwd="/"), None)
            code = _parse.check(answer, staged)
        except BaseException:
            remove_staged(self, staged)
            raise
        if code is not None:
            remove_staged(self, staged)
        return code

    def _bulk_get(self, path: str, max_bytes: int) -> bytes | p.ErrorCode:
        """``cat`` run by the sandbox's user in its own ``docker exec``, streamed raw (no
        base64, unlike the inline path), never the engine's ``get_archive``, which reads as
        root and followed a directory the sandbox swapped for a link to ``/etc`` after the
        size check, handing out ``/etc/shadow``. What the user may not read answers
        ``permission_denied``, as the inline path does."""
        argv = ["/bin/sh", "-c", _scripts.command(_READ_AS_USER, path, str(max_bytes))]
        try:
            code, content = read_exec_stdout(
                self.client.api, self.id, argv, user=self.config.user, timeout=_STAGE_TIMEOUT, max_bytes=max_bytes
            )
        except _engine_errors():  # a read: nothing to lose by saying it was not done
            return p.UNAVAILABLE
        if code == 0:
            return content
        if code == TOO_MUCH:
            return p.FILE_TOO_LARGE
        return _parse.code_for_status(code or -1) or p.BACKEND_ERROR

    def open_output_stream(self, command: str) -> ExecOutput:
        """``command`` (``sh``) run by the sandbox's user in a ``docker exec`` of its own, its
        stdout streamed raw: for output too big for `execute`'s text answer (the service's
        archives). The caller reads it to the end, then asks `ExecOutput.exit_code`."""
        api = self.client.api
        exec_id = api.exec_create(self.id, ["/bin/sh", "-c", command], user=self.config.user, stdout=True, stderr=True)
        return ExecOutput(api, exec_id["Id"], ExecSocket(api.exec_start(exec_id["Id"], socket=True)))

    def _in_volume(self, path: str) -> bool:
        try:
            return is_within(normalize_path(path), normalize_path(self.config.workdir))
        except InvalidPathError:
            return False


def _exit_code(api: Any, exec_id: str) -> int:
    """The ended exec's exit code, once the engine has recorded it (its output may end first).
    One the engine never records in `EXIT_CODE_WAIT` seconds: `_MayHaveRun`."""
    code = polled_exit_code(api, exec_id, interval=0.05, within=EXIT_CODE_WAIT, ended=exit_recorded)
    if code is None:
        raise _MayHaveRun(f"the docker engine recorded no exit code for the command in {EXIT_CODE_WAIT:g} s")
    return code


def _feed(stream: ExecSocket, stdin: bytes) -> None:
    """A command's stdin, then its end. Sent from a thread of its own: once the pipe and the
    engine's buffers are full, a command that does not read blocks the send, and a send on the
    waiting thread would keep its timeout from ever being checked. The kill at the deadline,
    or `ExecSocket.close`, ends it."""
    with contextlib.suppress(OSError):  # the command ended without reading it all, as a pipe allows
        stream.send(stdin)
    stream.shutdown_write()


def _pump(stream: ExecSocket, output: OutputBuffer, on_output: Callable[[bytes], None] | None = None) -> None:
    with contextlib.suppress(OSError):
        while chunk := stream.recv(65536):
            output.write(chunk)
            if on_output is not None:
                on_output(chunk)
