"""Taking a snapshot of a sandbox's paths and restoring one into a sandbox, through the archive
path every backend has (`ProviderBackend.open_archive`, `ProviderBackend.put_archive`): so a
snapshot taken on one backend restores on any other.

A snapshot of a sandbox that runs an exec helper (a container, a local jail) is one command: the
helper writes the tar in the snapshot's layout, which goes into the store as it arrives, and
answers each member's entry, hashed as it was written (`tarred.archive_by_helper`): the same
program, as the sandbox's user, whatever the backend, so a local jail's snapshot reaches its
``/tmp``, ``/proc`` and ``/sys`` as a container's does. Without one, where the service reads the
sandbox's files itself (`ProviderBackend.host_files`: a local sandbox with no jail) it is one pass,
the tar written into the store as the files are read, each hashed on the way (`Recorder`);
elsewhere the sandbox's own tar is spooled and kept (`keep`). Where the service writes the files
itself, a restore is one pass too: each member hashed as it is written (`Witness`), the whole
compared with the manifest at the end.
A restore into a sandbox that runs an exec helper is one command too, the helper extracting the
tar and answering each member's entry as it writes it (`untar.extract_by_helper`), compared as
`Witness`'s. Without a helper (no python3) a restore is verified twice. Before: the
snapshot's tars are read back against its manifest. After: the restored paths are archived again
from the sandbox and compared, entry by entry, with the manifest. Either way a truncated, edited
or forged snapshot is refused, naming the entries that differ, and the sandbox restored from it
is not handed out. Everything here blocks; the registry runs it in a worker thread.
"""

from __future__ import annotations

import os
import posixpath
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, cast

from sandboxes.base import BaseSandbox
from sandboxes.paths import is_within
from sandboxes.server.archive import checked_path
from sandboxes.server.backends import HostFiles, ProviderBackend
from sandboxes.server.errors import ServiceError
from sandboxes.server.manifest import FileEntry, Recorder, Witness, differences, keep, mismatch, survey, unexpected
from sandboxes.server.settings import ServiceSettings
from sandboxes.server.snapshots import Part, Snapshot, Writing
from sandboxes.server.streams import Emit
from sandboxes.server.tarred import archive_by_helper
from sandboxes.server.untar import extract_by_helper

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
        top, tar = _top(path), f"{index}.tar"
        found = _taken_by_helper(sandbox, path, writing.path(tar), left, settings)
        if found is not None:
            entries = found
        elif backend.host_files(sandbox):
            with open(writing.path(tar), "wb") as out:
                recorder = Recorder(top, max_members=settings.max_archive_members)
                backend.write_archive(sandbox, path, cast(IO[bytes], _Bounded(out, left)), recorder)
            entries = recorder.entries()
        else:
            entries = _kept(backend, sandbox, path, writing, index, left, settings)
        left -= os.path.getsize(writing.path(tar))
        if left < 0:
            raise _over_quota()
        writing.snapshot.parts.append(Part(path, workspace, tar, entries))


def _taken_by_helper(
    sandbox: BaseSandbox, path: str, tar: Path, left: int, settings: ServiceSettings
) -> list[FileEntry] | None:
    """The snapshot's tar of ``path`` made by the sandbox's exec helper into ``tar`` (bounded by
    ``left``), with its manifest; ``None``: the sandbox runs no helper, nothing was kept."""
    with open(tar, "wb") as out:
        bounded = cast(IO[bytes], _Bounded(out, left))
        found = archive_by_helper(sandbox, checked_path(path), bounded, max_members=settings.max_archive_members)
    if found is None:
        os.unlink(tar)
    return found


def _kept(
    backend: ProviderBackend,
    sandbox: BaseSandbox,
    path: str,
    writing: Writing,
    index: int,
    left: int,
    settings: ServiceSettings,
) -> list[FileEntry]:
    """The sandbox's tar of ``path``, spooled (bounded by ``left``), kept as the snapshot's."""
    raw_path = writing.path(f"raw-{index}")
    with open(raw_path, "w+b") as raw:
        _spool(backend.open_archive(sandbox, path), raw, left, quota=True)
        raw.seek(0)
        with open(writing.path(f"{index}.tar"), "wb") as out:
            entries = keep(raw, out, _top(path), max_members=settings.max_archive_members)
    os.unlink(raw_path)
    return entries


def restore(
    backend: ProviderBackend, sandbox: BaseSandbox, snapshot: Snapshot, workdir: str, settings: ServiceSettings
) -> None:
    """Put the snapshot's paths in ``sandbox`` (the workspace's in ``workdir``), verified."""
    if backend.host_files(sandbox) and _on_host(sandbox, snapshot, workdir):
        _restore_witnessed(backend, sandbox, snapshot, workdir)
        return
    if _restore_by_helper(sandbox, snapshot, workdir, settings):
        return
    _refuse_if_corrupt(snapshot)
    for part in snapshot.parts:
        with open(snapshot.directory / part.tar, "rb") as stored:
            backend.put_archive(sandbox, _target(part, workdir), stored)
    problems = []
    for part in snapshot.parts:
        problems += _verify(backend, sandbox, part, _target(part, workdir), snapshot.directory)
    if problems:
        raise mismatch(f"the sandbox restored from snapshot {snapshot.id} differs from it", problems)


def _on_host(sandbox: BaseSandbox, snapshot: Snapshot, workdir: str) -> bool:
    """Whether every part of ``snapshot`` goes into the root directory of a local sandbox, which
    the service writes itself; one elsewhere (a jail's ``/tmp``) is the jail's exec helper's."""
    root = str(cast(HostFiles, sandbox).root)
    return all(is_within(checked_path(_target(part, workdir)), root) for part in snapshot.parts)


def _restore_witnessed(backend: ProviderBackend, sandbox: BaseSandbox, snapshot: Snapshot, workdir: str) -> None:
    """Each part extracted, every member hashed as it is written, then compared with the
    manifest; a tar that cannot be extracted is refused as a mismatch if it differs from its
    manifest (truncated, forged), and its own error raised if not (no space left, say)."""
    problems = []
    for part in snapshot.parts:
        witness = Witness()
        try:
            with open(snapshot.directory / part.tar, "rb") as stored:
                backend.put_archive(sandbox, _target(part, workdir), stored, watch=witness)
        except ServiceError:
            _refuse_if_corrupt(snapshot)
            raise
        found = witness.found()
        problems += differences(part.entries, found) + unexpected(part.entries, found)
    if problems:
        raise mismatch(f"snapshot {snapshot.id} does not match its manifest; nothing was restored", problems)


def _restore_by_helper(sandbox: BaseSandbox, snapshot: Snapshot, workdir: str, settings: ServiceSettings) -> bool:
    """Each part extracted in the sandbox by its exec helper, which answers what it wrote, then
    compared with the manifest as `_restore_witnessed` compares; ``False``: the sandbox runs no
    helper, nothing was done."""
    problems = []
    for part in snapshot.parts:
        path = snapshot.directory / part.tar
        try:
            with open(path, "rb") as stored:
                found = extract_by_helper(
                    sandbox,
                    checked_path(_target(part, workdir)),
                    stored,
                    path.stat().st_size,
                    max_members=settings.max_archive_members,
                    max_bytes=settings.max_archive_bytes,
                )
        except ServiceError:
            _refuse_if_corrupt(snapshot)
            raise
        if found is None:
            return False
        problems += differences(part.entries, found) + unexpected(part.entries, found)
    if problems:
        raise mismatch(f"snapshot {snapshot.id} does not match its manifest; nothing was restored", problems)
    return True


def _refuse_if_corrupt(snapshot: Snapshot) -> None:
    """Refuse a snapshot whose tars, read back, differ from its manifest."""
    problems = []
    for part in snapshot.parts:
        with open(snapshot.directory / part.tar, "rb") as stored:
            found, stopped = survey(stored)
        problems += differences(part.entries, found) + unexpected(part.entries, found) + ([stopped] if stopped else [])
    if problems:
        raise mismatch(f"snapshot {snapshot.id} does not match its manifest; nothing was restored", problems)


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


class _Bounded:
    """A file written through, refused past ``limit`` bytes (what is left of the tenant's
    snapshot bytes) as they are written."""

    def __init__(self, out: IO[bytes], limit: int) -> None:
        self._out = out
        self._limit = limit
        self._written = 0

    def write(self, data: bytes) -> int:
        self._written += len(data)
        if self._written > self._limit:
            raise _over_quota()
        return self._out.write(data)

    def tell(self) -> int:
        return self._out.tell()


def _over_quota() -> ServiceError:
    return ServiceError("quota_exceeded", "the snapshot is larger than what is left of the tenant's snapshot bytes")
