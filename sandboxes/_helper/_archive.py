"""``GET /archive``'s tar made inside a sandbox by its own user and written to stdout: the
program `sandboxes.server.backends` runs on a channel of its own in place of ``tar -c`` (stdlib
only, Python 3.6-compatible; shipped on demand, never in the helper's bootstrap).

Arguments: the directory to start in, the name to archive there (its basename: the top member,
``docker cp``'s layout), the largest file the archive may hold. Members as GNU ``tar -c`` makes
them (GNU format, owners and modes, hard links, directories in the order they list, symbolic
links not followed, sockets and what the user may not read left out), except that a regular
file's member holds what a read of it gives, not what its size says: a pseudo-file of ``/proc``
or ``/sys`` says 0 bytes or a page whatever it holds. A file that ends within `HELD` bytes (or
the bound, if less) is its bytes, whatever its size said; a longer one whose size says more is
that many bytes (zeros if it shrank meanwhile, cut if it grew, as ``tar`` does); a longer one
whose size says less (a pseudo-file) is counted to its end, at most the bound + 1 bytes, then
read again from its start, its member as long as it counted. Past the bound, its header alone says so (a
size over the bound, which the service refuses) and the program exits 3. Any other member
over the bound is the service's to refuse at its header, as it refuses ``tar``'s.
"""

import grp
import io
import os
import pwd
import stat
import sys
import tarfile

HELD = 1 << 20
"""The most bytes of one file held in memory: a file that ends within them is exactly them."""
_READ = 64 << 10
"""The most bytes of one ``read``: a small file costs no bigger buffer than this."""
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
"""``O_NONBLOCK``: a FIFO swapped in for a file after its ``lstat`` does not hang the open."""
TOO_LARGE = 3


class TooLarge(Exception):
    """A file holds more than the bound."""


class _Names(object):
    """``pwd``'s and ``grp``'s lookups as `tarfile` makes them at every member, each id looked
    up once."""

    def __init__(self) -> None:
        self._known = {}  # type: dict[tuple[object, int], object]

    def getpwuid(self, uid: int) -> object:
        return self._found(pwd.getpwuid, uid)

    def getgrgid(self, gid: int) -> object:
        return self._found(grp.getgrgid, gid)

    def _found(self, lookup: "object", ident: int) -> object:
        key = (lookup, ident)
        if key not in self._known:
            try:
                self._known[key] = lookup(ident)  # type: ignore[operator]
            except KeyError as unknown:
                self._known[key] = unknown
        found = self._known[key]
        if isinstance(found, KeyError):
            raise found
        return found


class _Exact(object):
    """``size`` bytes: ``head`` then the rest of ``fd``, zeros past its end, cut at ``size``."""

    def __init__(self, fd: int, head: bytes, size: int) -> None:
        self._fd, self._head, self._at, self._left = fd, head[:size], 0, size

    def read(self, wanted: int = -1) -> bytes:
        wanted = self._left if wanted < 0 else min(wanted, self._left)
        chunk = self._head[self._at : self._at + wanted]
        self._at += len(chunk)
        if len(chunk) < wanted:
            chunk += _read(self._fd, wanted - len(chunk))
            chunk += bytes(wanted - len(chunk))
        self._left -= wanted
        return chunk


def _read(fd: int, wanted: int) -> bytes:
    """Up to ``wanted`` bytes of ``fd``, fewer only at its end (or a read error: its end too)."""
    parts, got = [], 0
    while got < wanted:
        try:
            chunk = os.read(fd, min(wanted - got, _READ))
        except OSError:
            break
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _counted(fd: int, limit: int) -> int:
    """The bytes ``fd`` gives from its start to its end; `TooLarge` past ``limit``."""
    os.lseek(fd, 0, os.SEEK_SET)
    count = 0
    while count <= limit:
        chunk = _read(fd, min(_READ, limit + 1 - count))
        if not chunk:
            return count
        count += len(chunk)
    raise TooLarge()


def content(fd: int, said: int, limit: int) -> "tuple[int, object]":
    """(the size of the member, a reader of exactly its bytes) of the regular file ``fd`` whose
    size ``said``; `TooLarge` when it is counted past ``limit`` bytes."""
    held = min(HELD, limit)
    head = _read(fd, held + 1)
    if len(head) <= held:
        size = len(head)
    elif said > held:
        size = said
    else:  # a pseudo-file longer than what is held: counted, then read again
        size = _counted(fd, limit)
        os.lseek(fd, 0, os.SEEK_SET)
        head = b""
    return size, (io.BytesIO(head) if len(head) == size else _Exact(fd, head, size))


def _add(tar: tarfile.TarFile, path: str, limit: int) -> bool:
    """``path``'s member; whether it is a directory to enter."""
    try:
        info = tar.gettarinfo(path)
    except OSError:
        return False
    if info is None:  # a socket
        return False
    if not info.isreg() or info.islnk():
        tar.addfile(info)
        return info.isdir()
    try:
        fd = os.open(path, _FLAGS)
    except OSError:
        return False  # unreadable: left out
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since its lstat: left out
            return False
        try:
            info.size, reader = content(fd, info.size, limit)
        except TooLarge:
            info.size = limit + 1
            tar.fileobj.write(info.tobuf(tar.format, tar.encoding, tar.errors))
            raise
        tar.addfile(info, reader)  # type: ignore[arg-type]
    finally:
        os.close(fd)
    return False


def archive(tar: tarfile.TarFile, name: str, limit: int) -> None:
    """``name`` and, if it is a directory, its tree, depth first."""
    stack = [iter([name])]
    while stack:
        path = next(stack[-1], None)
        if path is None:
            stack.pop()
            continue
        if _add(tar, path, limit):
            try:
                names = os.listdir(path)
            except OSError:
                continue  # unlistable: its member alone, as tar writes it
            prefix = path if path.endswith("/") else path + "/"
            stack.append(iter([prefix + entry for entry in names]))


def main(argv: "list[str]") -> int:
    directory, name, limit = argv[0], argv[1], int(argv[2])
    tarfile.pwd = tarfile.grp = _Names()  # type: ignore[attr-defined]
    os.chdir(directory)
    try:
        with tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.GNU_FORMAT) as tar:
            archive(tar, name, limit)
    except TooLarge:  # the stream closed without its end blocks: the big file's header is its last
        return TOO_LARGE
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
