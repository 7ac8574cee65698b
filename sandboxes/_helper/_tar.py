"""A directory's tree written as a snapshot's tar to stdout by the sandbox's own user, and its
manifest answered on stderr, in one pass: the program a snapshot runs as one command through the
exec helper (`sandboxes.server.tarred`), shipped whole as that command's ``python3 -c`` (stdlib
only, Python 3.6-compatible; shipped on demand, never in the helper's bootstrap). Its `head` and
`read` serve the service's own tar of a local root without a jail too
(`sandboxes.server.archive.snapshot_content`): one rule for a file's member.

Arguments: the directory (absolute), the most members. The tar is the snapshot's layout (what
`sandboxes.server.manifest.keep` makes of ``tar -c``): members relative to the directory, in
``tar``'s order (each directory, then what it lists, depth first), PAX headers with the mode,
the whole seconds of mtime and no owner; a hard link is its file again. What the user may not
read is left out, as GNU ``tar --ignore-failed-read`` leaves it; a socket is left out, as tar
leaves it. The directory is walked through descriptors, never following a symbolic link below
it. A file's member is exactly the bytes read of it, hashed as they are written, never what its
size says they are: a file that ends within `HELD` bytes is read whole first, its member as long
as it turned out (a pseudo-file of ``/proc`` or ``/sys`` says 0 bytes or a page whatever it
holds); a longer one streams the bytes its size says (one that grew meanwhile is kept as it was
when first seen, as an appended log's earlier state). One whose size says no more than `HELD` but
reads past them, or one that ends before its size, changed while it was read (or lies about its
size): the answer is ``E file_changed`` naming it, once the member written is whole (zeros for
what was missing), and the snapshot is refused, not kept short or padded.

Answer, one line each on stderr: ``M <path hex> <f|d|l> <mode octal> <size> <sha256 or -> <link
hex or ->`` per member written (`sandboxes._helper._untar`'s grammar); ``R <path hex>`` per device
or FIFO left out (which no archive restores); then ``K <members>`` and exit 0, or ``E <code>
<path hex> <message hex>`` and exit 1 (the protocol's error codes).
"""

import binascii
import errno
import hashlib
import os
import queue
import stat
import sys
import tarfile
import threading

_COPY = 1 << 20
HELD = 1 << 20
"""The most bytes of one file held in memory: a file that ends within them is its member exactly
as read, whatever its size said (a pseudo-file of ``/proc`` or ``/sys`` says 0 or a page)."""
_READ = 64 << 10
"""The most bytes of one read past what a file's size says: a pseudo-file costs no bigger buffer."""
_BY_THREAD = 1 << 18
"""A file this large is hashed on a thread of its own while its bytes are written (hashlib lets
go of the GIL); a smaller one at once."""
_BLOCK = 512
_RECORD = 20 * _BLOCK
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)
"""``O_NONBLOCK``: a FIFO swapped in for a file after its ``lstat`` does not hang the open."""
_ERRNO_CODES = {
    errno.ENOENT: "file_not_found",
    errno.EACCES: "permission_denied",
    errno.EPERM: "permission_denied",
    errno.ENOTDIR: "not_a_directory",
    errno.ELOOP: "invalid_path",
}


class Refused(Exception):
    """The tree cannot be archived: (code, path, message)."""


def _hex(data: bytes) -> bytes:
    return binascii.hexlify(data) or b"-"


class _Hasher:
    """A thread that hashes the chunks given to it, in order, while the caller writes them."""

    def __init__(self) -> None:
        self._queue = queue.Queue(4)  # type: queue.Queue[tuple[object, bytes]]
        thread = threading.Thread(target=self._run)
        thread.daemon = True
        thread.start()

    def _run(self) -> None:
        while True:
            digest, chunk = self._queue.get()
            digest.update(chunk)  # type: ignore[attr-defined]
            self._queue.task_done()

    def update(self, digest: "object", chunk: bytes) -> None:
        self._queue.put((digest, chunk))

    def wait(self) -> None:
        """Once every chunk given is hashed."""
        self._queue.join()


class _Out:
    """The tar on stdout (counted, for the end's padding) and the answer lines on stderr."""

    def __init__(self, tar: "object", answer: "object") -> None:
        self.tar = tar
        self.answer = answer
        self.written = 0
        self.hasher = _Hasher()
        self._lines: "list[bytes]" = []
        self._pending = 0

    def write(self, data: bytes) -> None:
        self.tar.write(data)  # type: ignore[attr-defined]
        self.written += len(data)

    def say(self, line: bytes) -> None:
        self._lines.append(line + b"\n")
        self._pending += len(line) + 1
        if self._pending >= _COPY // 16:
            self.flush()

    def flush(self) -> None:
        """The answer lines said so far, written at once."""
        self.tar.flush()  # type: ignore[attr-defined]
        self.answer.write(b"".join(self._lines))  # type: ignore[attr-defined]
        self.answer.flush()  # type: ignore[attr-defined]
        self._lines, self._pending = [], 0


def _header(name: bytes, kind: bytes, mode: int, mtime: int, size: int = 0, link: bytes = b"") -> bytes:
    info = tarfile.TarInfo(name.decode("utf-8", "surrogateescape"))
    info.type, info.mode, info.mtime, info.size = kind, mode, mtime, size
    info.linkname = link.decode("utf-8", "surrogateescape")
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def read(fd: int, wanted: int) -> bytes:
    """Up to ``wanted`` bytes of ``fd`` in one read; none at its end or at a read error (its end
    too)."""
    try:
        return os.read(fd, wanted)
    except OSError:
        return b""


def head(fd: int, said: int) -> bytes:
    """The file's first bytes, up to `HELD` + 1 and no further (more: it is longer than what is
    held): read as much as its size says, one more, then `_READ` at a time to its end."""
    parts, got = [], 0
    while got <= HELD:
        wanted = said + 1 - got
        chunk = read(fd, min(HELD + 1 - got, wanted if wanted > 1 else _READ))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _zeros(out: _Out, count: int) -> None:
    """``count`` zero bytes written, at most `_COPY` of them held at once."""
    while count:
        out.write(bytes(min(count, _COPY)))
        count -= min(count, _COPY)


def _changed(path: bytes, message: str) -> Refused:
    return Refused("file_changed", path, message + "; the snapshot would not be what the file holds")


def _file(out: _Out, at: int, leaf: bytes, path: bytes, info: "os.stat_result") -> None:
    """The file's member and its ``M`` line: exactly the bytes read, whatever its size said
    (`_held`, `_streamed`); nothing if it cannot be opened (unreadable)."""
    try:
        fd = os.open(leaf, _FILE_FLAGS, dir_fd=at)
    except OSError:
        return
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):  # swapped since the listing: left out
            return
        mode = info.st_mode & 0o7777
        first = head(fd, opened.st_size)
        if len(first) <= HELD:
            size, digest = _held(out, path, mode, int(info.st_mtime), first)
        elif opened.st_size <= HELD:  # a pseudo-file, or one that grew past what is held
            raise _changed(path, "its size said %d bytes, a read gave more than %d" % (opened.st_size, HELD))
        else:
            size, digest = _streamed(out, fd, path, mode, int(info.st_mtime), first, opened.st_size)
    finally:
        os.close(fd)
    out.say(b"M %s f %o %d %s -" % (_hex(path), mode, size, digest.encode("ascii")))


def _held(out: _Out, path: bytes, mode: int, mtime: int, data: bytes) -> "tuple[int, str]":
    """``data``, the whole file, as its member: (its size, its sha256)."""
    out.write(_header(path, tarfile.REGTYPE, mode, mtime, len(data)))
    digest = hashlib.sha256()
    if len(data) < _BY_THREAD:
        digest.update(data)
        out.write(data)
    else:
        out.hasher.update(digest, data)
        out.write(data)
        out.hasher.wait()
    out.write(bytes(-len(data) % _BLOCK))
    return len(data), digest.hexdigest()


def _streamed(out: _Out, fd: int, path: bytes, mode: int, mtime: int, head: bytes, said: int) -> "tuple[int, str]":
    """A file longer than what is held as its member of the ``said`` bytes its size says,
    ``head`` then the rest as it is read, hashed on the hasher's thread meanwhile: (its size, its
    sha256). One that goes on past them is kept as its size said when first seen (an appended
    log: what it held then, as GNU tar keeps it); one that ends before them changed while it was
    read: `Refused` ``file_changed`` once its member is whole (zeros for what was missing)."""
    out.write(_header(path, tarfile.REGTYPE, mode, mtime, said))
    digest, chunk, left = hashlib.sha256(), head, said
    while chunk:
        out.hasher.update(digest, chunk)
        out.write(chunk)
        left -= len(chunk)
        chunk = read(fd, min(left, _COPY)) if left else b""
    _zeros(out, left + -said % _BLOCK)
    out.hasher.wait()
    if left:
        raise _changed(path, "it shrank while it was read: %d of the %d bytes its size said" % (said - left, said))
    return said, digest.hexdigest()


def _entry(out: _Out, at: int, leaf: bytes, path: bytes) -> "tuple[int, int]":
    """One entry of a directory, its member written: (members written, 0 or 1; a descriptor of
    it if it is a directory to enter next, else -1)."""
    try:
        info = os.stat(leaf, dir_fd=at, follow_symlinks=False)
    except OSError:
        return 0, -1
    kind, mode, mtime = stat.S_IFMT(info.st_mode), info.st_mode & 0o7777, int(info.st_mtime)
    if kind == stat.S_IFDIR:
        try:
            fd = os.open(leaf, _DIR_FLAGS, dir_fd=at)
        except OSError:
            fd = -1  # unlistable: its member alone, as tar writes it
        out.write(_header(path, tarfile.DIRTYPE, mode, mtime))
        out.say(b"M %s d %o 0 - -" % (_hex(path), mode))
        return 1, fd
    if kind == stat.S_IFLNK:
        try:
            target = os.readlink(leaf, dir_fd=at)
        except OSError:
            return 0, -1
        out.write(_header(path, tarfile.SYMTYPE, mode, mtime, link=target))
        out.say(b"M %s l 777 0 - %s" % (_hex(path), _hex(target)))
        return 1, -1
    if kind == stat.S_IFREG:
        _file(out, at, leaf, path, info)
        return 1, -1
    if kind == stat.S_IFSOCK:
        return 0, -1
    out.say(b"R %s" % _hex(path))
    return 1, -1  # a member of tar's, which the snapshot refuses


def archive(root: bytes, out: _Out, max_members: int) -> int:
    """The tree under ``root`` as a tar on ``out``, depth first; the count of its members (the
    top counted, as tar's own first member)."""
    try:
        top = os.open(root, _DIR_FLAGS)
    except OSError as error:
        if error.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        top = -1  # a file or a link: tar's one member, the top, which the snapshot leaves out
    count = 1
    stack = [(top, b"", iter(_names(top)))] if top >= 0 else []
    try:
        while stack:
            fd, prefix, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(fd)
                stack.pop()
                continue
            written, child = _entry(out, fd, name, prefix + name)
            count += written
            if count > max_members:
                if child >= 0:
                    os.close(child)
                raise Refused("too_large", b"", "the snapshot would have more than %d entries" % max_members)
            if child >= 0:
                stack.append((child, prefix + name + b"/", iter(_names(child))))
    finally:
        for fd, _prefix, _names_left in stack:
            os.close(fd)
    out.write(bytes(2 * _BLOCK))
    out.write(bytes(-out.written % _RECORD))
    return count


def _names(fd: int) -> "list[bytes]":
    """The names a directory lists, in its own order (tar's), as bytes; none if it cannot be
    listed."""
    try:
        return [os.fsencode(name) for name in os.listdir(fd)]
    except OSError:
        return []


def main(argv: "list[str]") -> int:
    out = _Out(sys.stdout.buffer, sys.stderr.buffer)
    root = argv[0].encode("utf-8", "surrogateescape")
    try:
        count = archive(root, out, int(argv[1]))
    except Refused as refused:
        code, name, message = refused.args
        out.say(b"E %s %s %s" % (code.encode("ascii"), _hex(name), _hex(message.encode("utf-8", "replace"))))
        out.flush()
        return 1
    except OSError as error:
        code = _ERRNO_CODES.get(error.errno or 0, "backend_error")
        message = "%s: %s" % (argv[0], error.strerror or error)
        out.say(b"E %s - %s" % (code.encode("ascii"), _hex(message.encode("utf-8", "replace"))))
        out.flush()
        return 1
    out.say(b"K %d" % count)
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
