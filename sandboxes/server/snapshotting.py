"""Taking a snapshot of a sandbox's paths and restoring one into a sandbox, through the archive
path every backend has (`ProviderBackend.open_archive`, `ProviderBackend.put_archive`): so a
snapshot taken on one backend restores on any other.

A restore is verified twice. Before: the snapshot's tars are read back against its manifest
(a truncated or edited snapshot is refused, naming the entries). After: the restored paths are
archived again from the sandbox and compared, entry by entry, with the manifest; any difference
refuses the restore, naming what differs. Everything here blocks; the registry runs it in a
worker thread.
"""

from __future__ import annotations

import os
import posixpath
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from sandboxes.base import BaseSandbox
from sandboxes.server.archive import checked_path
from sandboxes.server.backends import ProviderBackend
from sandboxes.server.errors import ServiceError
from sandboxes.server.manifest import differences, keep, mismatch, survey
from sandboxes.server.settings import ServiceSettings
from sandboxes.server.snapshots import Part, Snapshot, Writing
from sandboxes.server.streams import Emit

__all__ = ["restore", "take"]

_SLACK = 1 << 20
"""Bytes a restored tree's archive may be beyond its snapshot's (headers of another tar)."""


def take(
    backend: ProviderBackend,
    sandbox: BaseSandbox,
    writing: Writing,
    paths: list[tuple[str, bool]],
    settings: ServiceSettings,
) -> None:
    """Keep each of ``paths`` (path, whether it is the workspace) in ``writing``'s directory."""
    left = writing.bound
    for index, (path, workspace) in enumerate(paths):
        top = _top(path)
        raw_path, tar = writing.path(f"raw-{index}"), f"{index}.tar"
        with open(raw_path, "w+b") as raw:
            _spool(backend.open_archive(sandbox, path), raw, left, quota=True)
            raw.seek(0)
            with open(writing.path(tar), "wb") as out:
                entries = keep(raw, out, top, max_members=settings.max_archive_members)
        os.unlink(raw_path)
        left -= os.path.getsize(writing.path(tar))
        if left < 0:
            raise _over_quota()
        writing.snapshot.parts.append(Part(path, workspace, tar, entries))


def restore(
    backend: ProviderBackend, sandbox: BaseSandbox, snapshot: Snapshot, workdir: str, settings: ServiceSettings
) -> None:
    """Put the snapshot's paths in ``sandbox`` (the workspace's in ``workdir``), verified."""
    problems = []
    for part in snapshot.parts:
        with open(snapshot.directory / part.tar, "rb") as stored:
            found, stopped = survey(stored)
        problems += differences(part.entries, found) + ([stopped] if stopped else [])
    if problems:
        raise mismatch(f"snapshot {snapshot.id} does not match its manifest; nothing was restored", problems)
    for part in snapshot.parts:
        with open(snapshot.directory / part.tar, "rb") as stored:
            backend.put_archive(sandbox, _target(part, workdir), stored)
    for part in snapshot.parts:
        problems += _verify(backend, sandbox, part, _target(part, workdir), snapshot.directory)
    if problems:
        raise mismatch(f"the sandbox restored from snapshot {snapshot.id} differs from it", problems)


def _verify(backend: ProviderBackend, sandbox: BaseSandbox, part: Part, target: str, scratch: Path) -> list[str]:
    """What of ``part`` the sandbox's ``target`` does not hold as the manifest says."""
    bound = (scratch / part.tar).stat().st_size * 2 + _SLACK
    with tempfile.TemporaryFile(dir=scratch.parent) as spooled:
        _spool(backend.open_archive(sandbox, target), spooled, bound, quota=False)
        spooled.seek(0)
        found, stopped = survey(spooled, _top(target))
    return differences(part.entries, found, restored=True) + ([stopped] if stopped else [])


def _target(part: Part, workdir: str) -> str:
    return workdir if part.workspace else part.path


def _top(path: str) -> str:
    checked = checked_path(path)
    if checked == "/":
        raise ServiceError("permission_denied", "a snapshot keeps a directory or a file, not the whole of /")
    return posixpath.basename(checked)


def _spool(produce: Callable[[Emit], None], out: IO[bytes], limit: int, *, quota: bool) -> None:
    """The producer's tar into ``out``, refused past ``limit`` bytes (the tenant's snapshot
    quota, or what a restored tree may be)."""
    written = 0

    def emit(chunk: bytes) -> None:
        nonlocal written
        written += len(chunk)
        if written > limit:
            raise _over_quota() if quota else ServiceError("too_large", "the restored tree is larger than its snapshot")
        out.write(chunk)

    produce(emit)


def _over_quota() -> ServiceError:
    return ServiceError("quota_exceeded", "the snapshot is larger than what is left of the tenant's snapshot bytes")
