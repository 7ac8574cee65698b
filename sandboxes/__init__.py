"""Self-hosted sandboxes for LLM agents: one backend protocol over local, Docker, SSH and Kubernetes sandboxes.

The public API is importable from here (``from sandboxes import DockerSandbox``), but each name
is imported on first use (PEP 562 ``__getattr__``): ``import sandboxes`` stays cheap and pulls in
neither docker, paramiko, kubernetes nor fastapi, so a client or a tool that needs one backend does not pay
for, or need installed, the drivers of the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandboxes.base import BaseSandbox, StreamingSandbox
    from sandboxes.composite import CompositeBackend, CompositeSandbox
    from sandboxes.docker import DockerSandbox, DockerSandboxConfig
    from sandboxes.filesystem import FilesystemBackend, FilesystemBackendConfig
    from sandboxes.kubernetes import KubernetesSandbox, KubernetesSandboxConfig
    from sandboxes.lifecycle import Lifecycle
    from sandboxes.local import LocalSandbox, LocalSandboxConfig
    from sandboxes.protocol import (
        BackendProtocol,
        DeleteResult,
        EditResult,
        ErrorCode,
        ExecuteResponse,
        FileData,
        FileDownloadResponse,
        FileInfo,
        FileUploadResponse,
        GlobResult,
        GrepMatch,
        GrepResult,
        LsResult,
        NotIsolatedWarning,
        ReadResult,
        SandboxBackendProtocol,
        WriteResult,
    )
    from sandboxes.ssh import SSHSandbox, SSHSandboxConfig
    from sandboxes.state import StateBackend

_PROTOCOL = (
    "BackendProtocol",
    "SandboxBackendProtocol",
    "ErrorCode",
    "FileInfo",
    "FileData",
    "GrepMatch",
    "LsResult",
    "ReadResult",
    "WriteResult",
    "EditResult",
    "DeleteResult",
    "GrepResult",
    "GlobResult",
    "FileUploadResponse",
    "FileDownloadResponse",
    "ExecuteResponse",
    "NotIsolatedWarning",
)

_HOME: dict[str, str] = {
    **dict.fromkeys(_PROTOCOL, "sandboxes.protocol"),
    "BaseSandbox": "sandboxes.base",
    "StreamingSandbox": "sandboxes.base",
    "Lifecycle": "sandboxes.lifecycle",
    "LocalSandbox": "sandboxes.local",
    "LocalSandboxConfig": "sandboxes.local",
    "DockerSandbox": "sandboxes.docker",
    "DockerSandboxConfig": "sandboxes.docker",
    "SSHSandbox": "sandboxes.ssh",
    "SSHSandboxConfig": "sandboxes.ssh",
    "KubernetesSandbox": "sandboxes.kubernetes",
    "KubernetesSandboxConfig": "sandboxes.kubernetes",
    "FilesystemBackend": "sandboxes.filesystem",
    "FilesystemBackendConfig": "sandboxes.filesystem",
    "StateBackend": "sandboxes.state",
    "CompositeBackend": "sandboxes.composite",
    "CompositeSandbox": "sandboxes.composite",
}
"""Where each public name lives: the module imported the first time the name is asked for."""

__all__ = [
    "BackendProtocol",
    "BaseSandbox",
    "CompositeBackend",
    "CompositeSandbox",
    "DeleteResult",
    "DockerSandbox",
    "DockerSandboxConfig",
    "EditResult",
    "ErrorCode",
    "ExecuteResponse",
    "FileData",
    "FileDownloadResponse",
    "FileInfo",
    "FileUploadResponse",
    "FilesystemBackend",
    "FilesystemBackendConfig",
    "GlobResult",
    "GrepMatch",
    "GrepResult",
    "KubernetesSandbox",
    "KubernetesSandboxConfig",
    "Lifecycle",
    "LocalSandbox",
    "LocalSandboxConfig",
    "LsResult",
    "NotIsolatedWarning",
    "ReadResult",
    "SSHSandbox",
    "SSHSandboxConfig",
    "SandboxBackendProtocol",
    "StateBackend",
    "StreamingSandbox",
    "WriteResult",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use, then keep the name here for the next time."""
    if name == "__version__":  # importlib.metadata (with zipfile, email, csv) only when asked
        globals()[name] = value = _version()
        return value
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def _version() -> str:
    """The installed distribution's version; ``0+unknown`` in a source tree never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sandboxes")
    except PackageNotFoundError:
        return "0+unknown"


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
