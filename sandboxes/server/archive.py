"""Tar streams in and out of sandboxes.

Layout, for every backend (Docker's ``docker cp`` convention): ``GET ?path=P`` answers a tar
whose single top-level member is P's basename (a file, or a directory with its tree);
``PUT ?path=D`` extracts a tar's members under directory D, creating D if needed.

Local sandboxes' root directories are read and written by the service itself, on the host,
while the sandbox may be running commands that swap directories for symlinks. So every path is
opened one component at a time relative to a directory file descriptor with ``O_NOFOLLOW``,
starting from the sandbox's root, and trees are walked through descriptors (both
`sandboxes._beneath`, shared with `sandboxes.filesystem`): no symlink, however placed or raced,
leads the service outside the root. A file's member is exactly the bytes read of it, by the rule
of the program a container's tar is made by: a snapshot's as `sandboxes._helper._tar`'s
(`snapshot_content`), ``GET /archive``'s as `sandboxes._helper._archive`'s. What a jail holds
outside its root (its ``/proc``, ``/sys``, ``/tmp``) is the jail's exec helper's to archive
(`read_on_host`), as a container's is.
Docker archives go through the daemon, which confines them to the container; they are rewritten
on the way in (owner set to the sandbox user, special bits dropped, only regular files,
directories and symlinks) and spooled to a temporary file, never to memory.

Every archive coming in is hostile until read (`_members`): at most ``max_members`` members;
no absolute or ``..`` names; no symlink whose target is absolute or climbs out of the
destination, and no member reached through a symlink the archive made earlier (Docker
extracts as root and follows such links into the read-only root); and what it expands to is
bounded twice: in total (``max_bytes``) and beyond the bytes that really arrived
(``max_expansion``), which is what a sparse member's holes or a compressed stream of zeros
cost the service host's disk while spooled. Sparse members are written out as the regular
files they stand for. An archive that is a file on disk (a snapshot's) is read in place, all of
it counted as arrived; any other as the stream it is.
"""

from __future__ import annotations

import contextlib
import errno
import io
import lzma
import os
import secrets
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterator
from typing import IO, Any, NamedTuple, cast

from sandboxes import _beneath as beneath
from sandboxes._helper import _archive, _tar
from sandboxes._mux import HoldsHelper
from sandboxes.api import WireErrorCode
from sandboxes.paths import InvalidPathError, is_within, normalize_path, relative_to
from sandboxes.server.errors import ServiceError
from sandboxes.server.streams import ChunkSink, Emit

_SPOOL_IN_MEMORY = 8 << 20
MAX_MEMBERS = 100_000
"""Default ceiling on an archive's members: each costs a header's parse and an inode."""
MAX_EXPANSION = 256 << 20
"""Default ceiling on the bytes an archive may expand to beyond the bytes it is made of."""
_COPY = 1 << 20


def checked_path(raw: str) -> str:
    try:
        return normalize_path(raw)
    except InvalidPathError as exc:
        raise ServiceError("invalid_path", str(exc)) from exc


_REFUSALS: dict[beneath.Reason, tuple[WireErrorCode, str]] = {
    "symlink": ("invalid_path", "goes through a symbolic link"),
    "not_a_directory": ("not_a_directory", "a component is not a directory"),
    "is_a_directory": ("is_directory", "is a directory"),
    "not_found": ("file_not_found", "no such file or directory"),
    "not_regular": ("invalid_path", "neither a file nor a directory"),
    "invalid_name": ("invalid_path", "a component is not a plain name"),
}
"""The walker's refusals in the service's vocabulary."""


def _os_error(exc: OSError | beneath.Refused, path: str) -> ServiceError:
    if isinstance(exc, beneath.Refused):
        code, text = _REFUSALS[exc.reason]
        return ServiceError(code, f"{path}: {text}")
    if exc.errno == errno.ENOENT:
        return ServiceError("file_not_found", f"{path}: no such file or directory")
    if exc.errno == errno.ENOTDIR:
        return ServiceError("not_a_directory", f"{path}: a component is not a directory")
    if exc.errno in beneath.SYMLINK_ERRNOS:
        return ServiceError("invalid_path", f"{path}: goes through a symbolic link")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return ServiceError("permission_denied", f"{path}: permission denied")
    if exc.errno == errno.ENOSPC:
        return ServiceError("no_space", f"{path}: no space left")
    return ServiceError("invalid_request", f"{path}: {exc.strerror or 'cannot be written'}")


def member_parts(name: str) -> list[str]:
    """The components of a member name, refusing absolute names and ``..``."""
    if name.startswith("/") or "\x00" in name:
        raise ServiceError("invalid_path", f"archive member {name!r} is absolute")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise ServiceError("invalid_path", f"archive member {name!r} contains '..'")
    return parts


def on_pseudo_filesystem(path: str) -> bool:
    """Whether ``path`` is in ``/proc`` or ``/sys``, whose files' sizes are not what a read gives."""
    return any(path == top or path.startswith(top + "/") for top in ("/proc", "/sys"))


# ---------------------------------------------------------------------- local: fd-relative I/O


def read_on_host(sandbox: object, root: str, raw_path: str) -> bool:
    """Whether the service reads a local sandbox's ``raw_path`` itself (`open_local_archive`):
    one in its root directory; any, if it runs no exec helper (no jail: one outside the root is
    refused there). Elsewhere (a jail's ``/proc``, ``/sys``, ``/tmp``, which the host does not
    see as the jail does) its exec helper makes the tar in the jail, as a container's is made."""
    if is_within(checked_path(raw_path), root):
        return True
    return not isinstance(sandbox, HoldsHelper) or sandbox.exec_helper() is None


def _parts_under(root: str, path: str) -> list[str]:
    if not is_within(path, root):
        raise ServiceError("invalid_path", f"{path} is outside the sandbox's root {root}")
    return [] if path == root else relative_to(path, root).split("/")


def _open_beneath(root: str, parts: list[str], *, create: bool = False) -> int:
    """A directory fd for ``root/parts``, never following a symlink; ``create`` makes missing
    directories on the way (``mkdir -p``)."""
    root_fd = os.open(root, beneath.DIR_FLAGS)
    try:
        return beneath.open_dir(root_fd, parts, create=create, mode=0o755)
    finally:
        os.close(root_fd)


Transform = Callable[[tarfile.TarInfo, IO[bytes] | None], "tuple[tarfile.TarInfo, IO[bytes] | None] | None"]
"""What a member becomes on its way into a tar (renamed, its content read through a hash), or
``None``: left out."""

Watch = Callable[[tarfile.TarInfo, list[str], IO[bytes] | None], IO[bytes] | None]
"""Sees each member extracted (its name's components) and gives the content to write, which it
may read through (a hash)."""


def _open_top(root: str, raw_path: str) -> tuple[str, int, os.stat_result]:
    """The checked path's basename, an fd of it (a file or a directory) and its stat."""
    path = checked_path(raw_path)
    parts = _parts_under(root, path)
    try:
        if parts:
            name, parent_fd = parts[-1], _open_beneath(root, parts[:-1])
            try:  # a file or a directory; anything else is refused unopened
                fd, info = beneath.open_file(parent_fd, name, os.O_RDONLY, directories=True)
            finally:
                os.close(parent_fd)
        else:
            name, fd = os.path.basename(root), os.open(root, beneath.DIR_FLAGS)
            info = os.fstat(fd)
    except (OSError, beneath.Refused) as exc:
        raise _os_error(exc, path) from exc
    return name, fd, info


def open_local_archive(root: str, raw_path: str, *, uid: int, gid: int, limit: int) -> Callable[[Emit], None]:
    """Check ``raw_path`` now (so a bad one is an HTTP error, not a broken stream) and return
    the producer that streams its tar: each file's member as a container's
    (`sandboxes._helper._archive.content`), none over ``limit`` bytes."""
    name, fd, info = _open_top(root, raw_path)

    def produce(emit: Emit) -> None:
        sink = ChunkSink(emit)
        try:
            with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                _add_top(tar, fd, name, info, _Owner(uid, gid, None, _as_archived(limit)))
            sink.flush_all()
        finally:
            os.close(fd)

    return produce


def write_local_archive(root: str, raw_path: str, out: IO[bytes], *, uid: int, gid: int, transform: Transform) -> None:
    """The tar of ``raw_path`` (``GET /archive``'s layout) written into ``out`` (a file: written
    as it is, not streamed in records), every member through ``transform`` on its way, each
    file's member as a snapshot's made in a sandbox (`snapshot_content`)."""
    name, fd, info = _open_top(root, raw_path)
    try:
        with tarfile.TarFile(fileobj=out, mode="w", format=tarfile.PAX_FORMAT, copybufsize=_COPY) as tar:
            _add_top(tar, fd, name, info, _Owner(uid, gid, transform, snapshot_content))
    finally:
        os.close(fd)


Content = Callable[[int, int, str], "tuple[int, IO[bytes]]"]
"""A regular file's member, from its descriptor, the size its ``fstat`` said and its path: (the
member's size, a reader of exactly that many bytes)."""


def snapshot_content(fd: int, said: int, path: str) -> tuple[int, IO[bytes]]:
    """A file's member as `sandboxes._helper._tar` makes a snapshot's in a sandbox: exactly the
    bytes read, whatever its size said; a file that ends within `_tar.HELD` bytes read whole
    first, a longer one streamed at its size (kept as first seen if it grew); one whose size
    says no more than what is held but reads past it, or that ends before its size,
    `ServiceError` ``file_changed``."""
    head = _tar.head(fd, said)
    if len(head) <= _tar.HELD:
        return len(head), io.BytesIO(head)
    if said <= _tar.HELD:
        raise _changed(path, f"its size said {said} bytes, a read gave more than {_tar.HELD}")
    return said, io.BufferedReader(_Streamed(fd, head, said, path), _COPY)


def _changed(path: str, message: str) -> ServiceError:
    return ServiceError("file_changed", f"{path}: {message}; the snapshot would not be what the file holds")


class _Streamed(io.RawIOBase):
    """``said`` bytes of a file: ``head``, then the rest as it is read; one that ends before
    them changed while it was read (`ServiceError` ``file_changed``, never padding)."""

    def __init__(self, fd: int, head: bytes, said: int, path: str) -> None:
        self._fd, self._head, self._said, self._path = fd, memoryview(head), said, path
        self._left = said

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        wanted = min(len(target), self._left)
        if self._head:
            chunk: bytes | memoryview = self._head[:wanted]
            self._head = self._head[len(chunk) :]
        else:
            chunk = _tar.read(self._fd, wanted) if wanted else b""
        if wanted and not chunk:
            done = self._said - self._left
            raise _changed(self._path, f"it shrank while it was read: {done} of the {self._said} bytes its size said")
        target[: len(chunk)] = chunk
        self._left -= len(chunk)
        return len(chunk)


def _as_archived(limit: int) -> Content:
    """A file's member as a container's ``GET /archive`` makes it (`_archive.content`); one
    counted past ``limit`` bytes, ``too_large``."""

    def content(fd: int, said: int, path: str) -> tuple[int, IO[bytes]]:
        try:
            size, reader = _archive.content(fd, said, limit)
        except _archive.TooLarge as exc:
            raise ServiceError("too_large", f"{path}: a file over {limit} bytes") from exc
        return size, cast(IO[bytes], reader)

    return content


class _Owner(NamedTuple):
    """Who the members belong to, what each becomes (`Transform`) on its way in, and what a
    file's member holds (`Content`)."""

    uid: int
    gid: int
    transform: Transform | None
    content: Content

    def add(self, tar: tarfile.TarFile, member: tarfile.TarInfo, content: IO[bytes] | None = None) -> None:
        if self.transform is not None:
            kept = self.transform(member, content)
            if kept is None:
                return
            member, content = kept
        tar.addfile(member, content)


def _add_top(tar: tarfile.TarFile, fd: int, name: str, info: os.stat_result, owner: _Owner) -> None:
    top = _tar_info(name, info, owner.uid, owner.gid)
    if stat.S_ISREG(info.st_mode):
        _add_file(tar, fd, top, owner)
    else:
        owner.add(tar, top)
        _add_tree(tar, fd, name, owner)


def _tar_info(name: str, info: os.stat_result, uid: int, gid: int, link: str = "") -> tarfile.TarInfo:
    entry = tarfile.TarInfo(name)
    entry.mode = info.st_mode & 0o777
    entry.mtime = int(info.st_mtime)
    entry.uid, entry.gid = uid, gid
    if stat.S_ISDIR(info.st_mode):
        entry.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(info.st_mode):
        entry.type, entry.linkname = tarfile.SYMTYPE, link
    else:
        entry.size = info.st_size
    return entry


def _add_file(tar: tarfile.TarFile, fd: int, member: tarfile.TarInfo, owner: _Owner) -> None:
    """The regular file ``fd``'s member: as long as `_Owner.content` says, never what its size
    said unread."""
    member.size, content = owner.content(fd, member.size, member.name)
    owner.add(tar, member, content)


def _add_tree(tar: tarfile.TarFile, top_fd: int, top_name: str, owner: _Owner) -> None:
    """Everything below ``top_fd`` as members under ``top_name``; unreadable directories come
    out empty, as under ``find``, and entries removed or swapped meanwhile are simply absent. A
    directory moved elsewhere mid-walk ends the stream with an error (``ESTALE``) rather than
    archive whatever its new parent holds."""
    with contextlib.closing(beneath.walk(top_fd)) as entries:
        for dir_fd, name, relpath, kind in entries:
            if kind != "leave":
                with contextlib.suppress(FileNotFoundError):
                    _add_entry(tar, dir_fd, name, f"{top_name}/{relpath}", kind, owner)


def _add_entry(tar: tarfile.TarFile, dir_fd: int, name: str, arcname: str, kind: beneath.Kind, owner: _Owner) -> None:
    if kind == "file":
        try:
            fd, opened = beneath.open_file(dir_fd, name, os.O_RDONLY)
        except beneath.Refused:  # swapped for a symlink or something else meanwhile: not ours to follow
            return
        try:
            _add_file(tar, fd, _tar_info(arcname, opened, owner.uid, owner.gid), owner)
        finally:
            os.close(fd)
        return
    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISDIR(info.st_mode):
        owner.add(tar, _tar_info(arcname, info, owner.uid, owner.gid))
    elif stat.S_ISLNK(info.st_mode):
        owner.add(tar, _tar_info(arcname, info, owner.uid, owner.gid, os.readlink(name, dir_fd=dir_fd)))
    # sockets, fifos and devices are skipped: they have no content to archive


def extract_local(
    root: str,
    raw_dest: str,
    archive: IO[bytes],
    *,
    max_bytes: int,
    max_members: int = MAX_MEMBERS,
    max_expansion: int = MAX_EXPANSION,
    watch: Watch | None = None,
) -> None:
    """Extract a tar stream under ``raw_dest`` (created if needed) inside ``root``; ``watch``
    sees every member, and its content, as it is written."""
    dest = checked_path(raw_dest)
    parts = _parts_under(root, dest)
    try:
        dest_fd = _open_beneath(root, parts, create=True)
    except (OSError, beneath.Refused) as exc:
        raise _os_error(exc, dest) from exc
    try:
        members = _members(archive, max_bytes=max_bytes, max_members=max_members, max_expansion=max_expansion)
        for member, names, content in members:
            written = content if watch is None else watch(member, names, content)
            try:
                _extract_member(dest_fd, names, member, written)
            except (OSError, beneath.Refused) as exc:
                raise _os_error(exc, f"{dest}/{'/'.join(names)}") from exc
    except _UNREADABLE as exc:  # a truncated member, met while extracting it
        raise _unreadable() from exc
    finally:
        os.close(dest_fd)


_UNREADABLE = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError)
"""What tarfile and its decompressors raise for a truncated or corrupt stream."""


def _unreadable() -> ServiceError:
    return ServiceError("invalid_request", "not a readable tar stream (truncated or corrupt)")


class _Counted(io.RawIOBase):
    """The archive's bytes as they arrive, counted: what the expansion is measured against."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        data = self._raw.read(len(target))
        target[: len(data)] = data
        self.count += len(data)
        return len(data)


class _Budget:
    """What the members expand to so far, against ``max_bytes`` and the bytes that arrived."""

    def __init__(self, arrived: _Counted, *, max_bytes: int, max_expansion: int) -> None:
        self._arrived = arrived
        self._max_bytes = max_bytes
        self._max_expansion = max_expansion
        self.produced = 0

    def take(self, size: int) -> None:
        self.produced += size
        if self.produced > self._max_bytes:
            raise ServiceError("too_large", f"the archive expands to more than {self._max_bytes} bytes")
        if self.produced - self._arrived.count > self._max_expansion:
            raise ServiceError(
                "too_large",
                f"the archive expands to more than {self._max_expansion} bytes beyond its own size"
                " (sparse holes or compression)",
            )


class _Content(io.RawIOBase):
    """A member's content, every byte of it charged to the `_Budget` as it is read."""

    def __init__(self, content: IO[bytes], budget: _Budget) -> None:
        self._content = content
        self._budget = budget

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        count = self._content.readinto(target)  # type: ignore[attr-defined]  # tarfile's ExFileObject
        self._budget.take(count)
        return int(count)


def _members(
    archive: IO[bytes], *, max_bytes: int, max_members: int = MAX_MEMBERS, max_expansion: int = MAX_EXPANSION
) -> Iterator[tuple[tarfile.TarInfo, list[str], IO[bytes] | None]]:
    """Each member that may be extracted, with its name's components and its content (charged
    to the budget as it is read). Raises `ServiceError` at the first member that may not."""
    arrived = _Counted(archive)
    budget = _Budget(arrived, max_bytes=max_bytes, max_expansion=max_expansion)
    links: set[tuple[str, ...]] = set()
    try:
        with _opened(archive, arrived) as tar:
            for count, member in enumerate(tar, 1):
                if count > max_members:
                    raise ServiceError("too_large", f"the archive has more than {max_members} members")
                if not (member.isreg() or member.isdir() or member.issym()):
                    raise ServiceError(
                        "invalid_request", f"archive member {member.name!r}: only files, directories and symlinks"
                    )
                names = member_parts(member.name)
                if not names:
                    continue
                _check_reached(member.name, names, links)
                if member.issym():
                    _check_link(member.name, names, member.linkname)
                    links.add(tuple(names))
                else:
                    links.discard(tuple(names))
                content = tar.extractfile(member) if member.isreg() else None  # reads holes as zeros
                if member.issparse():  # so written out as the regular file it stands for
                    member.type, member.sparse = tarfile.REGTYPE, None
                yield member, names, None if content is None else io.BufferedReader(_Content(content, budget), _COPY)
    except _UNREADABLE as exc:
        raise _unreadable() from exc


def _opened(archive: IO[bytes], arrived: _Counted) -> tarfile.TarFile:
    """A file on disk read in place, all of it arrived; any other stream as it comes, in reads
    of `_COPY` bytes."""
    size = _file_size(archive)
    if size is not None:
        arrived.count = size
        return tarfile.open(fileobj=archive, mode="r:*")
    return tarfile.open(fileobj=io.BufferedReader(arrived, _COPY), mode="r|*", bufsize=_COPY)


def _file_size(archive: IO[bytes]) -> int | None:
    """The size of ``archive`` if it is a regular file opened for reading, else ``None``."""
    if not isinstance(archive, io.BufferedReader | io.BufferedRandom) or not isinstance(archive.raw, io.FileIO):
        return None
    info = os.fstat(archive.fileno())
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def _check_reached(name: str, names: list[str], links: set[tuple[str, ...]]) -> None:
    """Refuse a member under a symlink the archive made: extracting it would write wherever
    the link points."""
    for depth in range(1, len(names)):
        if tuple(names[:depth]) in links:
            raise ServiceError("invalid_path", f"archive member {name!r} goes through a symbolic link it made")


def _check_link(name: str, names: list[str], target: str) -> None:
    """A symlink member may point only inside the destination, relatively."""
    if not target or target.startswith("/") or "\x00" in target:
        raise ServiceError("invalid_path", f"archive member {name!r} is a symbolic link to an absolute path")
    depth = len(names) - 1  # components of the directory the link is in
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                raise ServiceError("invalid_path", f"archive member {name!r} is a symbolic link out of the archive")
        elif part not in ("", "."):
            depth += 1


def _extract_member(dest_fd: int, names: list[str], member: tarfile.TarInfo, content: IO[bytes] | None) -> None:
    parent_fd = beneath.open_dir(dest_fd, names[:-1], create=True, mode=0o755)
    try:
        name, mode = names[-1], (member.mode & 0o777) or 0o644
        if member.isdir():  # made if missing; either way a real directory, not a link to one
            os.close(beneath.open_dir(parent_fd, [name], create=True, mode=mode | 0o700))
            return
        _refuse_directory(parent_fd, name)
        # Made under a temporary name and renamed over ``name`` once whole: a body cut halfway
        # (a client killed mid-upload) leaves the file it would replace as it was.
        temp = f".sandboxes-write.{secrets.token_hex(8)}"
        try:
            if member.issym():
                os.symlink(member.linkname, temp, dir_fd=parent_fd)
            else:
                assert content is not None
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(temp, flags, 0o600, dir_fd=parent_fd)
                with os.fdopen(fd, "wb") as target:
                    while chunk := content.read(_COPY):
                        target.write(chunk)
                    target.flush()
                    os.fchmod(target.fileno(), mode)
                    os.utime(target.fileno(), (member.mtime, member.mtime))
            os.replace(temp, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=parent_fd)
            raise
    finally:
        os.close(parent_fd)


def _refuse_directory(dir_fd: int, name: str) -> None:
    info = beneath.lstat(dir_fd, name)
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise ServiceError("is_directory", f"archive member {name!r} would replace a directory")


# ---------------------------------------------------------------------- docker: rewrite, spool


def rewrite_for_container(
    archive: IO[bytes],
    *,
    uid: int,
    gid: int,
    max_bytes: int,
    max_members: int = MAX_MEMBERS,
    max_expansion: int = MAX_EXPANSION,
) -> IO[bytes]:
    """The tar, made safe to hand to ``put_archive``: owned by the sandbox user, no special
    mode bits, no device nodes or hard links, no member escaping the destination."""
    spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY)  # noqa: SIM115 - returned open
    try:
        with tarfile.open(fileobj=spool, mode="w|", format=tarfile.PAX_FORMAT) as out:
            members = _members(archive, max_bytes=max_bytes, max_members=max_members, max_expansion=max_expansion)
            for member, names, content in members:
                member.name = "/".join(names)
                member.uid, member.gid, member.uname, member.gname = uid, gid, "", ""
                member.mode = (member.mode & 0o777) or (0o755 if member.isdir() else 0o644)
                if member.isdir():  # as extract_local: the sandbox user may always enter its own
                    member.mode |= 0o700
                member.pax_headers = {}
                out.addfile(member, content)
    except _UNREADABLE as exc:
        spool.close()
        raise _unreadable() from exc
    except BaseException:
        spool.close()
        raise
    spool.seek(0)
    return spool
