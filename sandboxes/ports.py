"""Ports inside a sandbox, reached without a network: a TCP connection to 127.0.0.1:PORT inside
the sandbox, relayed by its exec helper over the stream it already holds
(`sandboxes._mux._relay`). The same on every backend that holds a helper (Docker, Kubernetes,
SSH, a local jail: `sandboxes._mux.HoldsHelper`); any other sandbox answers ``unavailable``.
"""

from __future__ import annotations

import asyncio

from sandboxes import protocol as p
from sandboxes._mux import HoldsHelper, MuxBroken, MuxClient
from sandboxes._mux._relay import RelayedSocket, RelayReader, RelayWriter, connect_relay, open_relay

__all__ = ["PortError", "PortRefused", "RelayReader", "RelayWriter", "RelayedSocket", "aconnect_port", "connect_port"]


class PortError(ConnectionError):
    """A port of a sandbox could not be reached; ``code`` is the protocol's error code."""

    def __init__(self, code: p.ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class PortRefused(PortError, ConnectionRefusedError):
    """Nothing listens on the port inside the sandbox."""

    def __init__(self, message: str) -> None:
        super().__init__(p.UNAVAILABLE, message)


def _check_port(port: int) -> None:
    if type(port) is not int or not 0 < port < 65536:
        raise PortError(p.INVALID_ARGUMENT, f"a port is 1 to 65535, not {port!r}")


def _helper_of(sandbox: object) -> MuxClient:
    """The sandbox's running exec helper (started if none runs), or `PortError` ``unavailable``."""
    if not isinstance(sandbox, HoldsHelper):
        raise PortError(
            p.UNAVAILABLE,
            f"{type(sandbox).__name__} runs no exec helper, so its ports cannot be reached "
            "(Docker, Kubernetes, SSH and local jails relay them)",
        )
    mux = sandbox.exec_helper()
    if mux is None:
        raise PortError(p.UNAVAILABLE, "the sandbox's exec helper is not running (no python3 in it?): ports need it")
    return mux


def _translated(exc: BaseException, port: int) -> PortError:
    if isinstance(exc, ConnectionRefusedError):
        return PortRefused(str(exc))
    if isinstance(exc, TimeoutError):
        return PortError(p.TIMEOUT, f"port {port} of the sandbox did not answer in time")
    return PortError(p.CONNECTION_LOST, f"the relay to port {port} failed: {exc}")


def connect_port(sandbox: object, port: int, *, timeout: float | None = 30.0) -> RelayedSocket:
    """A connection to 127.0.0.1:``port`` inside ``sandbox``, once connected: `PortRefused` when
    nothing listens there, `PortError` (``unavailable``) for a sandbox without an exec helper."""
    _check_port(port)
    mux = _helper_of(sandbox)
    try:
        return connect_relay(mux, port, timeout)
    except (ConnectionError, TimeoutError, MuxBroken) as exc:
        raise _translated(exc, port) from exc


async def aconnect_port(sandbox: object, port: int) -> tuple[RelayReader, RelayWriter]:
    """`connect_port` on an event loop, as asyncio stream halves (starting the helper, when none
    runs, on a thread); bound its time with `asyncio.timeout`."""
    _check_port(port)
    mux = await asyncio.to_thread(_helper_of, sandbox)
    try:
        return await open_relay(mux, port)
    except (ConnectionError, TimeoutError, MuxBroken) as exc:
        raise _translated(exc, port) from exc
