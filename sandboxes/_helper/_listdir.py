"""Native ``list_dir`` in the exec helper: E2B's ``ListDir`` script
(`sandboxes.server.e2b.filesystem.LIST`) without starting a process (imported with `_files`:
stdlib only, Python 3.6-compatible).

Why: the script starts a shell and ``find``, two process starts per listing; here it is one
frame round trip.

The answer is the script's where GNU ``find`` prints: exit 16 for a path that is there but is
not a directory (links followed), 12 for one that cannot be entered, ``why``'s codes for one
that is not there; else 0 and, for every entry under the directory (entered as ``cd -P``
resolves it) down to the depth asked, not following links, in ``find``'s order (a directory
before what it holds, each directory's names in the order the kernel reads them): ``=``, the
type letter and the octal permission bits, the size, the mtime (``%T@``), the uid, the
gid, the owner's and the group's names (the numbers where there are none), a newline, the path
relative to the directory (``./a/b``), a NUL. A directory it may not read is listed, its
contents not (``find`` says why on its stderr, which the script discards). Handed back (``N``):
a directory resolving into ``/proc``, ``/sys`` or ``/dev`` (``/proc/self`` is the helper there,
not ``find``), more than `LIST_DIR_MAX_ENTRIES` entries, a walk longer than
`_listing.LISTING_MAX_SECONDS`, or a failure other than a permission or a vanished entry.
"""

import errno
import grp
import os
import pwd
import stat
import time

from ._listing import _DIR_FLAGS, _LISTING_MAX_PATH, _LISTING_PSEUDO_ROOTS, LISTING_MAX_SECONDS
from ._native import _why

LIST_DIR_OPS = ["list_dir"]
LIST_DIR_MAX_ENTRIES = 20000
MAX_DEPTH = 64
_TYPE_LETTERS = {
    stat.S_IFREG: b"f",
    stat.S_IFDIR: b"d",
    stat.S_IFLNK: b"l",
    stat.S_IFIFO: b"p",
    stat.S_IFSOCK: b"s",
    stat.S_IFCHR: b"c",
    stat.S_IFBLK: b"b",
}


def _seconds(nanoseconds: int) -> bytes:
    """``find``'s ``%T@``: seconds, a point, ten digits (nanoseconds and a zero)."""
    whole, part = divmod(abs(nanoseconds), 1000000000)
    return b"%s%d.%09d0" % (b"-" if nanoseconds < 0 else b"", whole, part)


class _HandBack(Exception):
    """The script must answer this one (see the module's docstring)."""


def list_dir(op: "list[str]") -> "tuple[int, bytes] | None":
    """``(exit code, output)`` of the listing (``op``: ``list_dir``, a normalized absolute
    path, a depth from 1 to `MAX_DEPTH`), or ``None``: run the script. ValueError when malformed."""
    if not isinstance(op, list) or len(op) != 3 or not all(isinstance(a, str) for a in op):
        raise ValueError("wrong arguments for list_dir")
    path, depth_text = op[1], op[2]
    if not path.startswith("/") or "\0" in path:
        raise ValueError("bad path")
    if path != "/" and any(part in ("", ".", "..") for part in path.split("/")[1:]):
        raise ValueError("path not normalized")
    if not depth_text.isdigit() or not 1 <= int(depth_text) <= MAX_DEPTH:
        raise ValueError("bad depth")
    if len(os.fsencode(path)) >= _LISTING_MAX_PATH - 1:
        return None
    try:
        return _list(path, int(depth_text))
    except _HandBack:
        return None


def _list(path: str, depth: int) -> "tuple[int, bytes]":
    if not os.path.isdir(path):  # `[ ! -d ]`
        return (16, b"") if os.path.exists(path) else (_why(path), b"")
    if not os.access(path, os.X_OK):  # `cd -P` fails
        return 12, b""
    real = os.path.realpath(path)
    if any(real == pseudo or real.startswith(pseudo + "/") for pseudo in _LISTING_PSEUDO_ROOTS):
        raise _HandBack()
    walk = _Walk(depth)
    try:
        fd = os.open(real, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):  # searchable, not readable: `find` lists nothing
            return 0, b""
        raise _HandBack() from None
    try:
        walk.directory(fd, b".", 1)
    finally:
        os.close(fd)
    return 0, b"".join(walk.records)


class _Walk(object):
    """``find . -mindepth 1 -maxdepth DEPTH -printf ...`` from an open directory."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.records: "list[bytes]" = []
        self.deadline = time.monotonic() + LISTING_MAX_SECONDS
        self.users: "dict[int, bytes]" = {}
        self.groups: "dict[int, bytes]" = {}

    def directory(self, fd: int, prefix: bytes, level: int) -> None:
        """Each entry of the directory ``fd`` (at ``level``), then what each of its directories holds."""
        try:
            names = [os.fsencode(name) for name in os.listdir(fd)]
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.ENOENT):
                return
            raise _HandBack() from None
        for name in names:
            if len(self.records) >= LIST_DIR_MAX_ENTRIES or (
                (len(self.records) & 63) == 63 and time.monotonic() > self.deadline
            ):
                raise _HandBack()
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:  # vanished meanwhile: `find` skips it
                continue
            relative = prefix + b"/" + name
            self.records.append(self.record(st, relative))
            if level < self.depth and stat.S_ISDIR(st.st_mode):
                self.enter(fd, name, relative, level + 1)

    def enter(self, parent: int, name: bytes, relative: bytes, level: int) -> None:
        try:
            fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.ENOENT):
                return
            raise _HandBack() from None
        try:
            self.directory(fd, relative, level)
        finally:
            os.close(fd)

    def record(self, st: "os.stat_result", relative: bytes) -> bytes:
        letter = _TYPE_LETTERS.get(stat.S_IFMT(st.st_mode))
        if letter is None:
            raise _HandBack()
        line = b"=%s%o %d %s %d %d %s %s\n" % (
            letter,
            stat.S_IMODE(st.st_mode),
            st.st_size,
            _seconds(st.st_mtime_ns),
            st.st_uid,
            st.st_gid,
            self.name_of(self.users, st.st_uid, True),
            self.name_of(self.groups, st.st_gid, False),
        )
        return line + relative + b"\0"

    @staticmethod
    def name_of(known: "dict[int, bytes]", number: int, user: bool) -> bytes:
        """The user's (or group's) name, the number where it has none, as ``find``'s ``%u``."""
        name = known.get(number)
        if name is None:
            try:
                name = os.fsencode(pwd.getpwuid(number).pw_name if user else grp.getgrgid(number).gr_name)
            except KeyError:
                name = b"%d" % number
            known[number] = name
        return name
