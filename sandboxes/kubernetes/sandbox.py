"""`KubernetesSandbox`: a sandbox in a pod, driven through the pod exec subresource.

How commands reach the pod: one long-lived exec helper (`sandboxes._mux`) per sandbox, over a
single exec websocket, answers each command with a fork instead of a fresh exec. The helper's
source is too big for an exec URL's ``command`` parameters (some proxies cap a request line at
8 KiB), so a one-line bootstrap reads exactly its length from stdin, then the same stdin carries
the helper's frames. If the stream drops, the next command opens a new one; a command written to
the old one answers ``connection_lost`` (acknowledged or not, it may have run, so it is never
run twice), one that could not be written is sent to the new helper
(`sandboxes._mux.MuxBroken.may_resend`). If the image has no python3, each command gets its own
exec with the same timeout semantics: its process tree is found by an environment marker and
killed, and its exit status comes from the exec's error channel.

Creating, pooling and sweeping pods is `sandboxes.kubernetes.provider`'s business; the pod
manifest and the waits are `sandboxes.kubernetes._pods`'.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from sandboxes import _scripts
from sandboxes import protocol as p
from sandboxes._helper._kill import KILL_MARKED_SH
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
from sandboxes.kubernetes._exec import (
    MAX_ARCHIVE_MEMBERS,
    ExecError,
    ExecStream,
    exec_api,
    open_exec,
    status_message,
    tar_pieces,
)
from sandboxes.kubernetes._pods import core_api, create_pod, delete_pod, load_api_client
from sandboxes.kubernetes.config import KubernetesSandboxConfig
from sandboxes.lifecycle import CreateOptions, Sandbox

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, CoreV1Api

logger = logging.getLogger(__name__)

_SOURCE = SERVER_SOURCE.encode("utf-8")
BOOTSTRAP = (
    "import os\n"
    f"n={len(_SOURCE)}\n"
    "b=b''\n"
    "while len(b)<n:\n"
    " c=os.read(0,n-len(b))\n"
    " if not c:raise SystemExit(3)\n"
    " b+=c\n"
    "exec(compile(b,'sandboxes-exec-helper','exec'))\n"
)
"""Reads the helper's source from stdin with ``os.read`` (never more than asked for: what
follows is the helper's first frame, which it reads from fd 0 itself), then runs it."""

BULK_THRESHOLD = 1 << 20
"""Files above this size move as tar (upload) or ``cat`` (download) over an exec stream of
their own rather than inline through ``execute`` (base64 in a command's stdin or output)."""

_SMALL_OUTPUT = 4096
_EXTRACT = 'head -c "$1" | tar -x -f - -C / 2>&1'
_CAT = '[ -d "$1" ] && exit 21; exec cat -- "$1"'
_URL_BUDGET = 6000
"""Bytes of URL-quoted script sent as an exec's ``command`` parameter; a longer one goes over stdin."""

_RUN = (
    KILL_MARKED_SH  # kill_marked alone: the sweep of strays is an exec of its own (`_SWEEP`)
    + r"""cwd=$1; marker=$2; size=$3; cmd=$4; shift 4
f() { { read -r l <"$1/stat"; } 2>/dev/null && set -- ${l##*') '} && p=$2 t=${20} && [ "$1" != Z ]; }
since=
f /proc/$$ && since=$t && printf 'since=%s\n' "$t" >&2
for pair do export "$pair"; done
export SANDBOXES_EXEC_ID="$marker"
cd -- "$cwd" 2>/dev/null || exit 200
if [ "$size" = - ]; then
  /bin/sh -c "$cmd" </dev/null 2>&1
else
  head -c "$size" | /bin/sh -c "$cmd" 2>&1
fi
s=$?
unset SANDBOXES_EXEC_ID
kill_marked "$marker"
c=clean
for d in /proc/[0-9]*; do [ -O "$d" ] && f "$d" && [ "$p" = 1 ] && [ "$t" -ge "${since:-0}" ] && c=; done
[ -z "$c" ] || printf '%s\n' "$c" >&2
exit "$s"
"""
)
"""One command in its own exec, without the helper: cwd, marker, stdin size and command, then
the environment as ``NAME=value`` pairs, all quoted positional parameters. The exec API has no
way to pass an environment, and ``v4`` none to end stdin, so the command's stdin is exactly
``size`` bytes of the exec's through ``head -c`` (``-``: none). stderr joins stdout at the source
so their order is kept. Whatever the command left running with its marker dies when it ends.
On the exec's own stderr: first ``since=TICKS``, this shell's start time, and last ``clean``
when no process of the pod's user that the pod's init adopted started since (what left the
command's tree, its marker dropped or not); without it `_SWEEP` kills those, as SSH's end of a
command does."""

_SWEEP = _scripts.KILL_MARKED + '[ -z "$1" ] || kill_marked "$1"; [ -z "$2" ] || kill_strays 1 "$2"'
"""Kill a command's marked processes (``$1``, unless empty), then ``kill_strays 1 SINCE`` (``$2``,
`sandboxes._scripts.KILL_MARKED`): what the pod's init adopted since the command started, by
owner, parent and start time (a running command's or live job's spared), which an ``env -i`` or
``setsid`` cannot change."""

_FED = 'eval "$(head -c "$0")"'
"""Run the script of ``$0`` bytes read from stdin: one too long for an exec URL, in one exec."""


class KubernetesSandbox(DrivenSandbox, Sandbox):
    """One pod. Thread-safe: many commands and file operations may run at once. Its commands and
    file ops go through the exec helper it holds (`helper_driver`), to which it is the
    `sandboxes._mux.HelperTransport`."""

    config: KubernetesSandboxConfig

    def __init__(self, name: str, api: CoreV1Api, config: KubernetesSandboxConfig, *, owned: bool = True) -> None:
        self.name = name
        self.api = api
        self.config = config
        self.owned = owned
        self._exec_api = exec_api(api)
        self._oom = OomCount()
        self.helper_driver = HelperDriver(
            self, self._words(), config, enabled=config.use_exec_helper, start_failures=(MuxBroken, ExecError)
        )

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def create(
        cls,
        config: KubernetesSandboxConfig | None = None,
        options: CreateOptions | None = None,
        *,
        api_client: ApiClient | None = None,
    ) -> KubernetesSandbox:
        """A new pod, Running and Ready (`sandboxes.kubernetes._pods.PodStartError` says why
        not); owned by the caller, so ``with`` deletes it."""
        config = config or KubernetesSandboxConfig()
        options = options or CreateOptions()
        api = core_api(api_client or load_api_client(config))
        pod: Any = create_pod(api, config, labels=options.labels, env=options.env, ttl=options.ttl)
        sandbox = cls(pod.metadata.name, api, config.model_copy(update={"env": {**config.env, **options.env}}))
        return sandbox

    @classmethod
    def attach(
        cls, name: str, *, config: KubernetesSandboxConfig | None = None, api_client: ApiClient | None = None
    ) -> KubernetesSandbox:
        """Drive an existing pod by name; ``with`` only closes it. `LookupError` if none."""
        from kubernetes.client.exceptions import ApiException

        config = config or KubernetesSandboxConfig()
        api = core_api(api_client or load_api_client(config))
        try:
            api.read_namespaced_pod(name, config.namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise LookupError(f"no pod {name!r} in namespace {config.namespace!r}") from exc
            raise
        return cls(name, api, config, owned=False)

    @property
    def id(self) -> str:
        return self.name

    @property
    def ref(self) -> str:
        return self.name

    @property
    def workdir(self) -> str:
        return self.config.workdir

    def destroy(self) -> None:
        """Delete the pod and wait until it is gone. Idempotent; `TimeoutError` says what holds it."""
        self.close()
        delete_pod(self.api, self.config.namespace, self.name, grace_seconds=self.config.termination_grace_seconds)

    # ------------------------------------------------------------------ execute

    def _words(self) -> TransportWords:
        return TransportWords(
            logger,
            subject=f"pod {self.name}",
            fallback="one exec per command",
            restart="reopening it",
            command_lost="the exec stream dropped during the command",
            file_op_lost="the exec stream dropped during the file operation",
        )

    # ------------------------------------------------------------------ its transport

    @property
    def memory_limit(self) -> str:
        """`sandboxes._mux.HelperTransport`: the config's."""
        return self.config.memory_limit or "none"

    def answer(self, error: Exception) -> p.ExecuteResponse | None:
        """`sandboxes._mux.HelperTransport`: an exec that could not be opened answers ``unavailable``."""
        if isinstance(error, ExecError):
            return p.ExecuteResponse("", error=p.UNAVAILABLE, message=str(error))
        return None

    def start_helper(self) -> MuxClient:
        """`sandboxes._mux.HelperTransport`: the bootstrap in an exec of its own, then the source
        on its stdin."""
        stream = open_exec(
            self._exec_api, self.config.namespace, self.name, ["python3", *PYTHON_FLAGS, "-c", BOOTSTRAP]
        )
        try:
            stream.send(_SOURCE)
            return MuxClient(stream, hello_timeout=20)
        except (MuxBroken, OSError) as broken:
            stream.close()
            detail = status_message(bytes(stream.status)) if stream.status else bytes(stream.stderr[-500:])
            raise MuxBroken(f"{broken}; helper said: {detail!r}") from broken

    def python_missing(self) -> bool:
        """`sandboxes._mux.HelperTransport`: whether the image's shell says python3 is not there;
        a question that failed cannot tell."""
        try:
            return python_missing(self._run_small(HAS_PYTHON_SH)[1])
        except ExecError:
            return False

    def run_alone(self, command: Command, on_output: OutputHook | None) -> p.ExecuteResponse:
        """`sandboxes._mux.HelperTransport`: one exec for ``command`` (`Command.within` the
        sandbox's defaults): the slow path, for images without python3."""
        stdin, timeout, cwd = command.stdin, command.timeout, command.workdir
        marker = uuid.uuid4().hex
        started = time.monotonic()
        pairs = [f"{name}={value}" for name, value in command.env.items()]
        size = "-" if stdin is None else str(len(stdin))
        script = _scripts.command(_RUN, cwd, marker, size, command.command, *pairs)
        argv = self._argv_for(script, marker)
        if isinstance(argv, p.ExecuteResponse):
            return argv
        stream = open_exec(self._exec_api, self.config.namespace, self.name, argv, stdin=stdin is not None)
        output = OutputBuffer(command.output_limit)
        reader = threading.Thread(target=_pump, args=(stream, output, on_output), name="k8s-exec", daemon=True)
        reader.start()
        if stdin is not None:
            # From its own thread: a command that prints before reading its input must not
            # block us while we block sending to it.
            threading.Thread(target=_feed, args=(stream, stdin), name="k8s-stdin", daemon=True).start()
        reader.join(timeout or None)
        timed_out = reader.is_alive()
        if timed_out:
            self._kill_marked(marker, _since(stream))
            reader.join(5.0)
        stream.close()
        reader.join(1.0)
        if stream.exit_code() is not None and not bytes(stream.stderr).endswith(b"\nclean\n"):
            self._kill_marked("", _since(stream))  # what the command left outside its tree
        duration = (time.monotonic() - started) * 1000
        code = stream.exit_code()
        if timed_out:
            return execute_response(output, None, timed_out=True, timeout=timeout, duration_ms=duration)
        if code is None:
            why = status_message(bytes(stream.status)) if stream.status else "no exit status"
            return _lost(f"the exec stream ended without the command's exit status ({why})")
        if code == _scripts.EXIT_NO_CWD and not self._cwd_exists(cwd):
            return p.ExecuteResponse("", error=p.FILE_NOT_FOUND, message=f"working directory {cwd!r} not found")
        return execute_response(output, code, timed_out=False, timeout=timeout, duration_ms=duration)

    def _argv_for(self, script: str, marker: str) -> list[str] | p.ExecuteResponse:
        """``sh -c script`` when it fits an exec URL; else the script is first written to a file
        in ``/tmp`` by an exec of its own (stdin has room, a URL does not: proxies in front of
        API servers commonly refuse request lines over 8 KiB) and run from there, deleting
        itself as it starts."""
        if len(quote(script)) <= _URL_BUDGET:
            return ["/bin/sh", "-c", script]
        path = f"/tmp/.sandboxes-run-{marker}"
        body = f"rm -f -- {path}\n{script}".encode()
        write = _scripts.command('umask 077; head -c "$1" > "$2"', str(len(body)), path)
        stream = open_exec(self._exec_api, self.config.namespace, self.name, ["/bin/sh", "-c", write])
        try:
            stream.send(body)
            stream.close_stdin()
            while stream.recv(65536):
                pass
        except OSError:
            pass
        finally:
            stream.close()
        if stream.exit_code() != 0:
            why = bytes(stream.stderr[-500:]).decode("utf-8", "replace") or status_message(bytes(stream.status))
            return p.ExecuteResponse("", error=p.BACKEND_ERROR, message=f"could not stage the command in /tmp: {why}")
        return ["/bin/sh", path]

    def _cwd_exists(self, cwd: str) -> bool:
        return self._run_small(_scripts.command(_scripts.CWD_EXISTS, cwd))[0] == 0

    def _kill_marked(self, marker: str, since: str | None) -> None:
        """Kill a command's marked processes (none for an empty ``marker``) and, once its start
        time is known, what its pod's init adopted since (`_SWEEP`)."""
        if marker or since:
            with contextlib.suppress(ExecError):
                self._run_small(_scripts.command(_SWEEP, marker, since or ""), fed=True)

    def _run_small(self, script: str, timeout: float = 30.0, *, fed: bool = False) -> tuple[int | None, str]:
        """(exit code, output) of an internal script in its own exec, bounded in output and time;
        ``fed``: the script travels on stdin (`_FED`), not in the exec's URL."""
        body = script.encode()
        argv = ["/bin/sh", "-c", _FED, str(len(body))] if fed else ["/bin/sh", "-c", script]
        stream = open_exec(self._exec_api, self.config.namespace, self.name, argv, stdin=fed)
        if fed:
            _feed(stream, body)
        output = OutputBuffer(_SMALL_OUTPUT)
        reader = threading.Thread(target=_pump, args=(stream, output), daemon=True)
        reader.start()
        reader.join(timeout)
        stream.close()
        reader.join(1.0)
        return stream.exit_code(), output.text()

    def oom_killed(self) -> bool:
        """`sandboxes._mux.HelperTransport`: whether the container's memory cgroup killed
        something since we last looked."""
        text = self._probe(OOM_COUNT_SH)
        return self._oom.killed(text)

    def _probe(self, command: str) -> str:
        """A tiny internal command, bypassing `execute` (whose OOM check would recurse)."""
        probed = self.helper_driver.probe(command)
        if probed is not None:
            return probed
        with contextlib.suppress(ExecError):
            return self._run_small(command, timeout=10)[1].strip()
        return ""

    # ------------------------------------------------------------------ bulk file transfer

    bulk_threshold = BULK_THRESHOLD

    def _bulk_put(self, files: list[tuple[str, bytes]]) -> list[p.ErrorCode | None]:
        """Big files as tar archives of at most `MAX_ARCHIVE_MEMBERS` members each, streamed
        to ``tar -x`` in the pod (`BaseSandbox` has already checked every destination and named
        each file a fresh staging path beside it, renamed into place once all arrived)."""
        outcomes: list[p.ErrorCode | None] = []
        for start in range(0, len(files), MAX_ARCHIVE_MEMBERS):
            outcomes += self._put_archive(files[start : start + MAX_ARCHIVE_MEMBERS])
        return outcomes

    def _put_archive(self, files: list[tuple[str, bytes]]) -> list[p.ErrorCode | None]:
        pieces, size = tar_pieces(files)
        script = _scripts.command(_EXTRACT, str(size))
        try:
            stream = open_exec(self._exec_api, self.config.namespace, self.name, ["/bin/sh", "-c", script])
        except ExecError:
            return [p.UNAVAILABLE] * len(files)
        output = OutputBuffer(_SMALL_OUTPUT)
        reader = threading.Thread(target=_pump, args=(stream, output), name="k8s-tar", daemon=True)
        reader.start()
        try:
            for piece in pieces:
                stream.send(piece)
            stream.close_stdin()
        except OSError:
            pass  # the exec ended early; its status says why
        reader.join(self.operation_timeout)
        stream.close()
        reader.join(1.0)
        code = stream.exit_code()
        if code == 0:
            return [None] * len(files)
        logger.warning("tar into pod %s failed (%s): %s", self.name, code, output.text()[-500:])
        self.execute(_scripts.command('rm -f -- "$@"', *(path for path, _ in files)), timeout=30)
        if code is None:
            return [p.CONNECTION_LOST] * len(files)
        said = output.text().lower()
        full = "no space left" in said or "wrote only" in said  # GNU tar's words for a short write
        error: p.ErrorCode = p.NO_SPACE if full else p.PERMISSION_DENIED
        return [error] * len(files)

    def _bulk_get(self, path: str, max_bytes: int) -> bytes | p.ErrorCode:
        """The file's bytes, streamed by ``cat`` over an exec of its own, counted as they come:
        past ``max_bytes``, ``file_too_large`` and the stream dropped."""
        try:
            stream = open_exec(
                self._exec_api,
                self.config.namespace,
                self.name,
                ["/bin/sh", "-c", _scripts.command(_CAT, path)],
                stdin=False,
            )
        except ExecError:
            return p.UNAVAILABLE
        chunks = bytearray()
        try:
            while chunk := stream.recv(1 << 20):
                chunks += chunk
                if len(chunks) > max_bytes:
                    return p.FILE_TOO_LARGE
        finally:
            stream.close()
        code = stream.exit_code()
        if code == 0:
            return bytes(chunks)
        if code == 21:
            return p.IS_DIRECTORY
        if code is None:
            return p.CONNECTION_LOST
        return (
            p.FILE_NOT_FOUND if self._run_small(_scripts.command('[ -e "$1" ]', path))[0] != 0 else p.PERMISSION_DENIED
        )

    def open_output_stream(self, command: str) -> ExecStream:
        """``command`` (``sh``) run in an exec of its own, its stdout streamed raw: for output
        too big for `execute`'s text answer (the service's archives). `ExecError` if refused."""
        argv = ["/bin/sh", "-c", command]
        return open_exec(self._exec_api, self.config.namespace, self.name, argv, stdin=False)


def _lost(message: str) -> p.ExecuteResponse:
    return p.ExecuteResponse("", error=p.CONNECTION_LOST, message=message)


def _pump(stream: ExecStream, output: OutputBuffer, on_output: Callable[[bytes], None] | None = None) -> None:
    while chunk := stream.recv(65536):
        output.write(chunk)
        if on_output is not None:
            on_output(chunk)


def _since(stream: ExecStream) -> str | None:
    """The start time `_RUN`'s shell wrote first on the exec's stderr (before the command ran),
    or None."""
    first = bytes(stream.stderr[:64]).partition(b"\n")[0]
    value = first.removeprefix(b"since=")
    return value.decode() if first.startswith(b"since=") and value.isdigit() else None


def _feed(stream: ExecStream, data: bytes) -> None:
    with contextlib.suppress(OSError):
        stream.send(data)
        stream.close_stdin()
