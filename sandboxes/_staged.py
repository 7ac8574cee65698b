"""Big files into a sandbox as the sandbox's own user, through its ``execute``, in bounded chunks.

Shared by `DockerSandbox`'s bulk uploads and the service's archive extraction
(`sandboxes.server.extract`). The Docker engine's archive API would be faster to call, but it
writes as root from outside the container and resolves the container's symlinks itself: a
directory the sandbox swaps for a link to ``/etc`` between a check and the transfer led it into
the read-only root (and onto the engine's disk, past the workspace's size limit). Written by the
sandbox's user, every chunk is checked by the kernel, so a link leads nowhere that user could
not write anyway.

The bytes go to a staged name beside the target (`sandboxes.base.staging_name`), appended
`CHUNK_BYTES` at a time (`_scripts.STAGE_CHUNK`): memory stays bounded on both sides whatever
the file's size, and the caller renames the staged file over its target only once every byte
arrived (`_scripts.COMMIT_STAGED`), so a transfer cut halfway leaves the target as it was.
"""

from __future__ import annotations

import contextlib
from typing import IO

from sandboxes import _parse, _scripts
from sandboxes import protocol as p

__all__ = ["CHUNK_BYTES", "TIMEOUT", "remove_staged", "stage_file"]

CHUNK_BYTES = 4 << 20
"""Bytes of a file per command: bounded memory here and in the sandbox's exec helper (which
queues a command's stdin), few round trips per file."""

TIMEOUT = 300.0
"""Seconds one chunk may take to be written."""


def stage_file(sandbox: p.SandboxBackendProtocol, staged: str, content: IO[bytes], size: int) -> p.ErrorCode | None:
    """Write ``size`` bytes read from ``content`` to the new file ``staged``, as the sandbox's
    user; the file-level error that stopped it, ``None`` once all are there.

    Raises `_parse.ScriptFailed` when the sandbox could not answer (timeout, lost helper) and
    `EOFError` when ``content`` ends early; the staged file is removed whenever it fails."""
    first, sent = True, 0
    try:
        while first or sent < size:
            chunk = content.read(min(CHUNK_BYTES, size - sent))
            if not chunk and sent < size:
                raise EOFError(f"{size - sent} of {size} bytes missing")
            command = _scripts.command(_scripts.STAGE_CHUNK, staged, "new" if first else "more")
            code = _parse.check(sandbox.execute(command, stdin=chunk, timeout=TIMEOUT), staged)
            if code is not None:
                remove_staged(sandbox, staged)
                return code
            sent += len(chunk)
            first = False
    except BaseException:
        remove_staged(sandbox, staged)
        raise
    return None


def remove_staged(sandbox: p.SandboxBackendProtocol, staged: str) -> None:
    """The staged file gone, as far as the sandbox still answers (a failed transfer's cleanup)."""
    with contextlib.suppress(Exception):
        sandbox.execute(_scripts.command('rm -f -- "$1"', staged), timeout=TIMEOUT)
