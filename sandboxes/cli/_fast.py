"""The light path of the remote subcommands that a person types most (exec, ls, read, write,
grep, glob against a sandbox; the list of sandboxes; process): the same requests as the client's
`RemoteSandbox`, with its timeouts, headers and retry policy, over `sandboxes.cli._plain` for a
plain ``http://`` service without a proxy, else over httpx as the client makes it; their answers
read by `sandboxes.cli._decode` into the protocol's dataclasses.

It imports neither pydantic, tenacity nor the API's models: those are imported only where a
request or an answer is not plainly valid (`Unsure`), to judge it as the client does, or on an
error's path. Every other subcommand takes the client (`sandboxes.cli.remote`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from sandboxes import protocol as p
from sandboxes.cli import _decode as d
from sandboxes.cli import _plain
from sandboxes.cli._common import Failed, Session, Usage, out
from sandboxes.client._light import (
    DEFAULT_READ,
    KEEPALIVE_EXPIRY,
    PatienceMethods,
    ProcessStatus,
    capped_grep,
    execute_timeout,
    polled_until_ended,
    recovered,
    retry_delay,
    retry_now,
    sent,
)
from sandboxes.client.errors import ConnectionLost, SandboxServiceError, error_from_response, error_from_transport

if TYPE_CHECKING:
    import httpx

    Response = httpx.Response | _plain.PlainResponse

__all__ = [
    "KEY_ENV",
    "URL_ENV",
    "Connection",
    "LightClient",
    "LightConfig",
    "LightSandbox",
    "cmd_list",
    "connect",
    "list_lines",
    "open_sandbox",
    "service_url",
    "when",
]

T = TypeVar("T")
URL_ENV = "SANDBOXES_URL"
KEY_ENV = "SANDBOXES_API_KEY"
_SANDBOXES = "/v1/sandboxes"


def service_url(args: argparse.Namespace) -> str:
    url: str | None = args.url or os.environ.get(URL_ENV)
    if not url:
        raise Usage(f"{args.subcommand}: needs the service's address: --url URL or {URL_ENV}")
    return url


@dataclass(frozen=True, slots=True)
class LightConfig(PatienceMethods):
    """`sandboxes.client.ClientConfig` as the CLI makes it (its defaults, one retry)."""

    url: str
    api_key: str | None = None
    timeout: float = 300.0
    connect_timeout: float = 10.0
    retries: int = 1
    backoff: float = 0.25
    max_backoff: float = 8.0
    max_retry_after: float = 60.0
    execute_grace: float = 30.0


@dataclass(frozen=True, slots=True)
class Call:
    """One request, as `sandboxes.client._wire.Op` states it (the same retry class)."""

    method: str
    path: str
    json: Any = None
    params: Mapping[str, str] | None = None
    idempotent: bool = False
    read_timeout: Any = DEFAULT_READ
    retry: bool = True
    recover: Callable[[p.ErrorCode, str], Any] | None = None

    @property
    def what(self) -> str:
        return f"{self.method} {self.path}"


class Connection:
    """The client's `ServiceConnection` for these calls: one attempt, then as many more as
    `retry_now` allows, up to ``retries``; over `sandboxes.cli._plain` where it serves the URL."""

    def __init__(self, config: LightConfig) -> None:
        self.config = config
        self._plain: _plain.PlainConnection | None = None
        if _plain.usable(config.url):
            self._plain = _plain.PlainConnection(config.base_url(), config.headers(), config.connect_timeout)
        self._httpx: httpx.Client | None = None
        self._used = 0.0

    def close(self) -> None:
        if self._plain is not None:
            self._plain.close()
        if self._httpx is not None:
            self._httpx.close()

    def call(self, call: Call, decode: Callable[[bytes], T]) -> T:
        try:
            response = self.open(call, stream=False)
        except SandboxServiceError as exc:
            result: T = recovered(call, exc)
            return result
        return decode(response.content)

    def open(self, call: Call, *, stream: bool = True) -> Response:
        attempt = 1
        while True:
            try:
                return self._send(call, stream)
            except SandboxServiceError as exc:
                if attempt > self.config.retries or not retry_now(self.config, call, exc):
                    raise
                time.sleep(retry_delay(self.config, attempt, exc))
                attempt += 1

    def _send(self, call: Call, stream: bool) -> Response:
        if self._plain is not None:
            if time.monotonic() - self._used > KEEPALIVE_EXPIRY:
                self._plain.close()  # as the client's pool: never reuse one the server may close
            read = self.config.timeout if call.read_timeout is DEFAULT_READ else call.read_timeout
            try:
                response = self._plain.send(call.method, call.path, call.json, call.params, read)
            except _plain.NotConnected:
                self._plain = None  # nothing was sent: httpx sends it, and says why it cannot
            else:
                self._used = time.monotonic()
                if response.is_success:
                    return response
                with contextlib.closing(response):
                    raise error_from_response(response.as_httpx())
        return self._send_httpx(call, stream)

    def _send_httpx(self, call: Call, stream: bool) -> httpx.Response:
        import httpx

        if self._httpx is None:
            self._httpx = httpx.Client(**self.config.pool_settings())
        request = self._httpx.build_request(
            call.method, call.path, json=call.json, params=call.params,
            timeout=self.config.httpx_timeout(call.read_timeout),
        )  # fmt: skip
        return sent(self._httpx, request, stream=stream, what=call.what)


def _transport_error(exc: BaseException) -> bool:
    """Whether ``exc`` is httpx's failure of a connection (httpx is imported if it was used)."""
    httpx = sys.modules.get("httpx")
    return httpx is not None and isinstance(exc, httpx.TransportError)


@contextlib.contextmanager
def connect(args: argparse.Namespace) -> Iterator[Connection]:
    """`sandboxes.cli.remote.connect`'s light twin: a service error ends as `Failed`, alike."""
    config = LightConfig(service_url(args), args.api_key or os.environ.get(KEY_ENV) or None)
    connection = Connection(config)
    try:
        yield connection
    except SandboxServiceError as exc:
        raise Failed(exc.code, str(exc).removeprefix(f"{exc.code}: ")) from exc
    finally:
        connection.close()


def _sandbox(sandbox_id: str) -> str:
    return f"{_SANDBOXES}/{quote(sandbox_id, safe='')}"


# ---------------------------------------------------------------------- answers


def _answer(kind: type[Any], full: Callable[[], Callable[[bytes], Any]]) -> Callable[[bytes], Any]:
    """Read an answer as ``kind``; one that is not plainly valid by ``full()``, the client's."""

    def decode(raw: bytes) -> Any:
        try:
            return d.strictly(kind, raw)
        except d.Unsure:
            return full()(raw)

    return decode


def _full(name: str) -> Callable[[], Callable[[bytes], Any]]:
    def load() -> Callable[[bytes], Any]:
        from sandboxes.client import _wire

        decoder: Callable[[bytes], Any] = getattr(_wire, name).decode
        return decoder

    return load


def _full_execute() -> Callable[[bytes], Any]:
    from sandboxes.client import _wire

    return lambda raw: _wire.execute_response(_wire._EXECUTE.decode(raw))


def _full_info() -> Callable[[bytes], Any]:
    from sandboxes.client import _wire

    return lambda raw: d.SandboxInfo(**_wire.sandbox_info.decode(raw).model_dump())


def _full_process() -> Callable[[bytes], Any]:
    from sandboxes.client import _wire

    def decode(raw: bytes) -> Any:
        info = _wire._PROCESS.decode(raw)
        result = None if info.result is None else _wire.execute_response(info.result)
        return d.ProcessInfo(info.id, info.status, info.output, result, info.stdout, info.stderr)

    return decode


_EXECUTE = _answer(p.ExecuteResponse, _full_execute)
_INFO = _answer(d.SandboxInfo, _full_info)
_PROCESS = _answer(d.ProcessInfo, _full_process)


def _status(info: d.ProcessInfo) -> ProcessStatus:
    return ProcessStatus(info.id, info.status, info.output, info.result, info.stdout, info.stderr)


def _as_result(kind: Any) -> Callable[[p.ErrorCode, str], Any]:
    return lambda code, message: kind(error=code, message=message)


# ---------------------------------------------------------------------- a sandbox


class LightSandbox:
    """The methods of `sandboxes.client.RemoteSandbox` the protocol subcommands call, sending
    the same requests and answering the same dataclasses."""

    def __init__(self, connection: Connection, sandbox_id: str) -> None:
        self._connection = connection
        self._id = sandbox_id
        self._path = _sandbox(sandbox_id)

    @property
    def id(self) -> str:
        return self._id

    def workdir(self) -> str:
        """Where relative paths start: the service's ``workdir`` of it, ``/`` if none. Asking
        also tells a wrong id or key here, before anything runs."""
        info: d.SandboxInfo = self._connection.call(Call("GET", self._path, idempotent=True), _INFO)
        return info.workdir or "/"

    def _body(self, command: str, timeout: float | None, stdin: bytes | None, env: Any, cwd: str | None) -> Any:
        try:
            return d.execute_body(command, timeout=timeout, stdin=stdin, env=env, cwd=cwd)
        except d.Unsure:
            from sandboxes.client import _ops  # judged by the model, which says what is wrong

            return _ops.execute_body(command, timeout=timeout, stdin=stdin, env=env, cwd=cwd, output_limit=None)

    def execute(
        self, command: str, *, timeout: float | None, stdin: bytes | None, env: Any, cwd: str | None
    ) -> p.ExecuteResponse:
        body = self._body(command, timeout, stdin, env, cwd)
        read = execute_timeout(self._connection.config, body.get("timeout"))
        call = Call("POST", f"{self._path}/execute", body, read_timeout=read, recover=_failed_execution)
        result: p.ExecuteResponse = self._connection.call(call, _EXECUTE)
        return result

    def execute_stream(
        self, command: str, *, timeout: float | None, stdin: bytes | None, env: Any, cwd: str | None
    ) -> CommandStream:
        body = self._body(command, timeout, stdin, env, cwd)
        read = execute_timeout(self._connection.config, body.get("timeout"))
        return CommandStream(
            self._connection, self._id, Call("POST", f"{self._path}/execute/stream", body, read_timeout=read)
        )

    def _file(self, op: str, kind: Any, *values: Any, idempotent: bool = True) -> Any:
        try:
            body = d.file_body(op, *values)
        except d.Unsure:  # judged by the model, which says what is wrong, as the client does
            from sandboxes import api
            from sandboxes.client import _wire

            model = getattr(api, f"{op.capitalize()}Request")
            body = _wire.model_json(model, **dict(zip(d.REQUEST_FIELDS[op], values, strict=True)))
        call = Call("POST", f"{self._path}/files/{op}", body, idempotent=idempotent, recover=_as_result(kind))
        full = "_GREP" if op == "grep" else f"{op}_result"
        return self._connection.call(call, _answer(kind, _full(full)))

    def ls(self, path: str) -> p.LsResult:
        result: p.LsResult = self._file("ls", p.LsResult, path)
        return result

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> p.ReadResult:
        result: p.ReadResult = self._file("read", p.ReadResult, file_path, offset, limit)
        return result

    def write(self, file_path: str, content: str) -> p.WriteResult:
        result: p.WriteResult = self._file("write", p.WriteResult, file_path, content, idempotent=False)
        return result

    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> p.GrepResult:
        return capped_grep(self._file("grep", p.GrepResult, pattern, path, glob, max_count))

    def glob(self, pattern: str, path: str | None = None) -> p.GlobResult:
        result: p.GlobResult = self._file("glob", p.GlobResult, pattern, path)
        return result

    # ------------------------------------------------------------------ background processes

    def start_process(self, command: str, *, timeout: float | None = None) -> ProcessStatus:
        body = self._body(command, timeout, None, None, None)
        return _status(self._connection.call(Call("POST", f"{self._path}/processes", body), _PROCESS))

    def poll_process(self, process_id: str) -> ProcessStatus:
        call = Call("GET", f"{self._path}/processes/{quote(process_id, safe='')}", idempotent=True)
        return _status(self._connection.call(call, _PROCESS))

    def kill_process(self, process_id: str) -> ProcessStatus:
        call = Call("DELETE", f"{self._path}/processes/{quote(process_id, safe='')}", idempotent=True)
        return _status(self._connection.call(call, _PROCESS))

    def wait_process(self, process_id: str, *, timeout: float | None = None, interval: float = 0.1) -> ProcessStatus:
        """Poll until the process has ended, or until ``timeout`` seconds (then the last status)."""
        return polled_until_ended(lambda: self.poll_process(process_id), timeout, interval)


class LightClient:
    """What ``sandboxes process`` asks of a `SandboxClient`: a handle on a sandbox."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def attach(self, sandbox_id: str) -> LightSandbox:
        return LightSandbox(self._connection, sandbox_id)


def _failed_execution(code: p.ErrorCode, message: str) -> p.ExecuteResponse:
    return p.ExecuteResponse("", error=code, message=message)


@contextlib.contextmanager
def open_sandbox(args: argparse.Namespace, sandbox_id: str) -> Iterator[Session]:
    """`sandboxes.cli.remote.open_sandbox`'s light twin."""
    with connect(args) as connection:
        sandbox = LightSandbox(connection, sandbox_id)
        yield Session(sandbox, sandbox.workdir(), remote=True)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- a streamed command


class CommandStream(Iterator[Any]):
    """`sandboxes.client.CommandStream` for the CLI: output chunks (`OutputChunk`-like str
    with a ``stream``), then exactly one `ExecuteResponse`; a dropped stream is followed again
    once from the last offset seen, else it ends ``connection_lost``."""

    def __init__(self, connection: Connection, sandbox_id: str, call: Call) -> None:
        self._connection = connection
        self._path = _sandbox(sandbox_id)
        self.command_id: str | None = None
        self.offset = 0
        self._reattach = True
        self._lost: str | None = None
        self._items = self._run(call)

    def __next__(self) -> Any:
        return next(self._items)

    def kill(self) -> p.ExecuteResponse | None:
        """Stop reading and kill the command's whole process tree; its final response, or
        ``None`` if it never started."""
        self._items.close()
        if self.command_id is None:
            return None
        call = Call("DELETE", f"{self._path}/execute/{quote(self.command_id, safe='')}", idempotent=True)
        result: p.ExecuteResponse = self._connection.call(call, _EXECUTE)
        return result

    def _run(self, call: Call) -> Generator[Any]:
        following: Call | None = call
        while following is not None:
            yield from self._follow(following)
            if self._lost is None:
                return
            following = self._again()
        yield _failed_execution(p.CONNECTION_LOST, self._lost or "the stream was lost")

    def _again(self) -> Call | None:
        if not self._reattach or self.command_id is None:
            return None
        self._reattach = False
        path = f"{self._path}/execute/{quote(self.command_id, safe='')}/stream"
        return Call("GET", path, params={"offset": str(self.offset)}, idempotent=True)

    def _follow(self, call: Call) -> Generator[Any]:
        self._lost = f"{call.what}: the stream ended before the command's exit"
        try:
            response = self._connection.open(call)
        except SandboxServiceError as exc:
            if call.method == "POST" and not isinstance(exc, ConnectionLost):
                raise
            self._lost = exc.message
            return
        try:
            for line in response.iter_lines():
                item = self._item(line)
                if item is not None:
                    yield item
                    if isinstance(item, p.ExecuteResponse):
                        self._lost = None
                        return
        except ConnectionLost as exc:
            self._lost = exc.message
        except Exception as exc:
            if not _transport_error(exc):
                raise
            self._lost = error_from_transport(exc, call.what).message  # type: ignore[arg-type]
        finally:
            response.close()

    def _item(self, line: str) -> Any:
        if not line.strip():
            return None
        event = _event(line)
        if event is None:
            return None
        if event.type == "exit":
            if event.result is None:
                raise ConnectionLost("the stream's exit event carried no result")
            return event.result
        if event.id is not None:
            self.command_id = event.id
        if event.offset is not None:
            self.offset = event.offset
        if not event.data:  # the first event, or a keep-alive
            return None
        return _Chunk(event.data, event.stream or "stdout")


class _Chunk(str):
    """A chunk of output and the stream it came from (`sandboxes.client.OutputChunk`)."""

    stream: str

    def __new__(cls, text: str, stream: str) -> _Chunk:
        chunk = super().__new__(cls, text)
        chunk.stream = stream
        return chunk


def _event(line: str) -> d.StreamEvent | None:
    """One NDJSON line; ``None`` for a type the client does not know (it ignores those)."""
    try:
        return d.strictly(d.StreamEvent, line)
    except d.Unsure:
        from sandboxes.client import _wire

        event = _wire.stream_event(line)
    if event is None:
        return None
    result = None if event.result is None else _wire.execute_response(event.result)
    return d.StreamEvent(event.type, event.data, result, event.id, event.offset, event.stream)


# ---------------------------------------------------------------------- sandboxes


def list_sandboxes(connection: Connection) -> list[d.SandboxInfo]:
    """``GET /v1/sandboxes``'s list."""

    def full() -> Callable[[bytes], Any]:
        from sandboxes.client import _wire

        return lambda raw: d.SandboxList(
            [d.SandboxInfo(**i.model_dump()) for i in _wire._SANDBOX_LIST.decode(raw).sandboxes]
        )

    listing: d.SandboxList = connection.call(Call("GET", _SANDBOXES, idempotent=True), _answer(d.SandboxList, full))
    return listing.sandboxes


def cmd_list(args: argparse.Namespace, connection: Connection) -> int:
    """``sandboxes ls`` without a sandbox nor ``--json``: the tenant's sandboxes, a line each."""
    out(list_lines(list_sandboxes(connection), long=args.long))
    return 0


def list_lines(sandboxes: list[Any], *, long: bool) -> str:
    """The lines ``sandboxes ls`` prints: ids, oldest first; with ``long``, what each is."""
    lines = []
    for info in sorted(sandboxes, key=lambda info: info.created_at):
        line = info.id
        if long:
            expires = when(info.expires_at)
            line = f"{info.id}  {info.template:<12}  {info.backend:<7}  expires {expires}  {info.workdir}"
        lines.append(line + "\n")
    return "".join(lines)


def when(timestamp: float | None) -> str:
    if timestamp is None:
        return "never"
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
