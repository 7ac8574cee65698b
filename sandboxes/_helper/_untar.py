"""A tar read from stdin extracted under a directory by the sandbox's own user, in one pass, each
member answered with what was written (the manifest's fields) as it is done: the program a
restore runs as one command through the exec helper (`sandboxes.server.untar`), shipped whole as
that command's ``python3 -c`` (stdlib only, Python 3.6-compatible; shipped on demand, never in
the helper's bootstrap).

Arguments: the destination (absolute), the most members, the most bytes of content. Every path
is opened one component at a time with ``O_NOFOLLOW`` from ``/``, the destination's as each
member's: no symbolic link, whoever made it, leads a member anywhere (`sandboxes._beneath`'s rule
on the host); on the way to the destination, only a link the user could not have made is
followed (`_destination`). A file is written under a staged name beside its target and renamed over it once
whole; a symbolic link is made the same way; modes are an archive upload's (no special bits, a
file of none ``0644``, a directory always its owner's ``rwx``).

Answer, one line each on stdout: ``A <bytes>`` every `ACK_EVERY` bytes read from stdin (the
sender's window); ``M <path hex> <f|d|l> <mode octal> <size> <sha256 or -> <link hex or ->`` per
member written; then ``K <members>`` and exit 0, or ``E <code> <path hex> <message hex>`` and
exit 1 at the first member that cannot be written (the protocol's error codes).
"""

import binascii
import errno
import hashlib
import os
import sys
import tarfile

ACK_EVERY = 1 << 20
"""Bytes of stdin between two ``A`` lines."""
MAX_NAME = 4096
"""The longest member name or link target, in bytes."""
MAX_COMPONENT = 255
_MAX_HOPS = 40
"""Symbolic links followed on the way to the destination, at most (the kernel's own bound)."""
_COPY = 1 << 16
"""Bytes read at once, from stdin and of a member: tarfile's stream copies what it buffers at
each read, so small reads cost less than large ones."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""The destination's own components: passed through, which a parent the user may only search
(SSH's workspace root) allows, where opening it for reading does not."""
_ERRNO_CODES = {
    errno.ENOSPC: "no_space",
    errno.EDQUOT: "no_space",
    errno.EACCES: "permission_denied",
    errno.EPERM: "permission_denied",
    errno.EROFS: "permission_denied",
    errno.ELOOP: "invalid_path",
    errno.ENOTDIR: "not_a_directory",
    errno.EISDIR: "is_directory",
    errno.ENOTEMPTY: "is_directory",
    errno.ENAMETOOLONG: "invalid_path",
}


class Refused(Exception):
    """A member that may not be written: (code, path, message)."""


class _Through(Exception):
    """A component of a member's path is a symbolic link: (the component,)."""


class _Stdin:
    """The archive's bytes as they are read, counted, acknowledged every `ACK_EVERY`."""

    def __init__(self, raw: "object", out: "object") -> None:
        self.raw = raw
        self.out = out
        self.count = 0
        self.acked = 0

    def read(self, size: int = -1) -> bytes:
        data: bytes = self.raw.read(size)  # type: ignore[attr-defined]
        self.count += len(data)
        if self.count - self.acked >= ACK_EVERY:
            self.acked = self.count
            _say(self.out, b"A %d" % self.count)
        return data


def _say(out: "object", line: bytes) -> None:
    out.write(line + b"\n")  # type: ignore[attr-defined]
    out.flush()  # type: ignore[attr-defined]


def _hex(data: bytes) -> bytes:
    return binascii.hexlify(data) or b"-"


def _parts(name: bytes) -> "list[bytes]":
    """A member name's components: refused if absolute, with ``..`` or NUL, or too long."""
    if name.startswith(b"/") or b"\0" in name:
        raise Refused("invalid_path", name, "an absolute name")
    if len(name) > MAX_NAME:
        raise Refused("invalid_path", name[:MAX_NAME], "a name longer than %d bytes" % MAX_NAME)
    parts = [part for part in name.split(b"/") if part not in (b"", b".")]
    if b".." in parts:
        raise Refused("invalid_path", name, "a name with '..'")
    if any(len(part) > MAX_COMPONENT for part in parts):
        raise Refused("invalid_path", name, "a component longer than %d bytes" % MAX_COMPONENT)
    return parts


def _check_link(name: bytes, parts: "list[bytes]", target: bytes) -> None:
    """A link may point only inside the destination, relatively (the archive's rule)."""
    if not target or target.startswith(b"/") or b"\0" in target or len(target) > MAX_NAME:
        raise Refused("invalid_path", name, "a symbolic link to an absolute path")
    depth = len(parts) - 1
    for part in target.split(b"/"):
        if part == b"..":
            depth -= 1
            if depth < 0:
                raise Refused("invalid_path", name, "a symbolic link out of the archive")
        elif part not in (b"", b"."):
            depth += 1


def _open_dir(at: int, name: bytes, mode: int, flags: int = _DIR_FLAGS) -> int:
    """The directory ``name`` in ``at``, made if missing, never through a symbolic link
    (`_Through` if it is one)."""
    try:
        return _opened_dir(at, name, flags)
    except FileNotFoundError:
        try:
            os.mkdir(name, mode, dir_fd=at)
        except FileExistsError:
            pass
        return _opened_dir(at, name, flags)


def _opened_dir(at: int, name: bytes, flags: int) -> int:
    try:
        return os.open(name, flags, dir_fd=at)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(at, name):
            raise _Through(name) from None
        raise


def _is_link(at: int, name: bytes) -> bool:
    try:
        return os.stat(name, dir_fd=at, follow_symlinks=False).st_mode & 0o170000 == 0o120000
    except OSError:
        return False


def _destination(dest: bytes) -> int:
    """The directory ``dest``, made if missing, opened from ``/`` one component at a time. A
    symbolic link on the way is followed only where the user could not have made it (its
    directory is not one the user may write: ``/home -> var/home`` on a host); any other is
    refused, as it may be the sandbox's own."""
    fd, pending, hops = os.open(b"/", _PATH_FLAGS), [part for part in dest.split(b"/") if part], 0
    try:
        while pending:
            part = pending.pop(0)
            if part == b".":
                continue
            try:
                opened = _open_dir(fd, part, 0o755, _PATH_FLAGS)
            except _Through:
                hops += 1
                if hops > _MAX_HOPS or os.access(b".", os.W_OK, dir_fd=fd):
                    raise Refused("invalid_path", dest, "goes through a symbolic link: not followed") from None
                target = os.readlink(part, dir_fd=fd)
                pending[:0] = [each for each in target.split(b"/") if each]
                if target.startswith(b"/"):
                    opened = os.open(b"/", _PATH_FLAGS)
                else:
                    continue
            os.close(fd)
            fd = opened
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Tree:
    """The destination's directory, and the last member's parent held open for its siblings."""

    def __init__(self, dest: bytes) -> None:
        self.fd = _destination(dest)
        self._parent: "tuple[tuple[bytes, ...], int] | None" = None

    def parent(self, parts: "list[bytes]") -> int:
        key = tuple(parts[:-1])
        if self._parent is not None and self._parent[0] == key:
            return self._parent[1]
        self.release()
        fd = os.dup(self.fd)
        try:
            for part in key:
                opened = _open_dir(fd, part, 0o700)
                os.close(fd)
                fd = opened
        except BaseException:
            os.close(fd)
            raise
        self._parent = (key, fd)
        return fd

    def release(self) -> None:
        if self._parent is not None:
            os.close(self._parent[1])
            self._parent = None


class _Budget:
    def __init__(self, max_bytes: int) -> None:
        self.left = max_bytes

    def take(self, size: int, name: bytes) -> None:
        self.left -= size
        if self.left < 0:
            raise Refused("too_large", name, "the archive expands to more bytes than allowed")


def _staged() -> bytes:
    return b".sandboxes-write." + binascii.hexlify(os.urandom(8))


def _write_file(
    parent: int, leaf: bytes, content: "object", mode: int, mtime: float, budget: _Budget, name: bytes
) -> "tuple[int, str]":
    """(size, sha256) of ``content`` written under a staged name, renamed over ``leaf``."""
    _refuse_directory(parent, leaf, name)
    temp, digest, size = _staged(), hashlib.sha256(), 0
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent)
    try:
        with os.fdopen(fd, "wb") as target:
            while True:
                chunk = content.read(_COPY)  # type: ignore[attr-defined]
                if not chunk:
                    break
                budget.take(len(chunk), name)
                digest.update(chunk)
                size += len(chunk)
                target.write(chunk)
            target.flush()
            os.fchmod(target.fileno(), mode)
            os.utime(target.fileno(), (mtime, mtime))
        os.replace(temp, leaf, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        _unlink(parent, temp)
        raise
    return size, digest.hexdigest()


def _write_link(parent: int, leaf: bytes, target: bytes, name: bytes) -> None:
    _refuse_directory(parent, leaf, name)
    temp = _staged()
    os.symlink(target, temp, dir_fd=parent)
    try:
        os.replace(temp, leaf, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        _unlink(parent, temp)
        raise


def _unlink(parent: int, name: bytes) -> None:
    try:
        os.unlink(name, dir_fd=parent)
    except OSError:
        pass


def _refuse_directory(parent: int, leaf: bytes, name: bytes) -> None:
    try:
        info = os.stat(leaf, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if info.st_mode & 0o170000 == 0o040000:
        raise Refused("is_directory", name, "would replace a directory")


def _member(tar: "tarfile.TarFile", member: "tarfile.TarInfo", tree: _Tree, budget: _Budget) -> "bytes | None":
    """Write ``member``; its ``M`` line (``None``: the destination itself)."""
    name = member.name.encode("utf-8", "surrogateescape")
    if not (member.isreg() or member.isdir() or member.issym()):
        raise Refused("invalid_request", name, "only files, directories and symbolic links")
    parts = _parts(name)
    if not parts:
        return None
    path = b"/".join(parts)
    mode = member.mode & 0o777
    try:
        parent = tree.parent(parts)
        if member.isdir():
            os.close(_set_dir(parent, parts[-1], (mode or 0o755) | 0o700))
            return b"M %s d %o 0 - -" % (_hex(path), member.mode & 0o7777)
        if member.issym():
            target = member.linkname.encode("utf-8", "surrogateescape")
            _check_link(name, parts, target)
            _write_link(parent, parts[-1], target, name)
            return b"M %s l 777 0 - %s" % (_hex(path), _hex(target))
        content = tar.extractfile(member)
        size, sha = _write_file(parent, parts[-1], content, mode or 0o644, member.mtime, budget, name)
        return b"M %s f %o %d %s -" % (_hex(path), member.mode & 0o7777, size, sha.encode("ascii"))
    except _Through as through:
        link = through.args[0].decode("utf-8", "replace")
        raise Refused("invalid_path", name, "goes through the symbolic link %s: not followed" % link) from None
    except OSError as error:
        raise Refused(_ERRNO_CODES.get(error.errno or 0, "backend_error"), name, error.strerror or str(error)) from None


def _set_dir(parent: int, leaf: bytes, mode: int) -> int:
    fd = _open_dir(parent, leaf, mode)
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def extract(dest: bytes, stdin: _Stdin, out: "object", max_members: int, max_bytes: int) -> int:
    """Extract the tar on ``stdin`` under ``dest``, an ``M`` line for each member; their count."""
    tree = _Tree(dest)
    budget, count = _Budget(max_bytes), 0
    try:
        with tarfile.open(  # type: ignore[call-overload]  # any object with read() will do
            fileobj=stdin, mode="r|", bufsize=_COPY, encoding="utf-8", errors="surrogateescape"
        ) as tar:
            for member in tar:
                count += 1
                if count > max_members:
                    raise Refused("too_large", b"", "the archive has more than %d members" % max_members)
                line = _member(tar, member, tree, budget)
                if line is not None:
                    _say(out, line)
        while stdin.read(_COPY):  # what follows the end of the archive, read to the end
            pass
    finally:
        tree.release()
        os.close(tree.fd)
    return count


def main(argv: "list[str]") -> int:
    out = sys.stdout.buffer
    stdin = _Stdin(sys.stdin.buffer, out)
    try:
        dest = argv[0].encode("utf-8", "surrogateescape")
        count = extract(dest, stdin, out, int(argv[1]), int(argv[2]))
    except Refused as refused:
        code, name, message = refused.args
        _say(out, b"E %s %s %s" % (code.encode("ascii"), _hex(name), _hex(message.encode("utf-8", "replace"))))
        return 1
    except (tarfile.TarError, EOFError):
        _say(out, b"E invalid_request - %s" % _hex(b"not a readable tar stream (truncated or corrupt)"))
        return 1
    except OSError as error:
        code = _ERRNO_CODES.get(error.errno or 0, "backend_error")
        message = "%s: %s" % (argv[0], error.strerror or error)
        _say(out, b"E %s - %s" % (code.encode("ascii"), _hex(message.encode("utf-8", "replace"))))
        return 1
    _say(out, b"K %d" % count)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
