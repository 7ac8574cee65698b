"""The manifest of a snapshot's tree: every entry's path, type, mode, size, sha256 and link
target, read from a tar as it passes, and what differs between two of them.

`keep` reads the tar a sandbox made of one path (``GET /archive``'s layout: the path's
basename at the top; hostile, as every byte a sandbox sends) and writes a tar of the same tree
relative to that path, the snapshot's own, with the manifest of what it wrote: hard links
become the files they name; a symbolic link that is absolute or climbs out of the tree, a
device or a FIFO, cannot be restored through an archive, and are refused by name. `survey` reads
a tar of either layout back into a manifest without trusting it: a truncated or corrupt one
gives what could be read, and the reason it stopped. Where the service makes or extracts the tar
itself, the manifest is read in that same pass: `Recorder` as it writes the snapshot's tar (as
`keep` would rewrite it), `Witness` as it extracts one.
"""

from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Literal, cast

from sandboxes.server.archive import member_parts
from sandboxes.server.errors import ServiceError

__all__ = ["FileEntry", "Recorder", "Witness", "differences", "keep", "mismatch", "printable", "survey", "unexpected"]

Kind = Literal["file", "dir", "symlink"]
_COPY = 1 << 20
_SHOWN = 20
"""Differences named in an error's message, at most."""


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One entry of a tree: ``path`` relative to the tree's top (``/``-separated)."""

    path: str
    type: Kind
    mode: int
    size: int = 0
    sha256: str = ""
    link: str = ""

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ("path", "type", "mode", "size", "sha256", "link")}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileEntry:
        return cls(data["path"], data["type"], data["mode"], data["size"], data["sha256"], data["link"])


class _Hashing:
    """A reader that hashes and counts what is read through it."""

    def __init__(self, inner: IO[bytes]) -> None:
        self.inner = inner
        self.digest = hashlib.sha256()
        self.size = 0

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        self.digest.update(data)
        self.size += len(data)
        return data


def keep(raw: IO[bytes], out: IO[bytes], top: str, *, max_members: int) -> list[FileEntry]:
    """Copy the tree under ``top`` of the sandbox's tar ``raw`` (seekable) to ``out`` (a file,
    written as it is, not streamed in records) as a tar relative to it; the manifest of what was
    written."""
    entries: list[FileEntry] = []
    refused: list[str] = []
    try:
        with (
            tarfile.open(fileobj=raw, mode="r:", errors="surrogateescape") as tar,
            tarfile.TarFile(
                fileobj=out, mode="w", format=tarfile.PAX_FORMAT, errors="surrogateescape", copybufsize=_COPY
            ) as written,
        ):
            for count, member in enumerate(tar, 1):
                if count > max_members:
                    raise ServiceError("too_large", f"the snapshot would have more than {max_members} entries")
                path = _relative(member.name, top)
                if path is None:
                    continue
                entry = _copy(tar, written, member, path, refused)
                if entry is not None:
                    entries.append(entry)
    except tarfile.TarError as exc:
        raise ServiceError("backend_unavailable", f"the sandbox's archive of {top} is not a readable tar") from exc
    _refuse(refused)
    return entries


def _refuse(refused: list[str]) -> None:
    if refused:
        raise ServiceError("invalid_request", "cannot snapshot what an archive cannot restore: " + _listed(refused))


class Recorder:
    """A `sandboxes.server.archive.Transform` that makes the service's own tar of a sandbox's
    path the snapshot's (as `keep` does with a tar the sandbox made), in the same pass: members
    renamed relative to ``top``, counted, refused as `keep` refuses them, and every file hashed
    as it is read."""

    def __init__(self, top: str, *, max_members: int) -> None:
        self.top = top
        self.max_members = max_members
        self.count = 0
        self.refused: list[str] = []
        self._kept: list[tuple[FileEntry, _Hashing | None]] = []

    def __call__(
        self, member: tarfile.TarInfo, content: IO[bytes] | None
    ) -> tuple[tarfile.TarInfo, IO[bytes] | None] | None:
        self.count += 1
        if self.count > self.max_members:
            raise ServiceError("too_large", f"the snapshot would have more than {self.max_members} entries")
        path = _relative(member.name, self.top)
        if path is None:
            return None
        member.name, member.mode = path, member.mode & 0o7777
        if member.issym() and (member.linkname.startswith("/") or not _inside(path, member.linkname)):
            self.refused.append(f"{printable(path)} (a symbolic link out of the tree: {printable(member.linkname)})")
            return None
        hashing = None if content is None else _Hashing(content)
        self._kept.append((_entry_of(member, path), hashing))
        return member, cast("IO[bytes] | None", hashing)

    def entries(self) -> list[FileEntry]:
        """The manifest of what was written; refused if a member could not be kept."""
        _refuse(self.refused)
        return [_hashed(entry, hashing) for entry, hashing in self._kept]


class Witness:
    """A `sandboxes.server.archive.Watch` that reads, as they are extracted, the manifest of
    the members of a snapshot's tar: every file hashed as it is written."""

    def __init__(self) -> None:
        self._seen: list[tuple[FileEntry, _Hashing | None]] = []

    def __call__(self, member: tarfile.TarInfo, names: list[str], content: IO[bytes] | None) -> IO[bytes] | None:
        hashing = None if content is None else _Hashing(content)
        self._seen.append((_entry_of(member, "/".join(names)), hashing))
        return cast("IO[bytes] | None", hashing)

    def found(self) -> list[FileEntry]:
        return [_hashed(entry, hashing) for entry, hashing in self._seen]


def _entry_of(member: tarfile.TarInfo, path: str) -> FileEntry:
    """``member``'s entry, its content's size and digest still to come (`_hashed`)."""
    if member.isdir():
        return FileEntry(path, "dir", member.mode & 0o7777)
    if member.issym():
        return FileEntry(path, "symlink", 0o777, link=member.linkname)
    return FileEntry(path, "file", member.mode & 0o7777)


def _hashed(entry: FileEntry, hashing: _Hashing | None) -> FileEntry:
    if hashing is None:
        return entry
    return FileEntry(entry.path, entry.type, entry.mode, hashing.size, hashing.digest.hexdigest())


def _relative(name: str, top: str) -> str | None:
    """``name`` below ``top``; ``None`` for the top itself; refused if elsewhere."""
    parts = member_parts(name)
    if parts[:1] != [top]:
        raise ServiceError("backend_unavailable", f"the sandbox's archive holds {printable(name)!r}, outside {top}")
    return "/".join(parts[1:]) or None


def _copy(
    tar: tarfile.TarFile, written: tarfile.TarFile, member: tarfile.TarInfo, path: str, refused: list[str]
) -> FileEntry | None:
    mode = member.mode & 0o7777
    info = tarfile.TarInfo(path)
    info.mode, info.mtime = mode, member.mtime
    if member.isdir():
        info.type = tarfile.DIRTYPE
        written.addfile(info)
        return FileEntry(path, "dir", mode)
    if member.issym():
        if member.linkname.startswith("/") or not _inside(path, member.linkname):
            refused.append(f"{printable(path)} (a symbolic link out of the tree: {printable(member.linkname)})")
            return None
        info.type, info.linkname = tarfile.SYMTYPE, member.linkname
        written.addfile(info)
        return FileEntry(path, "symlink", 0o777, link=member.linkname)
    if member.isreg() or member.islnk():  # a hard link: the file it names, again
        content = tar.extractfile(member)
        if content is None:
            refused.append(f"{printable(path)} (unreadable)")
            return None
        hashing = _Hashing(content)
        info.size = member.size if member.isreg() else tar.getmember(member.linkname).size
        written.addfile(info, hashing)
        return FileEntry(path, "file", mode, hashing.size, hashing.digest.hexdigest())
    refused.append(f"{printable(path)} (a device or FIFO)")
    return None


def _inside(path: str, target: str) -> bool:
    """Whether a link at ``path`` to ``target`` (relative) stays in the tree."""
    depth = path.count("/")
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        elif part not in ("", "."):
            depth += 1
    return True


def survey(archive: IO[bytes], top: str | None = None) -> tuple[list[FileEntry], str | None]:
    """The manifest of a tar read as a stream (``top``: the sandbox's layout, whose entries are
    made relative to it); with the reason it could not be read to its end, if so."""
    entries: list[FileEntry] = []
    try:
        with _reading(archive) as tar:
            for member in tar:
                entry = _surveyed(tar, member, top)
                if entry is not None:
                    entries.append(entry)
    except (tarfile.TarError, EOFError, OSError) as exc:
        return entries, f"the tar stops short ({exc})"
    except ServiceError as exc:
        return entries, exc.message
    return entries, None


def _reading(archive: IO[bytes]) -> tarfile.TarFile:
    """A file read in place where it can be, not through a stream's 10 KiB records."""
    if archive.seekable():
        return tarfile.open(fileobj=archive, mode="r:", errors="surrogateescape")
    return tarfile.open(fileobj=archive, mode="r|", errors="surrogateescape")


def _surveyed(tar: tarfile.TarFile, member: tarfile.TarInfo, top: str | None) -> FileEntry | None:
    path = member.name.strip("/") if top is None else _relative(member.name, top)
    if not path:
        return None
    mode = member.mode & 0o7777
    if member.isdir():
        return FileEntry(path, "dir", mode)
    if member.issym():
        return FileEntry(path, "symlink", 0o777, link=member.linkname)
    content = tar.extractfile(member)
    if content is None:
        return None
    hashing = _Hashing(content)
    while hashing.read(_COPY):
        pass
    if hashing.size != member.size:
        raise tarfile.ReadError(f"{printable(path)} is cut short")
    return FileEntry(path, "file", mode, hashing.size, hashing.digest.hexdigest())


def differences(expected: Iterable[FileEntry], found: Iterable[FileEntry], *, restored: bool = False) -> list[str]:
    """What of ``expected`` is not in ``found`` as it should be, one line each; ``restored``:
    ``found`` was extracted by the service, which gives directories their owner's ``rwx`` and
    a file of no mode ``0644``, as every archive upload does."""
    have = {entry.path: entry for entry in found}
    problems = []
    for want in expected:
        got = have.get(want.path)
        if got is None:
            problems.append(f"{printable(want.path)}: missing")
            continue
        changed = [name for name, ok in _compared(want, got, restored) if not ok]
        if changed:
            problems.append(f"{printable(want.path)}: {', '.join(changed)} differ")
    return problems


def unexpected(expected: Iterable[FileEntry], found: Iterable[FileEntry]) -> list[str]:
    """What of ``found`` (a snapshot's tar) its manifest ``expected`` does not name, one line each."""
    named = {entry.path for entry in expected}
    return [f"{printable(entry.path)}: not in the manifest" for entry in found if entry.path not in named]


def _compared(want: FileEntry, got: FileEntry, restored: bool) -> Iterator[tuple[str, bool]]:
    yield "type", want.type == got.type
    if want.type == "symlink":
        yield "link target", want.link == got.link
        return
    mode = want.mode
    if restored:
        mode = (mode & 0o777) | 0o700 if want.type == "dir" else (mode & 0o777) or 0o644
    yield "mode", mode == got.mode
    if want.type == "file":
        yield "size", want.size == got.size
        yield "sha256", want.sha256 == got.sha256


def printable(name: str) -> str:
    """A name as text that can be shown: bytes that are not UTF-8 as ``\\xNN``."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _listed(items: list[str]) -> str:
    shown = "; ".join(items[:_SHOWN])
    return shown if len(items) <= _SHOWN else f"{shown}; and {len(items) - _SHOWN} more"


def mismatch(what: str, problems: list[str]) -> ServiceError:
    """The refusal of a snapshot or a restore that differs from its manifest, naming what."""
    return ServiceError("snapshot_mismatch", f"{what}: {len(problems)} entries differ: {_listed(problems)}")
