"""`FilesystemBackend`: files kept in a real host directory, behind virtual paths.

``/`` is the configured root directory and ``/a/b.txt`` is ``<root>/a/b.txt``. Nothing outside
the root can be reached, and that rests not on string checks of host paths (which symlinks and
races defeat) but on how every path is opened:

* ``..`` never gets here (`normalize_path` refuses it); the other components are opened one at
  a time relative to a descriptor of the root (``openat``), so ``/etc`` means ``<root>/etc``.
* Every component is opened with ``O_NOFOLLOW`` (directories also ``O_DIRECTORY``) relative to
  its parent's descriptor, so the kernel itself refuses a symlink anywhere on the way, including
  one swapped in after a check: there is no check-then-use window to race.
* A symlink is answered with ``permission_denied`` (not ``invalid_path``: the path is fine, the
  object is off limits), the message saying it is a symlink. ``delete`` is the exception: it
  removes the link itself, never its target, so links left by other processes can be cleaned
  up. ``ls`` lists a symlink as a non-directory entry (``lstat`` size and time), so the agent
  sees why a name is refused; ``glob`` and ``grep`` skip symlinks, as ``find -P -type f`` does.
* Walks (``grep``, ``glob``, recursive ``delete``) list directories through descriptors and
  descend only into real directories, again opened with ``O_NOFOLLOW``.

The opening and walking are `sandboxes._beneath`'s, shared with the service's archives; this
module translates its refusals into protocol codes (`_refusal`).

Writes go to a temporary file in the target's directory renamed over the target: readers see
old or new content, never a torn file, and a hard link planted in the root is replaced, not
written through. The new file keeps the old one's mode (and owner, where allowed), and the old
file's write permission is checked first, so a read-only file stays read-only as under
``echo > file``. Nothing is fsync-ed (atomic for readers, not durable across a power cut).
``edit`` is a compare-and-swap: a file changed between its read and the rename is
``file_changed``, never a lost write.

Answers match `sandboxes.state.StateBackend` (same codes, same `sandboxes.semantics`). What a
dict cannot hold is answered as the shell sandboxes do: a FIFO, socket or device is
``invalid_argument`` ("not a regular file"); directories in ``ls`` carry their mtime.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import threading
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from sandboxes import _beneath as beneath
from sandboxes import protocol as p
from sandboxes.base import MAX_READ_BYTES
from sandboxes.paths import InvalidPathError, join, normalize_path, relative_to
from sandboxes.semantics import (
    EDIT_MAX_BYTES,
    InvalidGlobError,
    Replacement,
    compile_glob,
    decode_text,
    failure,
    filter_glob,
    finish_grep,
    grep_text,
    iso_from_epoch,
    read_window,
    refused_input,
    replace_text,
)

R = TypeVar("R")

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_CHUNK = 1 << 20

_ERRNO_CODES: dict[int, p.ErrorCode] = {
    **dict.fromkeys((errno.EACCES, errno.EPERM, errno.EROFS, errno.ETXTBSY), p.PERMISSION_DENIED),
    **dict.fromkeys((errno.ENOSPC, errno.EDQUOT), p.NO_SPACE),
    **dict.fromkeys((errno.ENXIO, errno.ENODEV), p.INVALID_ARGUMENT),  # special files
    errno.ENOENT: p.FILE_NOT_FOUND,
    errno.EISDIR: p.IS_DIRECTORY,
    errno.ENOTDIR: p.NOT_A_DIRECTORY,
    errno.ENAMETOOLONG: p.INVALID_PATH,
    errno.EFBIG: p.FILE_TOO_LARGE,
}
"""How OS errors become protocol codes; ELOOP/EMLINK (a symlink met with ``O_NOFOLLOW``) are
``permission_denied`` via `_symlink`; anything unlisted is ``backend_error`` with its text."""

_REASON_CODES: dict[beneath.Reason, p.ErrorCode] = {
    "not_a_directory": p.NOT_A_DIRECTORY,
    "is_a_directory": p.IS_DIRECTORY,
    "not_found": p.FILE_NOT_FOUND,
    "invalid_name": p.INVALID_PATH,
}
"""How the walker's refusals become protocol codes; ``symlink`` and ``not_regular`` carry a
detail (`_symlink`, `_not_regular`)."""


class FilesystemBackendConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    root_dir: Path
    """Host directory that ``/`` stands for; created if missing."""
    max_file_bytes: int = Field(default=MAX_READ_BYTES, gt=0)
    """``read`` and ``edit`` refuse larger files with ``file_too_large`` (they are held in memory
    whole; ``edit`` past `sandboxes.semantics.EDIT_MAX_BYTES` too), and ``grep`` skips them.
    ``download_files`` is not capped, as on other backends."""


class _Refused(Exception):
    """An answer about the path (an error code), carried out of nested helpers."""

    def __init__(self, code: p.ErrorCode, path: str, detail: str | None = None) -> None:
        self.code, self.message = failure(code, path, detail)
        super().__init__(self.message)


def _refusal(exc: OSError | beneath.Refused, path: str) -> _Refused:
    if isinstance(exc, beneath.Refused):
        if exc.reason == "symlink":
            return _symlink(path)
        if exc.reason == "not_regular":
            return _not_regular(path)
        return _Refused(_REASON_CODES[exc.reason], path)
    if exc.errno in beneath.SYMLINK_ERRNOS:
        return _symlink(path)
    code = _ERRNO_CODES.get(exc.errno or 0, p.BACKEND_ERROR)
    return _Refused(code, path, exc.strerror if code == p.BACKEND_ERROR else None)


def _symlink(path: str) -> _Refused:
    return _Refused(p.PERMISSION_DENIED, path, "a symbolic link is in the way; symlinks are never followed")


def _not_regular(path: str) -> _Refused:
    return _Refused(p.INVALID_ARGUMENT, path, "not a regular file")


def _answer(kind: Callable[[p.ErrorCode, str], R], raw: str, action: Callable[[str], R]) -> R:
    """Normalise ``raw`` and run ``action`` on it; a refused path, a refusal or an unexpected
    OS error becomes ``kind``'s error result (the protocol never raises for a path)."""
    try:
        path = normalize_path(raw)
    except InvalidPathError as exc:
        return kind(*refused_input(exc, raw))
    try:
        return action(path)
    except _Refused as refused:
        return kind(refused.code, refused.message)
    except (OSError, beneath.Refused) as exc:
        mapped = _refusal(exc, path)
        return kind(mapped.code, mapped.message)


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part]


def _read_fd(fd: int, limit: int | None) -> bytes:
    """Everything in ``fd``, or at most ``limit + 1`` bytes so the caller can tell it is over."""
    chunks: list[bytes] = []
    total = 0
    while limit is None or total <= limit:
        want = _CHUNK if limit is None else min(_CHUNK, limit + 1 - total)
        chunk = os.read(fd, want)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino, a.st_size, a.st_mtime_ns) == (b.st_dev, b.st_ino, b.st_size, b.st_mtime_ns)


def _keep_metadata(fd: int, old: os.stat_result) -> None:
    """Give the replacement file the replaced one's mode (and owner, where allowed)."""
    if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
        with contextlib.suppress(PermissionError):  # chown clears set-id bits; the chmod restores them
            os.fchown(fd, old.st_uid, old.st_gid)
    os.fchmod(fd, stat.S_IMODE(old.st_mode))


def _scan(dir_fd: int) -> list[os.DirEntry[str]]:
    with os.scandir(dir_fd) as entries:
        return list(entries)


def _regular_files(base: str, walk: Generator[beneath.Entry, None, None]) -> Iterator[tuple[int, str, str]]:
    """``(dir_fd, name, virtual path)`` of each regular file the walk of ``base`` meets."""
    with contextlib.closing(walk):
        for dir_fd, name, relpath, kind in walk:
            if kind == "file":
                yield dir_fd, name, join(base, relpath)


class FilesystemBackend(p.BackendProtocol):
    """Files under one host directory; thread-safe (writes, edits and deletes are serialised)."""

    def __init__(self, root_dir: str | Path | None = None, config: FilesystemBackendConfig | None = None) -> None:
        if config is None:
            if root_dir is None:
                raise ValueError("FilesystemBackend needs a root_dir or a config")
            config = FilesystemBackendConfig(root_dir=Path(root_dir))
        elif root_dir is not None:
            raise ValueError("give FilesystemBackend a root_dir or a config, not both")
        needed = (os.open, os.stat, os.mkdir, os.unlink, os.rmdir, os.rename)
        if any(f not in os.supports_dir_fd for f in needed) or os.scandir not in os.supports_fd:
            raise RuntimeError("FilesystemBackend needs openat()-style dir_fd support from the OS")
        self.config = config
        self.root = config.root_dir.expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.root.is_dir():
            raise ValueError(f"root_dir {self.root} is not a directory")
        self.id = f"fs-{uuid.uuid4().hex[:12]}"
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ internals

    @contextlib.contextmanager
    def _root_fd(self) -> Iterator[int]:
        """The root, opened afresh per operation (its own host path is trusted configuration)."""
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
        except OSError as exc:
            raise _Refused(p.UNAVAILABLE, "/", f"root directory {self.root} cannot be opened: {exc.strerror}") from exc
        try:
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _parent(self, path: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """The descriptor of ``path``'s directory and ``path``'s last component (not ``/``)."""
        parts = _parts(path)
        with self._root_fd() as root:
            fd = beneath.open_dir(root, parts[:-1], create=create)
            try:
                yield fd, parts[-1]
            finally:
                os.close(fd)

    def _too_large(self, path: str, limit: int) -> _Refused:
        detail = f"larger than {limit} bytes; use download_files"
        return _Refused(p.FILE_TOO_LARGE, path, detail)

    def _fetch_at(
        self, dir_fd: int, name: str, path: str, *, capped: bool = True, cap: int | None = None
    ) -> tuple[bytes, os.stat_result]:
        """The whole regular file, refused past ``cap`` (default ``max_file_bytes``) when
        ``capped`` (checked on the bytes actually read too, since the file may grow after ``fstat``)."""
        limit = (self.config.max_file_bytes if cap is None else cap) if capped else None
        fd, info = beneath.open_file(dir_fd, name, os.O_RDONLY)
        try:
            if limit is not None and info.st_size > limit:
                raise self._too_large(path, limit)
            data = _read_fd(fd, limit)
        finally:
            os.close(fd)
        if limit is not None and len(data) > limit:
            raise self._too_large(path, limit)
        return data, info

    def _fetch(self, path: str, *, capped: bool = True, cap: int | None = None) -> tuple[bytes, os.stat_result]:
        if path == "/":
            raise _Refused(p.IS_DIRECTORY, path)
        with self._parent(path) as (dir_fd, name):
            return self._fetch_at(dir_fd, name, path, capped=capped, cap=cap)

    def _store(self, path: str, content: bytes, expected: os.stat_result | None = None) -> None:
        """Atomically replace (or create, with its parents) ``path`` with ``content``.

        ``expected``: the file as ``edit`` read it; if it is no longer that file, ``file_changed``.
        """
        if path == "/":
            raise _Refused(p.IS_DIRECTORY, path)
        with self._parent(path, create=expected is None) as (dir_fd, name):
            old: os.stat_result | None = None
            try:
                fd, old = beneath.open_file(dir_fd, name, os.O_WRONLY)  # refused where `echo >` would be
                os.close(fd)
            except beneath.Refused as refused:
                if refused.reason != "not_found" or expected is not None:
                    raise
            temp = f".sandboxes-{secrets.token_hex(8)}.tmp"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
            try:
                fd = os.open(temp, flags, 0o600 if old is not None else 0o666, dir_fd=dir_fd)
            except OSError as exc:
                raise _refusal(exc, path) from exc
            try:
                try:
                    if old is not None:
                        _keep_metadata(fd, old)
                    _write_fd(fd, content)
                finally:
                    os.close(fd)
                if expected is not None:
                    now = beneath.lstat(dir_fd, name)
                    if now is None or not _same_file(now, expected):
                        raise _Refused(p.FILE_CHANGED, path)
                os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException as exc:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=dir_fd)
                if isinstance(exc, OSError):
                    raise _refusal(exc, path) from exc
                raise

    def _candidates(self, root: str) -> Generator[tuple[int, str, str], None, None]:
        """``(parent_fd, name, virtual path)`` of each regular file at or below ``root``;
        refuses a missing or symlinked ``root`` on the first ``next``."""
        if root == "/":
            with self._root_fd() as root_fd:
                yield from _regular_files("/", beneath.walk(root_fd))
            return
        with self._parent(root) as (dir_fd, name):
            found = beneath.lstat(dir_fd, name)
            if found is None:
                raise _Refused(p.FILE_NOT_FOUND, root)
            if stat.S_ISLNK(found.st_mode):
                raise _symlink(root)
            if stat.S_ISREG(found.st_mode):
                yield dir_fd, name, root
            elif stat.S_ISDIR(found.st_mode):
                fd = beneath.open_dir(dir_fd, [name])
                try:
                    yield from _regular_files(root, beneath.walk(fd))
                finally:
                    os.close(fd)

    def _grep_text(self, dir_fd: int, name: str, path: str) -> str | None:
        """A candidate's text; ``None`` for binary, oversized, vanished or unreadable files
        (``grep`` over a tree reports matches, not the files it could not search)."""
        try:
            data, _ = self._fetch_at(dir_fd, name, path)
        except (_Refused, beneath.Refused, OSError):
            return None
        return decode_text("", data)

    # ------------------------------------------------------------------ protocol

    def ls(self, path: str) -> p.LsResult:
        def list_dir(directory: str) -> p.LsResult:
            entries = []
            with self._root_fd() as root:
                fd = beneath.open_dir(root, _parts(directory))
                try:
                    for entry in _scan(fd):
                        try:
                            info = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        mtime = iso_from_epoch(info.st_mtime)
                        name = join(directory, entry.name)
                        if stat.S_ISDIR(info.st_mode):
                            entries.append(p.FileInfo(name + "/", True, 0, mtime))
                        else:  # files, and symlinks/special files as what they are: not directories
                            entries.append(p.FileInfo(name, False, info.st_size, mtime))
                finally:
                    os.close(fd)
            return p.LsResult(entries=sorted(entries, key=lambda e: e.path))

        return _answer(p.LsResult, path, list_dir)

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> p.ReadResult:
        def read_file(path: str) -> p.ReadResult:
            data, info = self._fetch(path)
            return read_window(path, data, offset, limit, modified_at=iso_from_epoch(info.st_mtime))

        return _answer(p.ReadResult, file_path, read_file)

    def write(self, file_path: str, content: str) -> p.WriteResult:
        def write_file(path: str) -> p.WriteResult:
            with self._lock:
                self._store(path, content.encode("utf-8"))
            return p.WriteResult(path=path)

        return _answer(p.WriteResult, file_path, write_file)

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> p.EditResult:
        def edit_file(path: str) -> p.EditResult:
            with self._lock:
                data, info = self._fetch(path, cap=min(self.config.max_file_bytes, EDIT_MAX_BYTES))
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    raise _Refused(p.NOT_A_TEXT_FILE, path) from None
                outcome = replace_text(path, text, old_string, new_string, replace_all)
                if not isinstance(outcome, Replacement):
                    return p.EditResult(*outcome)
                self._store(path, outcome.content.encode("utf-8"), expected=info)
            return p.EditResult(path=path, occurrences=outcome.occurrences)

        return _answer(p.EditResult, file_path, edit_file)

    def delete(self, file_path: str) -> p.DeleteResult:
        def delete_path(path: str) -> p.DeleteResult:
            if path == "/":
                return p.DeleteResult(p.INVALID_PATH, "refusing to delete the root directory")
            with self._lock, self._parent(path) as (dir_fd, name):
                found = beneath.lstat(dir_fd, name)
                if found is None:
                    raise _Refused(p.FILE_NOT_FOUND, path)
                if stat.S_ISDIR(found.st_mode):
                    beneath.remove_tree(dir_fd, name)
                else:  # a file, a special file, or a symlink: the link itself goes, never its target
                    os.unlink(name, dir_fd=dir_fd)
            return p.DeleteResult(path=path)

        return _answer(p.DeleteResult, file_path, delete_path)

    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> p.GrepResult:
        try:
            selects = compile_glob(glob) if glob else None
        except InvalidGlobError as exc:
            return p.GrepResult(*refused_input(exc, glob))

        def search(root: str) -> p.GrepResult:
            matches: list[p.GrepMatch] = []
            with contextlib.closing(self._candidates(root)) as candidates:
                for dir_fd, name, file_path in candidates:
                    if "\n" in pattern:  # no line can hold it; the root still had to exist
                        break
                    if selects is None or selects(relative_to(file_path, root)):
                        text = self._grep_text(dir_fd, name, file_path)
                        matches.extend(grep_text(file_path, text, pattern) if text is not None else ())
            return finish_grep(matches, max_count)

        return _answer(p.GrepResult, path or "/", search)

    def glob(self, pattern: str, path: str | None = None) -> p.GlobResult:
        try:
            compile_glob(pattern)
        except InvalidGlobError as exc:
            return p.GlobResult(*refused_input(exc, pattern))

        def search(root: str) -> p.GlobResult:
            with contextlib.closing(self._candidates(root)) as candidates:
                found = filter_glob([file_path for _, _, file_path in candidates], pattern, root)
            return p.GlobResult(matches=[p.FileInfo(f) for f in found])

        return _answer(p.GlobResult, path or "/", search)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[p.FileUploadResponse]:
        def upload(raw: str, content: bytes) -> p.FileUploadResponse:
            def store(path: str) -> p.FileUploadResponse:
                with self._lock:
                    self._store(path, bytes(content))
                return p.FileUploadResponse(raw)

            return _answer(lambda code, message: p.FileUploadResponse(raw, code, message), raw, store)

        return [upload(raw, content) for raw, content in files]

    def download_files(self, paths: list[str]) -> list[p.FileDownloadResponse]:
        def download(raw: str) -> p.FileDownloadResponse:
            return _answer(
                lambda code, message: p.FileDownloadResponse(raw, None, code, message),
                raw,
                lambda path: p.FileDownloadResponse(raw, self._fetch(path, capped=False)[0]),
            )

        return [download(raw) for raw in paths]
