"""Preview URLs: HTTP/1.1 requests and WebSockets to a port inside a sandbox, relayed by its exec
helper (`sandboxes.ports`), and a raw TCP tunnel for the CLI's port forward.

HTTP goes through httpcore over a network backend whose connections are relays (`RelayBackend`):
its pool keeps a relay alive between requests to the same sandbox and port, bodies stream both
ways with the relay's flow control, hop-by-hop headers are dropped both ways (and the caller's
key or preview token never reaches the sandbox). A WebSocket is relayed message by message: the
service accepts the caller's once the sandbox's server accepted its own upgrade (websockets'
sans-I/O client speaks to it over the relay). Who may reach a port is `sandboxes.server.previews`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import httpcore
from starlette.datastructures import URLPath
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Match, NoMatchFound, Route, WebSocketRoute, request_response, websocket_session
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response as WSResponse
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from sandboxes.ports import PortError, aconnect_port
from sandboxes.server.errors import ServiceError
from sandboxes.server.previews import PREVIEW_COOKIE, PreviewAccess
from sandboxes.server.registry import Entry
from sandboxes.server.relay_limits import RelayLimits, hold_relay, limits_for, paced

__all__ = ["HostedRoute", "PreviewHosts", "Previews", "RelayBackend", "preview_routes", "relay_http"]

logger = logging.getLogger(__name__)

_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        b"authorization",
        b"x-preview-token",
        b"x-access-token",
        b"e2b-traffic-access-token",
    }
)
"""Request headers the service does not pass on as they came (hop-by-hop ones, those it sets
itself, and the caller's credentials)."""
_RESPONSE_DROPPED = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"trailer", b"transfer-encoding", b"upgrade"}
)
_TIMEOUTS = {"connect": 30.0, "read": None, "write": 60.0, "pool": 30.0}
_WS_MAX_MESSAGE = 16 << 20
_READ = 64 << 10


class _RelayStream(httpcore.AsyncNetworkStream):
    """One relayed connection as httpcore's network stream."""

    def __init__(self, connection: tuple[Any, Any], limits: RelayLimits | None) -> None:
        self._reader, self._writer = connection
        self._limits = limits

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109 (httpcore's)
        try:
            async with asyncio.timeout(timeout):
                data: bytes = await self._reader.read(max_bytes)
            if self._limits is not None:
                await self._limits.paced(len(data))
            return data
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(str(exc)) from exc
        except ConnectionError as exc:
            raise httpcore.ReadError(str(exc)) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109 (httpcore's)
        if self._limits is not None:
            await self._limits.paced(len(buffer))
        try:
            async with asyncio.timeout(timeout):
                self._writer.write(buffer)
                await self._writer.drain()
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(str(exc)) from exc
        except ConnectionError as exc:
            raise httpcore.WriteError(str(exc)) from exc

    async def aclose(self) -> None:
        self._writer.close()

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # an idle pooled connection with news was closed or broke
            return self._reader.has_news()
        return None


class RelayBackend(httpcore.AsyncNetworkBackend):
    """httpcore's connections as relays: the host of a URL is a sandbox's key (`key_for`), so
    the pool keeps connections per sandbox and port."""

    def __init__(self) -> None:
        self._targets: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()

    def key_for(self, sandbox_id: str, sandbox: Any) -> bytes:
        key = sandbox_id.encode("utf-8").hex()
        self._targets[key] = sandbox
        return key.encode("ascii")

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        sandbox = self._targets.get(host)
        if sandbox is None:
            raise httpcore.ConnectError("the sandbox is gone")
        try:
            async with asyncio.timeout(timeout):
                return _RelayStream(await aconnect_port(sandbox, port), limits_for(sandbox))
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"port {port} of the sandbox did not answer in time") from exc
        except PortError as exc:
            raise httpcore.ConnectError(exc.message) from exc

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Any = None,
    ) -> Any:
        raise httpcore.ConnectError("no unix sockets through a relay")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class Previews:
    """The preview plane's state: who may reach what (`PreviewAccess`) and the pool of relays."""

    def __init__(self, access: PreviewAccess) -> None:
        self.access = access
        self.backend = RelayBackend()
        self.pool = httpcore.AsyncConnectionPool(
            network_backend=self.backend, max_connections=1024, max_keepalive_connections=256, keepalive_expiry=30
        )

    async def aclose(self) -> None:
        await self.pool.aclose()


# ---------------------------------------------------------------------- HTTP


def _service(scope: Scope) -> Any:
    return scope["app"].state.service


async def _admitted(scope: Scope, sandbox_id: str, port: int) -> tuple[Any, Entry]:
    svc = _service(scope)
    if not 0 < port < 65536:
        raise ServiceError("invalid_request", f"a port is 1 to 65535, not {port}")
    entry, tenant = await svc.previews.access.entry_for(scope, svc.auth, svc.settings, svc.registry, sandbox_id, port)
    svc.limiter.check(tenant)
    return svc, await svc.registry.awake(entry)  # paused: resumed (``auto_resume``) or refused


def _upstream_target(scope: Scope) -> bytes:
    """The request's path and query as the sandbox's server sees them: the preview prefix and
    the preview token left out."""
    raw: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
    if scope.get("preview_target") is not None:  # the Host form: the path is the app's own
        rest = raw[1:]
    else:  # /v1/sandboxes/ID/ports/PORT/rest
        parts = raw.split(b"/", 6)
        rest = parts[-1] if len(parts) == 7 else b""
    query = b"&".join(
        part for part in scope.get("query_string", b"").split(b"&") if part and not part.startswith(b"preview_token=")
    )
    return b"/" + rest + (b"?" + query if query else b"")


def _forwarded(scope: Scope, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The caller's headers the sandbox's server gets, and the proxy's own (``X-Forwarded-*``)."""
    listed = {
        name.strip().lower().encode("latin-1")
        for key, value in headers
        if key == b"connection"
        for name in value.decode("latin-1").split(",")
    }
    kept = [(key, value) for key, value in headers if key not in _HOP_BY_HOP and key not in listed]
    kept = [(key, _without_preview_cookie(value)) if key == b"cookie" else (key, value) for key, value in kept]
    host = next((value for key, value in headers if key == b"host"), b"localhost")
    client = scope.get("client") or ("", 0)
    return [
        (b"host", host),
        *[(key, value) for key, value in kept if value],
        (b"x-forwarded-for", str(client[0]).encode("latin-1")),
        (b"x-forwarded-host", host),
        (b"x-forwarded-proto", str(scope.get("scheme", "http")).encode("latin-1")),
    ]


def _without_preview_cookie(value: bytes) -> bytes:
    cookies = [part.strip() for part in value.split(b";")]
    return b"; ".join(part for part in cookies if part and not part.startswith(PREVIEW_COOKIE.encode() + b"="))


async def _body(request: Request) -> AsyncIterator[bytes]:
    async for chunk in request.stream():
        if chunk:
            yield chunk


async def preview_http(request: Request) -> Response:
    """Any method on ``/v1/sandboxes/{id}/ports/{port}/{path}``: relayed to the sandbox's port."""
    scope = request.scope
    sandbox_id, port = request.path_params["sandbox_id"], int(request.path_params["port"])
    if scope.get("preview_target") is None and request.path_params["path"].split("/", 1)[0] == "tokens":
        raise HTTPException(405, "under a port's path, tokens/ is the service's (the Host form reaches the app's)")
    _, entry = await _admitted(scope, sandbox_id, port)
    response = await relay_http(request, entry, port, _upstream_target(scope))
    token = request.query_params.get("preview_token")
    if token is not None:  # a browser's first visit: later requests under the port's path carry it
        path = f"/v1/sandboxes/{sandbox_id}/ports/{port}/" if scope.get("preview_target") is None else "/"
        cookie = f"{PREVIEW_COOKIE}={token}; Path={path}; HttpOnly; SameSite=Lax"
        response.raw_headers.append((b"set-cookie", cookie.encode("latin-1")))
    return response


async def relay_http(request: Request, entry: Entry, port: int, target: bytes) -> StreamingResponse:
    """The request, for ``target`` (path and query), relayed to ``port`` of the admitted
    sandbox, its answer streamed back; a 502 when nothing answers there."""
    previews: Previews = _service(request.scope).previews
    headers = _forwarded(request.scope, request.scope["headers"])
    length = request.headers.get("content-length")
    content: AsyncIterator[bytes] | bytes = b""
    if length is not None:
        headers.append((b"content-length", length.encode("latin-1")))
        content = _body(request)
    elif "transfer-encoding" in request.headers:
        headers.append((b"transfer-encoding", b"chunked"))
        content = _body(request)
    host = previews.backend.key_for(entry.state.id, entry.sandbox)
    url = httpcore.URL(scheme=b"http", host=host, port=port, target=target)
    upstream = httpcore.Request(
        request.method, url, headers=headers, content=content, extensions={"timeout": _TIMEOUTS}
    )
    held = hold_relay(entry, port)
    try:
        response = await previews.pool.handle_async_request(upstream)
    except BaseException as exc:
        await held.aclose()
        if not isinstance(exc, httpcore.NetworkError | httpcore.TimeoutException | httpcore.ProtocolError):
            raise
        what = "broke the HTTP exchange" if isinstance(exc, httpcore.ProtocolError) else "failed"
        message = f"port {port} of sandbox {entry.state.id} {what}: {exc}"
        raise ServiceError("backend_unavailable", message, status=502) from exc
    held.push_async_callback(response.aclose)
    streamed = _HeldResponse(_relayed(response), held, status_code=response.status)
    kept = [(key.lower(), value) for key, value in response.headers if key.lower() not in _RESPONSE_DROPPED]
    streamed.raw_headers = kept
    return streamed


class _HeldResponse(StreamingResponse):
    """A relayed response that lets go of its relay (``held``) once sent, or once sending it
    failed or was cancelled, whether or not its body was ever iterated."""

    def __init__(self, content: AsyncIterator[bytes], held: contextlib.AsyncExitStack, status_code: int) -> None:
        super().__init__(content, status_code=status_code)
        self._held = held

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with self._held:
            await super().__call__(scope, receive, send)


async def _relayed(response: httpcore.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.aiter_stream():
            yield chunk
    finally:
        await response.aclose()


# ---------------------------------------------------------------------- WebSockets


async def preview_websocket(websocket: WebSocket) -> None:
    """A WebSocket to ``/v1/sandboxes/{id}/ports/{port}/{path}``: the sandbox's server's own
    upgrade answered first, then every message relayed both ways until either side closes."""
    await _on_port(websocket, _relay_websocket)


async def _on_port(websocket: WebSocket, relay: Callable[[WebSocket, Any, Any, int], Awaitable[None]]) -> None:
    """``relay`` of the WebSocket and a paced connection to its sandbox's port, admitted and held
    as a relay of that port while it runs (the connection closed after); a refusal is `_deny`'s."""
    sandbox_id, port = websocket.path_params["sandbox_id"], int(websocket.path_params["port"])
    try:
        _, entry = await _admitted(websocket.scope, sandbox_id, port)
        held = hold_relay(entry, port)
    except ServiceError as exc:
        await _deny(websocket, exc)
        return
    async with held:
        try:
            reader, writer = paced(await aconnect_port(entry.sandbox, port), limits_for(entry.sandbox))
        except PortError as exc:
            await _deny(websocket, exc)
            return
        try:
            await relay(websocket, reader, writer, port)
        finally:
            writer.close()


async def _deny(websocket: WebSocket, exc: Exception) -> None:
    status = exc.status if isinstance(exc, ServiceError) else 502
    code = exc.code if isinstance(exc, ServiceError | PortError) else "backend_unavailable"
    message = exc.message if isinstance(exc, ServiceError | PortError) else str(exc)
    headers = exc.headers if isinstance(exc, ServiceError) else None
    body = f'{{"error": "{code}", "message": {message!r}}}'
    await websocket.send_denial_response(Response(body, status_code=status, headers=headers))


async def _relay_websocket(websocket: WebSocket, reader: Any, writer: Any, port: int) -> None:
    scope = websocket.scope
    header = websocket.headers.get("sec-websocket-protocol", "")
    offered = [Subprotocol(name.strip()) for name in header.split(",") if name.strip()]
    target = _upstream_target(scope).decode("latin-1")
    client = ClientProtocol(
        parse_uri(f"ws://127.0.0.1:{port}{target}"), subprotocols=offered or None, max_size=_WS_MAX_MESSAGE
    )
    handshake = client.connect()
    skip = {"host", "upgrade", "connection", "authorization", "x-preview-token", "cookie", "origin"}
    for key, value in websocket.headers.items():
        if key not in skip and not key.startswith("sec-websocket-"):
            handshake.headers[key] = value
    client.send_request(handshake)
    await _flush(client, writer)
    answer = await _handshake(client, reader)
    if answer is None or answer.status_code != 101:
        status = answer.status_code if answer is not None else 502
        await websocket.send_denial_response(Response(answer.body if answer is not None else b"", status_code=status))
        return
    await websocket.accept(subprotocol=answer.headers.get("Sec-WebSocket-Protocol"))
    inbound = asyncio.create_task(_to_sandbox(websocket, client, writer))
    try:
        await _to_caller(websocket, client, reader, writer)
    finally:
        inbound.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await inbound


async def _flush(client: ClientProtocol, writer: Any) -> None:
    for data in client.data_to_send():
        if data:
            writer.write(data)
        else:  # the protocol's end of the connection
            writer.write_eof()
    await writer.drain()


async def _handshake(client: ClientProtocol, reader: Any) -> WSResponse | None:
    while True:
        data = await reader.read(_READ)
        if data:
            client.receive_data(data)
        else:
            client.receive_eof()
        for event in client.events_received():
            if isinstance(event, WSResponse):
                return event
        if not data:
            return None


async def _to_sandbox(websocket: WebSocket, client: ClientProtocol, writer: Any) -> None:
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            client.send_close(message.get("code", 1000))
            await _flush(client, writer)
            return
        if message.get("bytes") is not None:
            client.send_binary(message["bytes"])
        elif message.get("text") is not None:
            client.send_text(message["text"].encode("utf-8"))
        await _flush(client, writer)


async def _to_caller(websocket: WebSocket, client: ClientProtocol, reader: Any, writer: Any) -> None:
    parts: list[bytes] = []
    kind: Opcode | None = None
    while True:
        data = await reader.read(_READ)
        if data:
            client.receive_data(data)
        else:
            client.receive_eof()
        await _flush(client, writer)  # pongs, and the answer to a close
        for frame in client.events_received():
            if not isinstance(frame, Frame):
                continue
            if frame.opcode == Opcode.CLOSE:
                with contextlib.suppress(Exception):
                    await websocket.close(client.close_rcvd.code if client.close_rcvd else 1000)
                return
            if frame.opcode in (Opcode.TEXT, Opcode.BINARY):
                kind, parts = frame.opcode, [bytes(frame.data)]
            elif frame.opcode == Opcode.CONT:
                parts.append(bytes(frame.data))
            else:
                continue
            if frame.fin and kind is not None:
                message = b"".join(parts)
                if kind == Opcode.TEXT:
                    await websocket.send_text(message.decode("utf-8"))
                else:
                    await websocket.send_bytes(message)
                parts, kind = [], None
        if not data:
            with contextlib.suppress(Exception):
                await websocket.close(1011)
            return


# ---------------------------------------------------------------------- the TCP tunnel


async def tunnel(websocket: WebSocket) -> None:
    """``GET /v1/sandboxes/{id}/ports/{port}/connect`` as a WebSocket (the API key only): a TCP
    connection to the port, its bytes as binary messages both ways; an empty message from the
    caller ends its direction, and the socket's end closes the WebSocket."""
    if not any(key == b"authorization" for key, _ in websocket.scope["headers"]):
        await _deny(websocket, ServiceError("unauthorized", "the tunnel needs an API key"))
        return
    await _on_port(websocket, _tunnel)


async def _tunnel(websocket: WebSocket, reader: Any, writer: Any, port: int) -> None:
    await websocket.accept()
    inbound = asyncio.create_task(_tunnel_in(websocket, writer))
    try:
        while chunk := await reader.read(_READ):
            await websocket.send_bytes(chunk)
        with contextlib.suppress(Exception):
            await websocket.close(1000)
    except (ConnectionError, WebSocketDisconnect):
        pass
    finally:
        inbound.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await inbound


async def _tunnel_in(websocket: WebSocket, writer: Any) -> None:
    with contextlib.suppress(WebSocketDisconnect, ConnectionError):
        while True:
            data = await websocket.receive_bytes()
            if not data:
                writer.write_eof()
                return
            writer.write(data)
            await writer.drain()
    writer.close()


# ---------------------------------------------------------------------- routes and hosts

_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def preview_routes(prefix: str) -> list[BaseRoute]:
    """The preview plane's routes, for the end of the service's route table (its own
    ``/ports/{port}`` routes come first: under a port's path, ``connect`` is the tunnel's and
    ``tokens`` the tokens' routes; the Host form, `HostedRoute`, reaches every path of the app)."""
    return [
        WebSocketRoute(prefix + _PORT_PATH + "/connect", tunnel),
        WebSocketRoute(prefix + _PORT_PATH + "/{path:path}", preview_websocket),
        Route(prefix + _PORT_PATH + "/{path:path}", preview_http, methods=_METHODS, include_in_schema=False),
    ]


_PORT_PATH = "/sandboxes/{sandbox_id}/ports/{port:int}"


class PreviewHosts:
    """Marks a request whose Host is ``{port}-{sandbox id}.{domain}`` as a preview of that port
    (``preview_target``), which `HostedRoute` serves, whatever its path: the request middleware
    asks no key of it (the preview checks its own)."""

    def __init__(self, app: ASGIApp, domain: str) -> None:
        self.app = app
        self.suffix = "." + domain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            target = self._target(_headers(scope).get("host", ""))
            if target is not None:
                scope = dict(scope, preview_target=target)
        await self.app(scope, receive, send)

    def _target(self, host: str) -> tuple[int, str] | None:
        name = host.rsplit(":", 1)[0].lower() if not host.startswith("[") else ""
        if not name.endswith(self.suffix):
            return None
        label = name[: -len(self.suffix)]
        port, _, sandbox_id = label.partition("-")
        if not port.isdigit() or not sandbox_id or "." in label:
            return None
        return int(port), sandbox_id


class HostedRoute(BaseRoute):
    """The first route of the table: every request `PreviewHosts` marked, HTTP or WebSocket, to
    the preview of its port (the same access as the path form: its ``path`` and ``methods``)."""

    def __init__(self, prefix: str) -> None:
        self.path = prefix + _PORT_PATH + "/{path:path}"
        self.methods = set(_METHODS)
        self._http = request_response(preview_http)
        self._websocket = websocket_session(preview_websocket)

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        target = scope.get("preview_target")
        if target is None or scope["type"] not in ("http", "websocket"):
            return Match.NONE, {}
        params = {"sandbox_id": target[1], "port": target[0], "path": scope["path"].lstrip("/")}
        return Match.FULL, {"path_params": params}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        else:
            await self._websocket(scope, receive, send)

    def url_path_for(self, name: str, /, **path_params: Any) -> URLPath:
        raise NoMatchFound(name, path_params)


def _headers(scope: Scope) -> Mapping[str, str]:
    return {key.decode("latin-1"): value.decode("latin-1") for key, value in reversed(scope["headers"])}
