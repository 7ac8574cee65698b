"""Python client of the sandbox service: lifecycle calls, and `RemoteSandbox`, a backend of the
protocol over HTTP, so a remote sandbox is used exactly like a local one::

    from sandboxes.client import SandboxClient

    with SandboxClient("http://127.0.0.1:8080", api_key) as client, client.create("default") as sandbox:
        print(sandbox.execute("echo hello").output)

Calls that may safely be sent twice (reads, listings, searches, downloads, GET, DELETE, renew)
are retried with backoff on connection failures, read timeouts, ``503`` and ``429`` (after its
``Retry-After``). Every other call (create, execute, write, edit, file delete, upload) is retried
only when the request certainly never left, so nothing runs twice. Needs the ``server`` extra
(httpx).
"""

from typing import TYPE_CHECKING, Any

from sandboxes.api import SandboxInfo
from sandboxes.client._clients import AsyncSandboxClient, SandboxClient
from sandboxes.client._streams import AsyncCommandStream, CommandStream, OutputChunk
from sandboxes.client._watches import AsyncWatchStream, WatchStream
from sandboxes.client._wire import ClientConfig, ProcessStatus
from sandboxes.client.errors import (
    BackendUnavailable,
    ConnectionLost,
    InternalError,
    InvalidRequest,
    NotFound,
    Paused,
    QuotaExceeded,
    RateLimited,
    SandboxServiceError,
    ServiceUnreachable,
    SnapshotMismatch,
    TooLarge,
    Unauthorized,
)
from sandboxes.client.remote import RemoteSandbox

if TYPE_CHECKING:
    from sandboxes.client._ports import AsyncPortConnection, PortConnection, PortForward, PortUnreachable
    from sandboxes.client._pty import AsyncRemoteTerminal, RemoteTerminal

_ON_FIRST_USE = {
    "AsyncPortConnection": "_ports",
    "PortConnection": "_ports",
    "PortForward": "_ports",
    "PortUnreachable": "_ports",
    "AsyncRemoteTerminal": "_pty",
    "RemoteTerminal": "_pty",
}
"""Names whose modules (websockets underneath) are imported when first asked for, not with the client."""


def __getattr__(name: str) -> Any:
    module = _ON_FIRST_USE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "AsyncCommandStream",
    "AsyncPortConnection",
    "AsyncRemoteTerminal",
    "AsyncSandboxClient",
    "AsyncWatchStream",
    "BackendUnavailable",
    "ClientConfig",
    "CommandStream",
    "ConnectionLost",
    "InternalError",
    "InvalidRequest",
    "NotFound",
    "OutputChunk",
    "Paused",
    "PortConnection",
    "PortForward",
    "PortUnreachable",
    "ProcessStatus",
    "QuotaExceeded",
    "RateLimited",
    "RemoteSandbox",
    "RemoteTerminal",
    "SandboxClient",
    "SandboxInfo",
    "SandboxServiceError",
    "ServiceUnreachable",
    "SnapshotMismatch",
    "TooLarge",
    "Unauthorized",
    "WatchStream",
]
