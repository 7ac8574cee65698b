"""`ServiceConnection` and `AsyncServiceConnection`: a connection pool to the service, the calls
that need no sandbox handle, and the loop (per flavour) that sends an `Op` with the retry policy
of `sandboxes.client._wire`. `RemoteSandbox` sends its calls through them; the public
`SandboxClient` (`sandboxes.client._clients`) adds what hands out a `RemoteSandbox`, so that
imports run one way: this module < ``remote`` < ``_clients``.

What the two flavours share lives once, free of I/O: the request an `Op` makes (`_Known`), which
attempt comes next and after how long (`sandboxes.client._light.Attempts`), and how a failed
answer becomes the client's error; each flavour only sends, sleeps and closes.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import threading
import time
import weakref
from collections.abc import AsyncIterable, Iterable
from typing import Any, Self, TypeVar

import httpx

from sandboxes import api
from sandboxes.client import _ops, _state_ops
from sandboxes.client import _wire as w
from sandboxes.client._light import Attempts, TransportErrors, recovered, sent
from sandboxes.client.errors import SandboxServiceError, error_from_response

__all__ = ["AsyncServiceConnection", "Connections", "ServiceConnection", "achunks_of", "chunks_of"]

T = TypeVar("T")


def _config(
    url: str, api_key: str | None, timeout: float, retries: int, config: w.ClientConfig | None, options: dict[str, Any]
) -> w.ClientConfig:
    if config is not None:
        return config
    return w.ClientConfig(url=url, api_key=api_key, timeout=timeout, retries=retries, **options)


class ServiceConnection:
    """A connection pool to one sandbox service, for one API key. Thread-safe.

    Extra keyword options are `ClientConfig` fields (``connect_timeout``, ``backoff``, ...).
    """

    def __init__(
        self,
        url: str = "",
        api_key: str | None = None,
        *,
        timeout: float = 300.0,
        retries: int = 4,
        config: w.ClientConfig | None = None,
        transport: httpx.BaseTransport | None = None,
        **options: Any,
    ) -> None:
        self.config = _config(url, api_key, timeout, retries, config, options)
        self._http = httpx.Client(**self.config.pool_settings(), transport=transport)
        self._known = _Known(self.config, self._http)

    # ------------------------------------------------------------------ lifecycle

    def list(self) -> list[api.SandboxInfo]:
        return self.call(_ops.list_sandboxes())

    def get(self, sandbox_id: str) -> api.SandboxInfo:
        return self.call(_ops.get(sandbox_id))

    def renew(self, sandbox_id: str, ttl: float) -> api.SandboxInfo:
        return self.call(_ops.renew(sandbox_id, ttl))

    def metrics(self, sandbox_id: str) -> api.SandboxMetrics:
        """The samples of the sandbox's usage (CPU, memory, disk) the service kept, oldest first."""
        return self.call(_ops.metrics(sandbox_id))

    def create_volume(self, name: str, *, size_limit: int | None = None, template: str = "default") -> api.VolumeInfo:
        """A new empty volume of this tenant's, for the sandboxes of ``template`` to mount."""
        return self.call(_ops.create_volume(name, size_limit, template))

    def volumes(self) -> builtins.list[api.VolumeInfo]:
        return self.call(_ops.list_volumes())

    def delete_volume(self, name: str) -> None:
        """Delete the volume and its files (refused while a sandbox mounts it); gone is fine."""
        self.call(_ops.delete_volume(name))

    def pause(
        self, sandbox_id: str, ttl: str = "keep", *, mode: str = "freeze", memory: bool = False
    ) -> api.SandboxInfo:
        """Pause the sandbox (`RemoteSandbox.pause`)."""
        return self.call(_ops.pause(sandbox_id, ttl, mode, memory))

    def resume(self, sandbox_id: str) -> api.SandboxInfo:
        return self.call(_ops.resume(sandbox_id))

    def list_snapshots(self) -> builtins.list[api.SnapshotInfo]:
        return self.call(_state_ops.list_snapshots())

    def get_snapshot(self, snapshot_id: str) -> api.SnapshotInfo:
        return self.call(_state_ops.get_snapshot(snapshot_id))

    def delete_snapshot(self, snapshot_id: str) -> None:
        self.call(_state_ops.delete_snapshot(snapshot_id))

    def delete(self, sandbox_id: str) -> None:
        self.call(_ops.delete(sandbox_id))

    def health(self) -> Any:
        """``/healthz``'s answer: the service process is up."""
        return self.call(_ops.health("/healthz"))

    def ready(self) -> bool:
        """Whether ``/readyz`` answers 2xx: the service and its backend take requests."""
        try:
            self.call(_ops.health("/readyz", retry=False))
        except SandboxServiceError:
            return False
        return True

    # ------------------------------------------------------------------ sending

    def call(self, op: w.Op[T]) -> T:
        """Send ``op`` (retrying as its class allows) and parse the answer."""
        try:
            response = self._send_retrying(op, stream=False)
        except SandboxServiceError as exc:
            return recovered(op, exc)
        return op.parse(response)

    def open(self, op: w.Op[Any], content: Any = None) -> httpx.Response:
        """A streamed answer whose headers said success; the caller reads and closes it."""
        return self._send_retrying(op, stream=True, content=content)

    def _send_retrying(self, op: w.Op[Any], *, stream: bool, content: Any = None) -> httpx.Response:
        attempts = Attempts(self.config, op, self.config.retries)
        while True:
            try:
                return sent(self._http, self._known.request(op, content), stream=stream, what=op.what)
            except SandboxServiceError as exc:
                delay = attempts.after(exc)
            if delay is None:
                return httpx.Response(204)
            time.sleep(delay)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncServiceConnection:
    """`ServiceConnection` for asyncio programs: the same calls, awaited, on one event loop."""

    def __init__(
        self,
        url: str = "",
        api_key: str | None = None,
        *,
        timeout: float = 300.0,
        retries: int = 4,
        config: w.ClientConfig | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        limits: httpx.Limits | None = None,
        **options: Any,
    ) -> None:
        self.config = _config(url, api_key, timeout, retries, config, options)
        self._http = httpx.AsyncClient(**self.config.pool_settings(limits), transport=transport)
        self._known = _Known(self.config, self._http)

    async def list(self) -> list[api.SandboxInfo]:
        return await self.call(_ops.list_sandboxes())

    async def get(self, sandbox_id: str) -> api.SandboxInfo:
        return await self.call(_ops.get(sandbox_id))

    async def renew(self, sandbox_id: str, ttl: float) -> api.SandboxInfo:
        return await self.call(_ops.renew(sandbox_id, ttl))

    async def metrics(self, sandbox_id: str) -> api.SandboxMetrics:
        return await self.call(_ops.metrics(sandbox_id))

    async def create_volume(
        self, name: str, *, size_limit: int | None = None, template: str = "default"
    ) -> api.VolumeInfo:
        return await self.call(_ops.create_volume(name, size_limit, template))

    async def volumes(self) -> builtins.list[api.VolumeInfo]:
        return await self.call(_ops.list_volumes())

    async def delete_volume(self, name: str) -> None:
        await self.call(_ops.delete_volume(name))

    async def pause(
        self, sandbox_id: str, ttl: str = "keep", *, mode: str = "freeze", memory: bool = False
    ) -> api.SandboxInfo:
        return await self.call(_ops.pause(sandbox_id, ttl, mode, memory))

    async def resume(self, sandbox_id: str) -> api.SandboxInfo:
        return await self.call(_ops.resume(sandbox_id))

    async def list_snapshots(self) -> builtins.list[api.SnapshotInfo]:
        return await self.call(_state_ops.list_snapshots())

    async def get_snapshot(self, snapshot_id: str) -> api.SnapshotInfo:
        return await self.call(_state_ops.get_snapshot(snapshot_id))

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self.call(_state_ops.delete_snapshot(snapshot_id))

    async def delete(self, sandbox_id: str) -> None:
        await self.call(_ops.delete(sandbox_id))

    async def health(self) -> Any:
        return await self.call(_ops.health("/healthz"))

    async def ready(self) -> bool:
        try:
            await self.call(_ops.health("/readyz", retry=False))
        except SandboxServiceError:
            return False
        return True

    async def call(self, op: w.Op[T]) -> T:
        try:
            response = await self._send_retrying(op, stream=False)
        except SandboxServiceError as exc:
            return recovered(op, exc)
        return op.parse(response)

    async def open(self, op: w.Op[Any], content: Any = None) -> httpx.Response:
        return await self._send_retrying(op, stream=True, content=content)

    async def _send_retrying(self, op: w.Op[Any], *, stream: bool, content: Any = None) -> httpx.Response:
        attempts = Attempts(self.config, op, self.config.retries)
        while True:
            try:
                return await _asent(self._http, self._known.request(op, content), stream=stream, what=op.what)
            except SandboxServiceError as exc:
                delay = attempts.after(exc)
            if delay is None:
                return httpx.Response(204)
            await asyncio.sleep(delay)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class Connections:
    """The connections a `RemoteSandbox` sends through, either flavour from either: the one it
    was made with is used as is, the other flavour's made on first use from the same
    configuration. A made-up async connection lives per event loop and keeps no idle
    connection, so a loop that ends leaves nothing open behind it; `close` releases the ones
    made here, never the one given."""

    def __init__(self, client: ServiceConnection | AsyncServiceConnection) -> None:
        self._config = client.config
        self._given = client if isinstance(client, ServiceConnection) else None
        self._agiven = client if isinstance(client, AsyncServiceConnection) else None
        self._made: ServiceConnection | None = None
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncServiceConnection] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def sync(self) -> ServiceConnection:
        """The sync connection: the given one, else one made once and shared by every thread."""
        if self._given is not None:
            return self._given
        with self._lock:
            if self._made is None:
                self._made = ServiceConnection(config=self._config)
            return self._made

    def async_(self) -> AsyncServiceConnection:
        """The async connection for the running event loop."""
        if self._agiven is not None:
            return self._agiven
        loop = asyncio.get_running_loop()
        with self._lock:
            made = self._per_loop.get(loop)
            if made is None:
                no_idle = httpx.Limits(max_connections=100, max_keepalive_connections=0)
                made = self._per_loop[loop] = AsyncServiceConnection(config=self._config, limits=no_idle)
            return made

    def close(self) -> None:
        """Close the sync connection made here (a later call makes another)."""
        with self._lock:
            made, self._made = self._made, None
        if made is not None:
            made.close()


class _Known:
    """The absolute URL of each path and the `httpx.Timeout` of each read timeout, made once per
    client: httpx re-parses and merges a relative URL on every request, a large share of its
    own cost per request. Bounded: a long-lived client sees many sandbox ids."""

    _MAX_URLS = 1024

    def __init__(self, config: w.ClientConfig, http: httpx.Client | httpx.AsyncClient) -> None:
        self._config = config
        self._http = http
        self._urls: dict[str, httpx.URL] = {}
        self._timeouts: dict[object, httpx.Timeout] = {}

    def url(self, path: str) -> httpx.URL:
        url = self._urls.get(path)
        if url is None:
            if len(self._urls) >= self._MAX_URLS:
                self._urls.clear()
            url = self._urls[path] = self._http.build_request("GET", path).url  # merged as httpx does
        return url

    def timeout(self, read: object) -> httpx.Timeout:
        timeout = self._timeouts.get(read)
        if timeout is None:
            timeout = self._timeouts[read] = self._config.httpx_timeout(read)
        return timeout

    def request(self, op: w.Op[Any], content: Any) -> httpx.Request:
        """The request ``op`` describes, with ``content`` as its body (``None``: its JSON)."""
        return self._http.build_request(
            op.method, self.url(op.path), json=op.json, params=op.params, content=content,
            headers=op.headers, timeout=self.timeout(op.read_timeout),
        )  # fmt: skip


async def _asent(http: httpx.AsyncClient, request: httpx.Request, *, stream: bool, what: str) -> httpx.Response:
    """`sandboxes.client._light.sent` on an event loop: a success's response, else the client's error."""
    with TransportErrors(what):
        response = await http.send(request, stream=stream)
    if response.is_success:
        return response
    async with contextlib.aclosing(response):
        with TransportErrors(what):
            if stream:
                await response.aread()
    raise error_from_response(response)


def chunks_of(content: bytes | Iterable[bytes] | Any, size: int = 1 << 16) -> Iterable[bytes] | bytes:
    """A request body for httpx's sync client: bytes as they are, a file read chunk by chunk."""
    if isinstance(content, bytes | bytearray | memoryview):
        return bytes(content)
    if hasattr(content, "read"):
        return iter(lambda: content.read(size), b"")
    return content


async def achunks_of(content: Any, size: int = 1 << 16) -> AsyncIterable[bytes]:
    """A request body for httpx's async client, whatever the caller passed."""
    if isinstance(content, bytes | bytearray | memoryview):
        yield bytes(content)
    elif hasattr(content, "read"):
        while chunk := content.read(size):
            yield chunk
    elif hasattr(content, "__aiter__"):
        async for chunk in content:
            yield chunk
    else:
        for chunk in content:
            yield chunk
