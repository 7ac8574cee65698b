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

if TYPE_CHECKING:
    from sandboxes.api import SandboxInfo
    from sandboxes.client._clients import AsyncSandboxClient, SandboxClient
    from sandboxes.client._light import ProcessStatus
    from sandboxes.client._ports import AsyncPortConnection, PortConnection, PortForward, PortUnreachable
    from sandboxes.client._pty import AsyncRemoteTerminal, RemoteTerminal
    from sandboxes.client._streams import AsyncCommandStream, CommandStream, OutputChunk
    from sandboxes.client._watches import AsyncWatchStream, WatchStream
    from sandboxes.client._wire import ClientConfig
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

_ERRORS = (
    "BackendUnavailable ConnectionLost InternalError InvalidRequest NotFound Paused QuotaExceeded RateLimited "
    "SandboxServiceError ServiceUnreachable SnapshotMismatch TooLarge Unauthorized"
)
_ON_FIRST_USE = {
    "SandboxInfo": "sandboxes.api",
    "AsyncSandboxClient": "sandboxes.client._clients",
    "SandboxClient": "sandboxes.client._clients",
    "ProcessStatus": "sandboxes.client._light",
    "AsyncPortConnection": "sandboxes.client._ports",
    "PortConnection": "sandboxes.client._ports",
    "PortForward": "sandboxes.client._ports",
    "PortUnreachable": "sandboxes.client._ports",
    "AsyncRemoteTerminal": "sandboxes.client._pty",
    "RemoteTerminal": "sandboxes.client._pty",
    "AsyncCommandStream": "sandboxes.client._streams",
    "CommandStream": "sandboxes.client._streams",
    "OutputChunk": "sandboxes.client._streams",
    "AsyncWatchStream": "sandboxes.client._watches",
    "WatchStream": "sandboxes.client._watches",
    "ClientConfig": "sandboxes.client._wire",
    "RemoteSandbox": "sandboxes.client.remote",
    **dict.fromkeys(_ERRORS.split(), "sandboxes.client.errors"),
}
"""Where each public name lives, imported when first asked for: importing a module of this
package (the CLI's light path takes `sandboxes.client.errors`) does not import the API's models,
pydantic nor websockets."""


def __getattr__(name: str) -> Any:
    module = _ON_FIRST_USE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
