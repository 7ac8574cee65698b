"""The egress proxy: what a sandbox's ``HTTP_PROXY``/``HTTPS_PROXY`` lead to, one connection at
a time (`EgressProxy.serve`), for one sandbox (`EgressContext`).

It speaks HTTP/1.1 as a proxy (parsed by h11, bounded): ``CONNECT host:port`` opens a tunnel
(any TCP, TLS included, passed through untouched), and an absolute-form request
(``GET http://host/path``) is forwarded, with the tenant's credentials for that host added on
the way (`Credential`: the secret never enters the sandbox). Every destination is resolved here
and decided on its addresses (`sandboxes.server.egress.policy.decide`), then reached at the very
address that was checked; the sandbox's policy is read anew for each connection, so a change
applies to the next one. Bytes pass at the sandbox's rates (`EgressContext.rate`, and its relay
limits'), and a connection past its cap of relayed connections is answered 503 with a
``Retry-After``. A refusal answers 403 with the reason in its body, at once. Every connection
is logged: sandbox, tenant, destination, address, allowed or not, bytes each way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

import h11

from sandboxes.server.egress.policy import Decision, EgressPolicy, decide, host_matches
from sandboxes.server.egress.rate import ByteRate, RelayBusy, RelayLimits

__all__ = ["ByteReader", "ByteWriter", "Credential", "EgressContext", "EgressProxy"]

logger = logging.getLogger(__name__)

_HEAD_LIMIT = 16 << 10
"""The most bytes of a request's head the proxy reads before it refuses it."""
_CHUNK = 64 << 10
_HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer", b"upgrade"}
)


class ByteReader(Protocol):
    """What the proxy reads a connection through (`asyncio.StreamReader`, a relay's reader)."""

    async def read(self, size: int, /) -> bytes: ...


class ByteWriter(Protocol):
    """What the proxy writes a connection through (`asyncio.StreamWriter`, a relay's writer)."""

    def write(self, data: bytes, /) -> None: ...

    async def drain(self) -> None: ...

    def can_write_eof(self) -> bool: ...

    def write_eof(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Credential:
    """Headers added to every plain-HTTP request for ``host`` (exact, or ``*.domain``) that goes
    out through the proxy, replacing any of the same name the sandbox sent."""

    host: str
    headers: dict[str, str]

    def covers(self, name: str) -> bool:
        return host_matches(self.host, name)


@dataclass
class EgressContext:
    """Whose connection this is, and what applies to it: ``policy`` is called for each
    connection (the current allow-list), ``credentials`` are the tenant's."""

    sandbox: str
    tenant: str
    policy: Callable[[], EgressPolicy]
    credentials: Sequence[Credential] = ()
    limits: RelayLimits = field(default_factory=lambda: RelayLimits(64))
    """The sandbox's relayed connections (shared with its previews): one more than they allow is
    refused (503), and their bandwidth applies to egress too."""
    rate: ByteRate | None = None
    """The sandbox's egress bandwidth, both directions of all its connections together; ``None``: unbounded."""

    async def paced(self, size: int) -> None:
        """Return once ``size`` more bytes may pass (at once without a rate)."""
        if self.rate is not None:
            await self.rate.take(size)
        await self.limits.paced(size)


@dataclass
class _Tally:
    destination: str = ""
    address: str = ""
    allowed: bool = False
    reason: str = ""
    sent: int = 0
    received: int = 0


class EgressProxy:
    """Serves proxy connections; `resolve` gives a name's addresses (the event loop's resolver),
    ``connect_timeout`` bounds resolving and reaching a destination, ``idle_timeout`` a tunnel
    quiet both ways."""

    def __init__(self, *, connect_timeout: float = 10.0, idle_timeout: float = 300.0) -> None:
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout

    async def resolve(self, host: str, port: int) -> list[str]:
        """Every address ``host`` resolves to (a literal address is its own)."""
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        return list(dict.fromkeys(str(info[4][0]) for info in infos))

    async def serve(self, reader: ByteReader, writer: ByteWriter, context: EgressContext) -> None:
        """One client connection, to its end; never raises for what the client or the
        destination does."""
        tally = _Tally()
        with contextlib.ExitStack() as held:
            try:
                try:
                    held.enter_context(context.limits.hold())
                except RelayBusy as busy:
                    await self._busy(reader, writer, tally, str(busy))
                else:
                    await self._serve(reader, writer, context, tally)
            except (OSError, h11.ProtocolError, asyncio.IncompleteReadError, TimeoutError) as exc:
                tally.reason = tally.reason or f"{type(exc).__name__}: {exc}"
            finally:
                with contextlib.suppress(Exception):
                    writer.close()
                logger.info(
                    "egress %s %s",
                    "allowed" if tally.allowed else "refused",
                    tally.destination or "(no request)",
                    extra={
                        "sandbox": context.sandbox,
                        "tenant": context.tenant,
                        "destination": tally.destination,
                        "address": tally.address,
                        "allowed": tally.allowed,
                        "reason": tally.reason,
                        "bytes_sent": tally.sent,
                        "bytes_received": tally.received,
                    },
                )

    async def _busy(self, reader: ByteReader, writer: ByteWriter, tally: _Tally, reason: str) -> None:
        """The request of a connection past the sandbox's cap, answered 503 with a ``Retry-After``."""
        client = h11.Connection(h11.SERVER, max_incomplete_event_size=_HEAD_LIMIT)
        request = await asyncio.wait_for(_next_event(client, reader), self.connect_timeout)
        tally.reason = reason
        if isinstance(request, h11.Request):
            tally.destination = request.target.decode("latin-1")
            await _refuse(client, writer, 503, f"egress refused: {reason}", [(b"retry-after", b"1")])

    async def _serve(self, reader: ByteReader, writer: ByteWriter, context: EgressContext, tally: _Tally) -> None:
        client = h11.Connection(h11.SERVER, max_incomplete_event_size=_HEAD_LIMIT)
        request = await _next_event(client, reader)
        if not isinstance(request, h11.Request):
            return
        target = request.target.decode("latin-1")
        if request.method == b"CONNECT":
            host, _, port_text = target.rpartition(":")
            host = host.strip("[]")
        else:
            url = urlsplit(target)
            if url.scheme != "http" or not url.hostname:
                await _refuse(client, writer, 400, "only CONNECT and absolute http:// requests go through this proxy")
                return
            host, port_text = url.hostname, str(url.port or 80)
        if not port_text.isdigit() or not 0 < int(port_text) < 65536 or not host:
            await _refuse(client, writer, 400, f"not a destination: {target!r}")
            return
        port = int(port_text)
        tally.destination = f"{host}:{port}"
        decision = await self._decide(context, host, port)
        tally.reason = decision.reason
        if not decision.allowed or decision.address is None:
            await _refuse(client, writer, 403, f"egress refused: {decision.reason}")
            return
        tally.address = str(decision.address)
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(str(decision.address), port), self.connect_timeout
            )
        except (OSError, TimeoutError) as exc:
            await _refuse(client, writer, 502, f"{host}:{port} could not be reached: {exc}")
            return
        tally.allowed = True
        try:
            if request.method == b"CONNECT":
                await _send(client, writer, h11.Response(status_code=200, headers=[], reason=b"Connection established"))
                leftover, _ = client.trailing_data
                if leftover:
                    await context.paced(len(leftover))
                    up_writer.write(leftover)
                    tally.sent += len(leftover)
                await self._splice(reader, writer, up_reader, up_writer, tally, context)
            else:
                await self._forward(client, reader, writer, request, host, port, up_reader, up_writer, context, tally)
        finally:
            with contextlib.suppress(Exception):
                up_writer.close()

    async def _decide(self, context: EgressContext, host: str, port: int) -> Decision:
        try:
            addresses = await asyncio.wait_for(self.resolve(host, port), self.connect_timeout)
        except (OSError, TimeoutError) as exc:
            return Decision(False, f"{host} could not be resolved: {exc}")
        return decide(context.policy(), host, port, addresses)

    async def _forward(
        self,
        client: h11.Connection,
        reader: ByteReader,
        writer: ByteWriter,
        request: h11.Request,
        host: str,
        port: int,
        up_reader: ByteReader,
        up_writer: ByteWriter,
        context: EgressContext,
        tally: _Tally,
    ) -> None:
        """One plain-HTTP request, its credentials added, and its answer, both bodies streamed."""
        url = urlsplit(request.target.decode("latin-1"))
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        injected = {
            name.lower().encode(): value.encode()
            for credential in context.credentials
            if credential.covers(host.lower())
            for name, value in credential.headers.items()
        }
        headers = [(name, value) for name, value in request.headers if name not in _HOP_BY_HOP and name not in injected]
        headers += [*injected.items(), (b"connection", b"close")]
        upstream = h11.Connection(h11.CLIENT, max_incomplete_event_size=_HEAD_LIMIT)
        await _send(upstream, up_writer, h11.Request(method=request.method, target=path.encode(), headers=headers))
        while True:  # the request's body
            event = await _next_event(client, reader)
            if isinstance(event, h11.Data):
                tally.sent += len(event.data)
                await context.paced(len(event.data))
                await _send(upstream, up_writer, event)
            elif isinstance(event, h11.EndOfMessage):
                await _send(upstream, up_writer, h11.EndOfMessage())
                break
            else:
                return
        response = await _next_event(upstream, up_reader)
        if not isinstance(response, h11.Response):
            await _refuse(client, writer, 502, f"{host}:{port} did not answer")
            return
        kept = [(name, value) for name, value in response.headers if name not in _HOP_BY_HOP]
        await _send(
            client,
            writer,
            h11.Response(
                status_code=response.status_code, headers=[*kept, (b"connection", b"close")], reason=response.reason
            ),
        )
        while True:
            event = await _next_event(upstream, up_reader)
            if isinstance(event, h11.Data):
                tally.received += len(event.data)
                await context.paced(len(event.data))
                await _send(client, writer, event)
            else:
                await _send(client, writer, h11.EndOfMessage())
                return

    async def _splice(
        self,
        reader: ByteReader,
        writer: ByteWriter,
        up_reader: ByteReader,
        up_writer: ByteWriter,
        tally: _Tally,
        context: EgressContext,
    ) -> None:
        """Bytes both ways, at the sandbox's rate, until either side ends or both are quiet for
        ``idle_timeout``."""

        async def pump(source: ByteReader, sink: ByteWriter, up: bool) -> None:
            while data := await asyncio.wait_for(source.read(_CHUNK), self.idle_timeout):
                if up:
                    tally.sent += len(data)
                else:
                    tally.received += len(data)
                await context.paced(len(data))
                sink.write(data)
                await sink.drain()
            with contextlib.suppress(OSError):
                if sink.can_write_eof():
                    sink.write_eof()

        tasks = [
            asyncio.create_task(pump(reader, up_writer, True)),
            asyncio.create_task(pump(up_reader, writer, False)),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)  # or both ended
            for task in done:
                task.result()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _next_event(connection: h11.Connection, reader: ByteReader) -> object:
    """The next event of ``connection``, reading as it needs (bounded by h11's limit)."""
    while True:
        event = connection.next_event()
        if event is not h11.NEED_DATA:
            return event
        connection.receive_data(await reader.read(_CHUNK))


async def _send(connection: h11.Connection, writer: ByteWriter, event: h11.Event) -> None:
    data = connection.send(event)
    if data:
        writer.write(data)
        await writer.drain()


async def _refuse(
    connection: h11.Connection, writer: ByteWriter, status: int, reason: str, extra: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """Answer ``status`` with ``reason`` as its text, then close: what curl or pip show."""
    body = (reason + "\n").encode()
    headers = [
        *extra,
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    with contextlib.suppress(h11.LocalProtocolError):
        await _send(connection, writer, h11.Response(status_code=status, headers=headers))
        await _send(connection, writer, h11.Data(data=body))
        await _send(connection, writer, h11.EndOfMessage())
