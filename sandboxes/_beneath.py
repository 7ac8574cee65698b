"""Paths opened beneath a directory descriptor, never through a symbolic link.

The one implementation, shared by `sandboxes.filesystem` (a host directory as a backend) and
`sandboxes.server.archive` (tar streams in and out of local sandboxes), of resolving a path the
way nothing inside the directory can redirect: every component is opened relative to its
parent's descriptor (``openat``) with ``O_NOFOLLOW`` (directories also ``O_DIRECTORY``), so the
kernel refuses a symlink at any component, including one swapped in after a check. There is no
check-then-use window: a check (``lstat``) only chooses what to say about a failure, or keeps a
device or FIFO from being opened at all; the open itself never follows a link.

Every answer about the path's shape is a `Refused` with a `Reason`, whatever errno the kernel
chose (``O_NOFOLLOW|O_DIRECTORY`` on a symlink says ``ENOTDIR`` on Linux, ``ELOOP`` on others,
``EMLINK`` on FreeBSD): the callers translate reasons into their own vocabularies (protocol
error codes, the service's errors) in one place each. Other OS errors (``EACCES``, ``ENOSPC``,
...) propagate as raised.

Hard links are ordinary files here (nothing can tell one apart from the file it links to), so a
writer must replace a file by renaming a new one over it, never write through it; FIFOs,
sockets and devices are refused (`open_file`) or reported as ``other`` (`walk`), never opened.

Standard library only, below every other layer of the package.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Generator, Iterator, Sequence
from typing import Literal, NamedTuple

__all__ = [
    "DIR_FLAGS",
    "FILE_FLAGS",
    "SYMLINK_ERRNOS",
    "Entry",
    "Kind",
    "Reason",
    "Refused",
    "check_name",
    "lstat",
    "open_dir",
    "open_file",
    "remove_tree",
    "walk",
]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
"""How every directory is opened: a symlink in its place fails instead of being followed."""
FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | _CLOEXEC
"""Added to every file open; ``O_NONBLOCK`` so a FIFO swapped in cannot hang the open."""
SYMLINK_ERRNOS = frozenset({errno.ELOOP, errno.EMLINK})
"""What ``O_NOFOLLOW`` says on a symlink (``EMLINK`` on FreeBSD); with ``O_DIRECTORY`` Linux
says ``ENOTDIR`` instead, which is why `open_dir` asks ``lstat`` what it met."""

Reason = Literal["symlink", "not_a_directory", "is_a_directory", "not_found", "not_regular", "invalid_name"]
Kind = Literal["file", "other", "dir", "leave"]


class Refused(Exception):
    """Why a path beneath the directory is not opened; `reason` is for the caller to translate.

    ``symlink``: a symbolic link is at a component (never followed); ``not_a_directory``: a
    component that must be a directory is something else; ``is_a_directory``: a file was
    wanted; ``not_found``: a component is missing; ``not_regular``: a FIFO, socket or device;
    ``invalid_name``: a component that is empty, ``.``, ``..`` or holds ``/`` or NUL.
    """

    def __init__(self, reason: Reason, name: str) -> None:
        self.reason: Reason = reason
        self.name = name
        super().__init__(f"{name!r}: {reason.replace('_', ' ')}")


class Entry(NamedTuple):
    """One step of `walk`. ``dir_fd`` is the directory holding ``name``, valid until the next
    step; ``relpath`` is ``name``'s path relative to the walked directory."""

    dir_fd: int
    name: str
    relpath: str
    kind: Kind


def check_name(name: str) -> None:
    """Refuse what is not one plain component: ``openat`` resolves ``a/b`` through ``a``
    (unchecked), ``..`` climbs out, and an absolute name ignores the descriptor altogether."""
    if name in ("", ".", "..") or "/" in name or "\x00" in name:
        raise Refused("invalid_name", name)


def lstat(dir_fd: int, name: str) -> os.stat_result | None:
    """``name``'s own status (a link's, not its target's), or ``None`` if there is none."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _failed_dir(dir_fd: int, name: str, exc: OSError) -> Refused | OSError:
    """What a failed directory open met: asked of ``lstat``, since the errno does not tell a
    symlink from a file; if it changed since, the errno decides."""
    if exc.errno == errno.ENOENT:
        return Refused("not_found", name)
    if exc.errno not in (errno.ENOTDIR, *SYMLINK_ERRNOS):
        return exc
    found = lstat(dir_fd, name)
    if found is not None and stat.S_ISLNK(found.st_mode):
        return Refused("symlink", name)
    if found is not None and not stat.S_ISDIR(found.st_mode):
        return Refused("not_a_directory", name)
    return Refused("symlink" if exc.errno in SYMLINK_ERRNOS else "not_a_directory", name)


def _open_child(dir_fd: int, name: str, *, create: bool, mode: int) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if not (create and exc.errno == errno.ENOENT):
            raise _failed_dir(dir_fd, name, exc) from exc
    with contextlib.suppress(FileExistsError):  # made meanwhile, or a link in the way: the open tells
        os.mkdir(name, mode, dir_fd=dir_fd)
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise _failed_dir(dir_fd, name, exc) from exc


def open_dir(dir_fd: int, parts: Sequence[str], *, create: bool = False, mode: int = 0o777) -> int:
    """A new descriptor for directory ``parts`` beneath ``dir_fd`` (``dir_fd`` itself, dup-ed,
    for no parts), each component opened relative to the one before. ``create`` makes missing
    directories with ``mode`` (less the umask) like ``mkdir -p``; a symlink is refused either way."""
    for name in parts:
        check_name(name)
    fd = os.dup(dir_fd)
    try:
        for name in parts:
            child = _open_child(fd, name, create=create, mode=mode)
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _refuse_kind(mode: int, name: str, *, directories: bool) -> None:
    if stat.S_ISREG(mode) or (directories and stat.S_ISDIR(mode)):
        return
    if stat.S_ISLNK(mode):
        raise Refused("symlink", name)
    if stat.S_ISDIR(mode):
        raise Refused("is_a_directory", name)
    raise Refused("not_regular", name)


def open_file(dir_fd: int, name: str, flags: int, *, directories: bool = False) -> tuple[int, os.stat_result]:
    """Open ``name`` in ``dir_fd`` with ``flags`` (plus `FILE_FLAGS`) if it is a regular file
    (or, with ``directories``, a directory), and its status as opened.

    It is classified with ``lstat`` first, so a device or FIFO is refused without being opened,
    and again with ``fstat`` once open, in case something else was swapped in between; a symlink
    swapped in is refused by the open itself.
    """
    check_name(name)
    found = lstat(dir_fd, name)
    if found is None:
        raise Refused("not_found", name)
    _refuse_kind(found.st_mode, name, directories=directories)
    try:
        fd = os.open(name, flags | FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in SYMLINK_ERRNOS:
            raise Refused("symlink", name) from exc
        if exc.errno in (errno.ENOENT, errno.EISDIR):
            raise Refused("not_found" if exc.errno == errno.ENOENT else "is_a_directory", name) from exc
        raise
    try:
        info = os.fstat(fd)
        _refuse_kind(info.st_mode, name, directories=directories)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


# ---------------------------------------------------------------------- walking trees


def _identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def _split(dir_fd: int, strict: bool) -> tuple[list[tuple[str, Kind]], list[str]]:
    """The non-directory entries of ``dir_fd`` (with their kind) and its real subdirectories,
    each sorted by name. Not ``strict``: an unreadable directory reads as empty, as in ``find``."""
    others: list[tuple[str, Kind]] = []
    subdirs: list[str] = []
    try:
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        subdirs.append(entry.name)
                    else:
                        others.append((entry.name, "file" if entry.is_file(follow_symlinks=False) else "other"))
                except FileNotFoundError:
                    continue
    except OSError:
        if strict:
            raise
    return sorted(others), sorted(subdirs)


def _below(directory: str, name: str) -> str:
    return f"{directory}/{name}" if directory else name


def walk(base_fd: int, *, strict: bool = False) -> Generator[Entry, None, None]:
    """Every entry below directory ``base_fd``, as `Entry` steps, never following a link.

    Kinds: ``file`` (regular), ``other`` (symlink, FIFO, socket, device, or a directory swapped
    for one of those during the walk), ``dir`` before a subdirectory's entries (pre-order, with
    its parent's descriptor, once it has been opened) and ``leave`` after them (post-order, so
    a caller can ``rmdir`` it). In each directory its non-directories come first, then its
    subdirectories, each by name.

    Only the current directory is held open: going back up opens ``..`` and checks it is the
    very directory we came down from (device and inode; ``ESTALE`` if it was moved), so trees of
    any depth cost neither the recursion limit nor one descriptor per level. Not ``strict``: a
    subdirectory that cannot be opened is reported as ``dir`` but not entered (no ``leave``),
    one that cannot be listed reads as empty, one that vanished is left out; ``strict``: their
    error is raised.
    """
    files, subdirs = _split(base_fd, strict)
    stack: list[tuple[tuple[int, int], str, Iterator[str]]] = [(_identity(base_fd), "", iter(subdirs))]
    current = base_fd
    try:
        for name, kind in files:
            yield Entry(current, name, name, kind)
        while True:
            _, directory, pending = stack[-1]
            subdir = next(pending, None)
            if subdir is None:
                if len(stack) == 1:
                    return
                stack.pop()
                parent = base_fd if len(stack) == 1 else os.open("..", DIR_FLAGS, dir_fd=current)
                if parent != base_fd and _identity(parent) != stack[-1][0]:
                    os.close(parent)
                    raise OSError(errno.ESTALE, f"directory {stack[-1][1]!r} was moved during the walk")
                os.close(current)
                current = parent
                yield Entry(current, directory.rsplit("/", 1)[-1], directory, "leave")
                continue
            path = _below(directory, subdir)
            try:
                child = os.open(subdir, DIR_FLAGS, dir_fd=current)
            except OSError as exc:
                if exc.errno in (errno.ENOTDIR, *SYMLINK_ERRNOS):  # swapped for a link or a file
                    yield Entry(current, subdir, path, "other")
                elif strict:
                    raise
                elif exc.errno != errno.ENOENT:  # there, but not ours to enter
                    yield Entry(current, subdir, path, "dir")
                continue
            try:
                yield Entry(current, subdir, path, "dir")
            except BaseException:
                os.close(child)
                raise
            if current != base_fd:
                os.close(current)
            current = child
            files, subdirs = _split(current, strict)
            stack.append((_identity(current), path, iter(subdirs)))
            for name, kind in files:
                yield Entry(current, name, _below(path, name), kind)
    finally:
        if current != base_fd:
            os.close(current)


def remove_tree(parent_fd: int, name: str) -> None:
    """``rm -rf`` of directory ``name`` in ``parent_fd`` through descriptors: links inside are
    unlinked, never followed; one swapped in for ``name`` itself is unlinked instead."""
    check_name(name)
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, *SYMLINK_ERRNOS):
            raise
        os.unlink(name, dir_fd=parent_fd)  # swapped for a link since it was classified
        return
    try:
        for dir_fd, entry, _, kind in walk(fd, strict=True):
            if kind == "leave":
                os.rmdir(entry, dir_fd=dir_fd)
            elif kind != "dir":
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry, dir_fd=dir_fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)
