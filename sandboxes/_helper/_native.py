"""Native file operations in the exec helper: `sandboxes._scripts.WRITE`, ``CAS_WRITE``,
``READ_FILE`` and ``DOWNLOAD`` without starting a process (the reads' answers are sent by
`_reads`, every op is dispatched by `_files`). Imported with `_files` when the helper idles or at
its first file op: stdlib only, Python 3.6-compatible.

Why: the scripts spawn ``cat``, ``stat``, ``mv``, ``md5sum``, ``head`` and ``base64`` (and a
subshell), a process start each, so a write cost four commands; here it is one frame round
trip. Why here and not a ``python3`` command: starting an interpreter costs more than the shell.

The answer is the script's: exit codes from `sandboxes._scripts` (``EXIT_*``) decided in the
script's order, a write's output none, as the script's, so everything above the transport
parses it unchanged; a read's and a download's are the files' bytes as they are (`_reads.RAW`),
where the script's are base64, and their parsers tell the two apart. Same atomic write: the bytes go to
``.sandboxes-write.<token>`` beside the target, created exclusively, renamed over the target
only once the announced size arrived, keeping the target's mode and group (a new file: the mode
the umask gives); parents are created. Where the script writes in place (`_writes_in_place`: a
symlink, another user's file, a directory we may not create entries in), this answers ``N``
(not native here) before touching anything but the parents (which the script would create too),
and the client runs the script. A target that is (or links to) a FIFO, device or socket is
refused (16) by both, never opened: a FIFO must never block a writer.

Frames (see `_server`): F starts an op (``{"op": [name, args...]}``, `marshal`'d: the script's
arguments), I/C carry a write's bytes as they would a command's stdin, K aborts it; the answer
is X (``{code, timed_out}``, a read's O frames before it), E (a bad request) or N. A write's
bytes go to the file as they arrive (memory stays one frame), and a client that goes away leaves
no temporary file behind (`abort_native_ops`).
"""

import errno
import marshal
import os
import stat
import sys

from ._loop import NATIVE_OPS, add_sources, send_exit

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: `typing` is not imported in the sandbox
    from hashlib import md5 as _new_md5
else:
    try:  # built in: hashlib loads OpenSSL, which would weigh on every helper's start
        from _md5 import md5 as _new_md5
    except ImportError:
        from hashlib import md5 as _new_md5

_TOKEN_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_.")
_MAX_PATH = 4096
_HASH_CHUNK = 1 << 20


class _NotNative(Exception):
    """The script must do this one (it writes in place, or this Python cannot hash)."""


class _Answer(Exception):
    def __init__(self, code: int) -> None:
        Exception.__init__(self, code)
        self.code = code


def _parent(path: str) -> str:
    """``${path%/*}``."""
    return path.rpartition("/")[0]


def _why(path: str) -> int:
    """The script's ``why``: why ``path`` could not be used as an existing file."""
    if os.path.isdir(path):
        return 11
    if os.path.lexists(path):
        return 12
    d = _parent(path)
    while d:
        if os.path.exists(d) and not os.path.isdir(d):
            return 13
        if os.path.isdir(d) and not os.access(d, os.X_OK):
            return 12
        d = _parent(d)
    return 10


def _why_not_written(path: str, exc: OSError) -> int:
    """The script's ``failed``: no space, or why (missing reads as refused)."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return 15
    code = _why(path)
    return 12 if code == 10 else code


def _prep(path: str) -> None:
    """The script's ``prep``: the parent directory exists afterwards, or the code saying why not."""
    d = _parent(path)
    if not d or os.path.isdir(d):
        return
    try:
        _makedirs(d)
        return
    except OSError:
        pass
    code = 12
    while d:
        if os.path.exists(d) and not os.path.isdir(d):
            code = 13
        d = _parent(d)
    raise _Answer(code)


def _makedirs(directory: str) -> None:
    """``mkdir -p``, without recursion (`os.makedirs` recurses once per level: a path deeper
    than the recursion limit is one the shell creates). Modes from the umask."""
    missing: "list[str]" = []
    while directory and not os.path.isdir(directory):
        missing.append(directory)
        directory = _parent(directory)
    for path in reversed(missing):
        try:
            os.mkdir(path)
        except FileExistsError:
            if not os.path.isdir(path):
                raise


def _md5(path: str) -> str:
    """Hex md5 of the regular file ``path`` (12: unreadable), never blocking on a FIFO swapped in."""
    try:
        digest = _new_md5()  # noqa: S324 (what the script's md5sum compares)
    except ValueError:  # hashlib's, under FIPS: md5sum still works in the script
        raise _NotNative() from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink now
            raise _NotNative() from None
        raise _Answer(12) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _NotNative()
        while True:
            chunk = os.read(fd, _HASH_CHUNK)
            if not chunk:
                return digest.hexdigest()
            digest.update(chunk)
    except OSError:
        raise _Answer(12) from None
    finally:
        os.close(fd)


def _writes_in_place(path: str) -> bool:
    """The script's ``inplace``: the target exists and a rename would not keep what it is."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if stat.S_ISLNK(st.st_mode):  # written through, or replaced when dangling: the script knows
        return True
    return not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or not os.access(_parent(path) + "/.", os.W_OK)


def _op(payload: bytes) -> "list[str]":
    """The ``[name, args...]`` of an F frame; ValueError when malformed."""
    try:
        spec = marshal.loads(payload)  # noqa: S302 (the client's own request, `wire_spec`)
        op = spec["op"]
        if isinstance(spec.get("sources"), str):  # the modules of an op left out of the bootstrap
            add_sources(spec["sources"])
    except Exception:  # cut short (EOFError), too big (MemoryError), a bad code object (SystemError)...
        raise ValueError("malformed file op") from None
    if not isinstance(op, list) or not op or op[0] not in NATIVE_OPS or not all(isinstance(a, str) for a in op):
        raise ValueError("unknown file op")
    return op


def _spec(op: "list[str]") -> "tuple[str, str, int, str, str | None]":
    """(name, path, size, token, digest or None) of a write or read ``op`` (read_file: size is
    the limit, no token); ValueError when malformed."""
    if op[0] == "read_file" and len(op) == 3:
        name, path, size, token, digest = op[0], op[1], op[2], "-", None
    elif op[0] == "write" and len(op) == 4:
        name, path, size, token, digest = op[0], op[1], op[2], op[3], None
    elif op[0] == "cas_write" and len(op) == 5:
        name, path, digest, size, token = op
        if len(digest) > 32 or not all(c in "0123456789abcdef" for c in digest):
            raise ValueError("bad digest")
    else:
        raise ValueError("wrong arguments for %s" % op[0])
    if not path.startswith("/") or "\0" in path or len(os.fsencode(path)) > _MAX_PATH:  # a lone surrogate: ValueError
        raise ValueError("bad path")
    if not size.isdigit() or len(size) > 19:
        raise ValueError("bad size")
    if not token or len(token) > 64 or not set(token) <= _TOKEN_CHARS:
        raise ValueError("bad token")
    return name, path, int(size), token, digest


class _NativeWrite(object):
    """One write in flight: a temporary file filled as I frames arrive, placed at C."""

    def __init__(self, path: str, size: int, token: str, digest: "str | None") -> None:
        self.path, self.size, self.digest = path, size, digest
        self.temp: "str | None" = _parent(path) + "/.sandboxes-write." + token
        self.fd: "int | None" = None
        self.failure: "OSError | None" = None
        """The OSError that ended the writing: answered at once (`feed_native_op`), so the
        client stops sending (a 6 GiB upload into a full disk sent all of it, then failed)."""
        if digest is not None:  # CAS_WRITE's checks come first, as in the script
            if os.path.islink(path):
                raise _NotNative()
            if not os.path.isfile(path):
                raise _Answer(_why(path))
            if not _md5(path).startswith(digest):
                raise _Answer(14)
        if os.path.isdir(path):
            raise _Answer(11)
        _prep(path)
        if os.path.exists(path) and not os.path.isfile(path):
            raise _Answer(16)  # a FIFO, device or socket (or a link to one): refused, never opened
        if _writes_in_place(path):
            raise _NotNative()
        if os.path.exists(path) and not os.access(path, os.W_OK):
            raise _Answer(12)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            self.fd = os.open(self.temp, flags, 0o666)  # the umask gives a new file its mode, as in sh
        except OSError as exc:
            raise _Answer(_why_not_written(path, exc)) from None

    def feed(self, data: "bytes | memoryview") -> None:
        if self.fd is None or self.failure is not None:
            return
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as exc:
            self.failure = exc
            self.discard()

    def finish(self) -> int:
        """The script's ``place``: the exit code."""
        if self.failure is not None:
            return _why_not_written(self.path, self.failure)
        assert self.fd is not None  # open until it failed
        try:
            written = os.fstat(self.fd).st_size
            os.close(self.fd)
            self.fd = None
        except OSError as exc:
            self.discard()
            return _why_not_written(self.path, exc)
        if written != self.size:
            self.discard()
            return 18
        try:
            code = self.place()
        except _NotNative:  # the target became a symlink meanwhile: hashed through it, the script decides
            code = 14
        if code:
            self.discard()
        return code

    def place(self) -> int:
        if self.digest is not None and not _md5(self.path).startswith(self.digest):
            return 14  # changed while the new bytes arrived: narrower than the script's window
        assert self.temp is not None  # there until placed
        try:
            mine = os.lstat(self.temp)
            target = os.lstat(self.path)
        except OSError:
            target = None
        if target is not None:
            keep = stat.S_IMODE(target.st_mode)
            now: "int | None" = stat.S_IMODE(mine.st_mode)
            if mine.st_gid != target.st_gid:
                try:
                    os.chown(self.temp, -1, target.st_gid)
                    now = None  # chgrp may clear set-id bits: set the mode again
                except OSError:
                    pass
            if now != keep:
                try:
                    os.chmod(self.temp, keep)
                except OSError:
                    return 12
        try:
            os.rename(self.temp, self.path)
        except OSError:
            code = _why(self.path)
            return 12 if code == 10 else code
        self.temp = None
        return 0

    def discard(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None
        if self.temp is not None:
            try:
                os.unlink(self.temp)
            except OSError:
                pass
            self.temp = None


def _answer(ident: int, code: "int | None", timed_out: bool = False) -> None:
    """X for a write, after the events it made (queued by the kernel as it made them) went out
    from every watch open here: whoever polls a watch after the answer finds them."""
    watches = sys.modules.get(__name__.rpartition(".")[0] + "._watch")
    if watches is not None:
        watches.settle()
    send_exit(ident, code, timed_out)
