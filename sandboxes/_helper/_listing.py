"""Native ``ls`` and ``delete`` in the exec helper: `sandboxes._scripts.LS` and ``DELETE``
without starting a process (imported with `_files` when the helper idles or at its first file
op: stdlib only, Python 3.6-compatible).

Why: ``LS`` starts ``stat`` after the shell and ``DELETE`` starts ``rm``, so each cost about two
commands; here each is one frame round trip.

``ls`` answers the script's bytes: for the names ``* .[!.]* ..?*`` match, each pattern's names
in byte order (the C locale's glob), ``d<name>`` NUL for what ``[ -d ]`` sees as a directory
(symlinks followed), ``f<name>`` NUL for anything else that is there (a dangling symlink
too), then one ``stat -c '%s %Y'`` line per name: the entry's own size and whole seconds of
mtime, a symlink's not its target's (``lstat``). The listed directory is opened as ``cd -P``
resolves it, and the exit codes for a path that cannot be entered are the script's (12: a
directory we may not search; 13: not a directory; ``why`` otherwise). (`_parse.ls_entries`
sorts by path and pairs names with stat lines by position, so the order only has to be the same
in both halves; it is also the glob's.) Handed back (``N``): a directory we may enter but not
read (the script's unmatched patterns), one resolving into ``/proc``, ``/sys`` or ``/dev``
(``/proc/self`` is the helper there, not the shell), more than `LS_MAX_ENTRIES` entries or
`LS_MAX_ARGUMENT` bytes of names (the script's ``stat`` would meet ``E2BIG`` and print no
line: a listing without sizes), or `LISTING_MAX_SECONDS`.

``delete`` is ``rm -rf``: nothing followed, a symlink removed itself, a tree removed through
file descriptors (each directory opened ``O_NOFOLLOW`` relative to its parent's, as
`shutil.rmtree`'s safe variant does, so a directory swapped for a link meanwhile is never
walked into), everything removable removed and the rest left (a failure does not stop the walk),
then 12 if the path is still there. A walk that would cross into another filesystem (rm
descends into mounts), or goes past `DELETE_MAX_ENTRIES`, `DELETE_MAX_DEPTH` or
`LISTING_MAX_SECONDS`, or cannot open a directory for another reason than its permissions,
answers ``N``, what it removed so far staying removed: what ``rm -rf`` leaves and answers
depends only on what is there when it runs, so the script finishing the job is the script doing
all of it.
"""

import errno
import os
import stat
import time

from ._native import _why

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: `typing` is not imported in the sandbox
    from collections.abc import Callable

LISTING_OPS = ["ls", "delete"]
LS_MAX_ENTRIES = 4096
LS_MAX_ARGUMENT = 64 << 10
"""Bytes of names (with their pointers) past which this hands ``ls`` back; ``execve`` takes at
least 128 KiB of arguments and environment, so below this the script's ``stat`` always runs."""
DELETE_MAX_ENTRIES = 10000
DELETE_MAX_DEPTH = 64
LISTING_MAX_SECONDS = 0.1
_LISTING_PSEUDO_ROOTS = ("/proc", "/sys", "/dev")
_LISTING_MAX_PATH = 4096
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_PATH_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)


class _ListingHandBack(Exception):
    """The script must answer this one (see the module's docstring)."""


def listing(op: "list[str]") -> "tuple[int, bytes] | None":
    """``(exit code, output)`` of ``ls`` or ``delete`` (``op``: its name and the script's
    argument, a normalized absolute path), or ``None``: run the script. ValueError when
    malformed."""
    if not isinstance(op, list) or len(op) != 2 or not all(isinstance(a, str) for a in op):
        raise ValueError("wrong arguments for %s" % (op[0] if op else "a listing op"))
    path = op[1]
    if not path.startswith("/") or "\0" in path:
        raise ValueError("bad path")
    parts = path.split("/")[1:]
    if path != "/" and any(part in ("", ".", "..") for part in parts):
        raise ValueError("path not normalized")  # `rm -rf dir/` would follow a link: never
    if len(os.fsencode(path)) >= _LISTING_MAX_PATH - 1:
        return None  # the kernel refuses it: what the script says then
    try:
        if op[0] == "ls":
            return _ls(path)
        if path == "/":
            raise ValueError("refusing to delete the root directory")
        return _delete(path), b""
    except _ListingHandBack:
        return None


def _ls(path: str) -> "tuple[int, bytes]":
    if not (os.path.isdir(path) and os.access(path, os.X_OK)):  # `cd -P` fails
        if os.path.isdir(path):
            return 12, b""
        code = _why(path)
        return (13 if code == 12 and os.path.exists(path) else code), b""
    real = os.path.realpath(path)
    if any(real == pseudo or real.startswith(pseudo + "/") for pseudo in _LISTING_PSEUDO_ROOTS):
        raise _ListingHandBack()
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError:  # searchable, not readable: the script's globs stay unmatched
        raise _ListingHandBack() from None
    try:
        names = [os.fsencode(name) for name in _names(fd, LS_MAX_ENTRIES)]
        if sum(len(n) + 9 for n in names) > LS_MAX_ARGUMENT:
            raise _ListingHandBack()
        plain = sorted(n for n in names if not n.startswith(b"."))
        hidden = sorted(n for n in names if n.startswith(b".") and n[1:2] not in (b"", b"."))
        dotted = sorted(n for n in names if n.startswith(b"..") and len(n) > 2)
        deadline = time.monotonic() + LISTING_MAX_SECONDS
        records: "list[bytes]" = []
        stats: "list[bytes]" = []
        for count, name in enumerate(plain + hidden + dotted):
            if (count & 63) == 63 and time.monotonic() > deadline:
                raise _ListingHandBack()
            kind, own = _entry(fd, name)
            if kind is not None:
                records.append(kind + name + b"\0")
            if own is not None:
                stats.append(b"%d %d\n" % (own.st_size, own[stat.ST_MTIME]))
    except OSError:
        raise _ListingHandBack() from None
    finally:
        os.close(fd)
    return 0, b"".join(records) + b"".join(stats)


def _entry(fd: int, name: bytes) -> "tuple[bytes | None, os.stat_result | None]":
    """(``b"d"``, ``b"f"`` or ``None``: gone, its ``lstat`` or ``None``) of one name: the
    script's ``[ -d ]`` / ``[ -e ] || [ -L ]`` and its ``stat`` (which does not follow)."""
    try:
        own = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return None, None
    if not stat.S_ISLNK(own.st_mode):
        return (b"d" if stat.S_ISDIR(own.st_mode) else b"f"), own
    try:
        target = os.stat(name, dir_fd=fd).st_mode
    except OSError:  # dangling, a loop, or behind a directory we may not search
        return b"f", own
    return (b"d" if stat.S_ISDIR(target) else b"f"), own


def _delete(path: str) -> int:
    """`sandboxes._scripts.DELETE`'s exit code, the removal done."""
    if not os.path.lexists(path):  # `[ ! -e ] && [ ! -L ]`
        return _why(path)
    parent, name = path.rpartition("/")[0] or "/", path.rpartition("/")[2]
    try:
        parent_fd = os.open(parent, _PATH_FLAGS)
    except OSError:
        raise _ListingHandBack() from None
    try:
        _Removal(os.fstat(parent_fd).st_dev).remove(parent_fd, name)
    finally:
        os.close(parent_fd)
    return 12 if os.path.lexists(path) else 0


class _Removal(object):
    """``rm -rf`` of one name, iteratively: a stack of open directories, each holding the names
    it has left to remove."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.entries = 0
        self.deadline = time.monotonic() + LISTING_MAX_SECONDS

    def remove(self, parent_fd: int, name: str) -> None:
        opened = self.enter(parent_fd, name)
        if opened is None:
            return
        stack = [(parent_fd, name, *opened)]
        try:
            while stack:
                parent, directory, fd, names = stack[-1]
                if not names:  # emptied (as far as it could be): its own turn
                    del stack[-1]
                    os.close(fd)
                    _ignore_failure(os.rmdir, directory, parent)
                    continue
                child = names.pop()
                opened = self.enter(fd, child)
                if opened is not None:
                    if len(stack) >= DELETE_MAX_DEPTH:
                        os.close(opened[0])
                        raise _ListingHandBack()
                    stack.append((fd, child, *opened))
        finally:
            for _, _, fd, _ in stack:
                os.close(fd)

    def enter(self, dir_fd: int, name: str) -> "tuple[int, list[str]] | None":
        """Remove ``name`` if it is not a directory; a directory: ``(fd, its names)`` to empty
        first (``None``: it was removed, or could not be opened and its ``rmdir`` was tried)."""
        self.entries += 1
        if self.entries > DELETE_MAX_ENTRIES or ((self.entries & 63) == 0 and time.monotonic() > self.deadline):
            raise _ListingHandBack()
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:  # gone (rm -f), or not ours to see: rm fails on it alike
            return None
        if not stat.S_ISDIR(st.st_mode):
            _ignore_failure(os.unlink, name, dir_fd)
            return None
        if st.st_dev != self.device:
            raise _ListingHandBack()  # a mount point: rm descends into it; the script's to do
        try:
            fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ENOENT:  # gone meanwhile
                return None
            if exc.errno not in (errno.EACCES, errno.EPERM):  # swapped for a link (ELOOP,
                raise _ListingHandBack() from None  # ENOTDIR: nothing followed), out of descriptors...
            _ignore_failure(os.rmdir, name, dir_fd)  # unreadable: removable only if empty
            return None
        try:
            if os.fstat(fd).st_dev != self.device:
                raise _ListingHandBack()
            names = _names(fd, DELETE_MAX_ENTRIES - self.entries)
        except BaseException:
            os.close(fd)
            raise
        return fd, names


def _names(fd: int, most: int) -> "list[str]":
    """The names in the directory ``fd``; `_ListingHandBack` past ``most``. Python 3.7 and later
    stop reading there (``scandir`` of a descriptor); 3.6 reads them all first (``listdir``)."""
    if os.scandir in getattr(os, "supports_fd", ()):
        names: "list[str]" = []
        with os.scandir(fd) as entries:
            for entry in entries:
                names.append(entry.name)
                if len(names) > most:
                    raise _ListingHandBack()
        return names
    names = os.listdir(fd)
    if len(names) > most:
        raise _ListingHandBack()
    return names


def _ignore_failure(remove: "Callable[..., None]", name: str, dir_fd: int) -> None:
    """``rm -f``: what cannot be removed stays (the answer says so), and the walk goes on."""
    try:
        remove(name, dir_fd=dir_fd)
    except OSError:
        pass
