# ruff: noqa
# mypy: ignore-errors
"""Native file operations in the exec helper: `sandboxes._scripts.WRITE`, ``CAS_WRITE``,
``READ_FILE`` and ``DOWNLOAD`` without starting a process (shipped inside `_server`'s script,
``SERVER_SOURCE``, as ``NATIVE_SOURCE``, compiled on the first file op: stdlib only, Python
3.6-compatible).

Why: the scripts spawn ``cat``, ``stat``, ``mv``, ``md5sum``, ``head`` and ``base64`` (and a
subshell), ~0.7-1 ms each, so a write cost four times a command; here it is one frame round
trip. Why here and not a ``python3`` command: starting an interpreter costs more than the shell.

The answer is the script's: exit codes from `sandboxes._scripts` (``EXIT_*``) decided in the
script's order, a write's output none, as the script's, so everything above the transport
parses it unchanged; a read's and a download's are the files' bytes as they are (`RAW`), where
the script's are base64, and their parsers tell the two apart. Same atomic write: the bytes go to
``.sandboxes-write.<token>`` beside the target, created exclusively, renamed over the target
only once the announced size arrived, keeping the target's mode and group (a new file: the mode
the umask gives); parents are created. Where the script writes in place (`_writes_in_place`: a
symlink, a device or FIFO, another user's file, a directory we may not create entries in), or a
read is over `NATIVE_READ_MAX` (a download over `NATIVE_DOWNLOAD_MAX`), this answers ``N`` (not
native here) before touching anything but the parents (which the script would create too), and
the client runs the script: a FIFO must never block this single-threaded loop, and a big file
must not hold it.

Frames (see `_server`): F starts an op (JSON ``{"op": [name, args...]}``: the script's
arguments), I/C carry a write's bytes as they would a command's stdin, K aborts it; the answer
is X (``{code, timed_out}``, a read's O frames before it), E (a bad request) or N. A write's
bytes go to the file as they arrive (memory stays one frame), and a client that goes away leaves
no temporary file behind (`abort_native_ops`).
"""

import errno
import json
import os
import stat

try:  # built in: hashlib loads OpenSSL, ~5 ms of every helper's start in a sandbox of one CPU
    from _md5 import md5 as _new_md5
except ImportError:
    from hashlib import md5 as _new_md5

# `NATIVE_OPS` is `_server`'s (its hello names them before this file is compiled), `SEARCH_OPS`
# and `LISTING_OPS` are `_search`'s and `_listing`'s, shipped before this file, `_uploads` after it
NATIVE_READ_MAX = 8 << 20
"""Larger files are read by the script (``N``): this loop reads and sends a file in one go
(see `NATIVE_DOWNLOAD_MAX`)."""
NATIVE_DOWNLOAD_MAX = 8 << 20
"""A download of more bytes in all is left to the script (``N``). It is sent raw (`RAW`), so
no encoding sets this bound (base64 made 512 KiB the break-even with coreutils' once); holding
this single-threaded loop does: the files are read and sent whole, and other commands' output
waits meanwhile, ~1 ms a MiB over a pipe. The Docker, Kubernetes and SSH sandboxes fetch a
file over 1 MiB by their bulk transports anyway."""
RAW = b"\0"
"""The first byte of a native read's or download's answer, which the script's (base64, and a
download's ``!`` lines) never starts with: `sandboxes._parse` tells the two apart by it."""
_OUTPUT_CHUNK = 64 << 10
_TOKEN_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_.")
_MAX_PATH = 4096
_HASH_CHUNK = 1 << 20
_native_ops = {}  # id -> _NativeWrite, until answered


class _NotNative(Exception):
    """The script must do this one (it writes in place, or this Python cannot hash)."""


class _Answer(Exception):
    def __init__(self, code):
        Exception.__init__(self, code)
        self.code = code


def _parent(path):
    """``${path%/*}``."""
    return path.rpartition("/")[0]


def _why(path):
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


def _why_not_written(path, exc):
    """The script's ``failed``: no space, or why (missing reads as refused)."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return 15
    code = _why(path)
    return 12 if code == 10 else code


def _prep(path):
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


def _makedirs(directory):
    """``mkdir -p``, without recursion (`os.makedirs` recurses once per level: a path deeper
    than the recursion limit is one the shell creates). Modes from the umask."""
    missing = []
    while directory and not os.path.isdir(directory):
        missing.append(directory)
        directory = _parent(directory)
    for path in reversed(missing):
        try:
            os.mkdir(path)
        except FileExistsError:
            if not os.path.isdir(path):
                raise


def _md5(path):
    """Hex md5 of the regular file ``path`` (12: unreadable), never blocking on a FIFO swapped in."""
    try:
        digest = _new_md5()
    except ValueError:  # hashlib's, under FIPS: md5sum still works in the script
        raise _NotNative()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink now
            raise _NotNative()
        raise _Answer(12)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _NotNative()
        while True:
            chunk = os.read(fd, _HASH_CHUNK)
            if not chunk:
                return digest.hexdigest()
            digest.update(chunk)
    except OSError:
        raise _Answer(12)
    finally:
        os.close(fd)


def _writes_in_place(path):
    """The script's ``inplace``: the target exists and a rename would not keep what it is."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if stat.S_ISLNK(st.st_mode):  # written through, or replaced when dangling: the script knows
        return True
    return not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or not os.access(_parent(path) + "/.", os.W_OK)


def _op(payload):
    """The ``[name, args...]`` of an F frame; ValueError when malformed."""
    op = json.loads(payload.decode("utf-8"))["op"]
    if not isinstance(op, list) or not op or op[0] not in NATIVE_OPS or not all(isinstance(a, str) for a in op):
        raise ValueError("unknown file op")
    return op


def _spec(op):
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

    def __init__(self, path, size, token, digest):
        self.path, self.size, self.digest = path, size, digest
        self.temp = _parent(path) + "/.sandboxes-write." + token
        self.fd = None
        self.failure = None
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
        if _writes_in_place(path):
            raise _NotNative()
        if os.path.exists(path) and not os.access(path, os.W_OK):
            raise _Answer(12)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            self.fd = os.open(self.temp, flags, 0o666)  # the umask gives a new file its mode, as in sh
        except OSError as exc:
            raise _Answer(_why_not_written(path, exc))

    def feed(self, data):
        if self.fd is None or self.failure is not None:
            return
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as exc:
            self.failure = exc
            self.discard()

    def finish(self):
        """The script's ``place``: the exit code."""
        if self.failure is not None:
            return _why_not_written(self.path, self.failure)
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

    def place(self):
        if self.digest is not None and not _md5(self.path).startswith(self.digest):
            return 14  # changed while the new bytes arrived: narrower than the script's window
        try:
            mine = os.lstat(self.temp)
            target = os.lstat(self.path)
        except OSError:
            target = None
        if target is not None:
            keep = stat.S_IMODE(target.st_mode)
            now = stat.S_IMODE(mine.st_mode)
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

    def discard(self):
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


def _open_regular(path):
    """An fd of the regular file at ``path`` (through symlinks), opened as the scripts' ``[ -f ]``
    then ``true < "$f"`` would find it; else `_Answer` with their code. Never opens what is not
    a regular file (a FIFO would block this loop)."""
    try:
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        regular = False
    if not regular:
        code = _why(path)
        raise _Answer(16 if code == 12 and os.path.exists(path) else code)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        raise _Answer(12)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped meanwhile
        os.close(fd)
        raise _NotNative()
    return fd


def _read_at_most(fd, wanted):
    """Up to ``wanted`` bytes of ``fd`` (fewer at its end); closes it. `_NotNative` on a read
    error: what ``head`` or ``base64`` does then is the script's to say."""
    data = bytearray()
    try:
        while len(data) < wanted:
            chunk = os.read(fd, wanted - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:
        raise _NotNative()
    finally:
        os.close(fd)
    return bytes(data)


def _send_output(ident, output):
    for offset in range(0, len(output), _OUTPUT_CHUNK):
        send(b"O", ident, output[offset : offset + _OUTPUT_CHUNK])


def _read_file(ident, path, limit):
    """`sandboxes._scripts.READ_FILE`: at most ``limit`` bytes of the file, or why not; sent as
    `RAW` and the bytes, where the script sends base64 (Python's encoding cost 1 ms a MiB, the
    client's decoding 2.4)."""
    fd = _open_regular(path)
    if os.fstat(fd).st_size > NATIVE_READ_MAX and limit > NATIVE_READ_MAX:  # most likely too much: not read in vain
        os.close(fd)
        raise _NotNative()
    data = _read_at_most(fd, min(limit, NATIVE_READ_MAX + 1))
    if len(data) > NATIVE_READ_MAX:
        raise _NotNative()
    if len(data) < _OUTPUT_CHUNK:
        send(b"O", ident, RAW + data)  # one frame: a file agents read is most often small
    else:
        send(b"O", ident, RAW)  # not a copy of a big file's bytes
        _send_output(ident, data)
    raise _Answer(0)


def download(op):
    """`sandboxes._scripts.DOWNLOAD`'s ``(exit code, output)`` for ``op`` (its arguments: a limit,
    ``-`` for none, then the paths), or ``None``: run the script. ValueError when malformed."""
    limit, paths = _download_spec(op)
    try:
        return 0, _download_output(limit, paths)
    except _NotNative:
        return None


def _download_spec(op):
    """(limit, paths) of a download ``op``; ValueError when malformed."""
    limit, paths = (op[1], op[2:]) if len(op) > 2 else (None, [])
    if not (limit == "-" or (limit is not None and limit.isdigit() and len(limit) <= 19)) or not paths:
        raise ValueError("wrong arguments for download")
    for path in paths:  # a lone surrogate: ValueError
        if not path.startswith("/") or "\0" in path or len(os.fsencode(path)) > _MAX_PATH:
            raise ValueError("bad path")
    return limit, paths


def _download_output(limit, paths):
    """`RAW`, then per file ``<status> <length>\\n`` and that many bytes of it as they
    are: the script's statuses, its bytes without base64 (encoding cost Python 1 ms a MiB,
    decoding the client 2.4). Built whole before a byte is sent, so that a download over
    `NATIVE_DOWNLOAD_MAX` in all can still go back to the script (`_NotNative`)."""
    output, budget = [RAW], NATIVE_DOWNLOAD_MAX
    for path in paths:
        try:
            fd = _open_regular(path)
        except _Answer as failed:
            output.append(b"%d 0\n" % failed.code)
            continue
        size = os.fstat(fd).st_size
        if limit != "-" and size > int(limit):  # `wc -c` counts what a read gives: st_size for a regular file
            os.close(fd)
            output.append(b"17 0\n")
            continue
        if size > budget:  # most likely too much: not read in vain
            os.close(fd)
            raise _NotNative()
        data = _read_at_most(fd, budget + 1)  # it may have grown since
        budget -= len(data)
        if budget < 0:
            raise _NotNative()
        output.append(b"0 %d\n" % len(data))
        output.append(data)
    return b"".join(output)


def _answer(ident, code, timed_out=False):
    send(b"X", ident, json.dumps({"code": code, "timed_out": timed_out}).encode(), answer=True)


def start_native_op(ident, payload):
    """F: check and open; answer at once when the script would have stopped before reading."""
    send(b"A", ident)
    try:
        if ident in _native_ops:
            raise ValueError("op %d is already in flight" % ident)
        op = _op(payload)
        if op[0] in SEARCH_OPS:
            _answer_whole(ident, op, search)
            return
        if op[0] in LISTING_OPS:
            _answer_whole(ident, op, listing)
            return
        if op[0] == "download":
            _answer_whole(ident, op, download)
            return
        if op[0] == "upload":  # `_uploads`, shipped after this file
            _start_upload(ident, upload_spec(op))
            return
        name, path, size, token, digest = _spec(op)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        send(b"E", ident, ("bad file op: %s" % (exc,)).encode("utf-8", "replace"), answer=True)
        return
    try:
        if name == "read_file":
            _read_file(ident, path, size)
        _native_ops[ident] = _NativeWrite(path, size, token, digest)
    except _NotNative:
        send(b"N", ident, answer=True)
    except _Answer as done:
        _answer(ident, done.code)
    except Exception:  # a surprise here must not end the helper: before any byte is placed, the script decides
        send(b"N", ident, answer=True)


def _start_upload(ident, spec):
    try:
        _native_ops[ident] = NativeUpload(ident, *spec)
    except Exception:  # one is written in place (_NotNative), or a surprise: nothing placed yet
        send(b"N", ident, answer=True)


def _answer_whole(ident, op, answer_for):
    """The answer of `download`, `_search.search` or `_listing.listing` (``answer_for``): its
    output, then its exit code; or N. Answered whole, at once."""
    try:
        answer = answer_for(op)
    except ValueError:
        raise
    except Exception:  # a surprise must not end the helper: the script decides (a delete: finishes)
        answer = None
    if answer is None:
        send(b"N", ident, answer=True)
        return
    code, output = answer
    _send_output(ident, output)
    _answer(ident, code)


def feed_native_op(kind, ident, payload):
    """I, C or K for an op in flight (anything else, or an op already answered: ignored)."""
    op = _native_ops.get(ident)
    if op is None:
        return
    if kind == b"I":
        op.feed(payload)
        if op.failure is not None:  # answered now: the client stops sending the rest
            del _native_ops[ident]
            _answer(ident, op.finish())
        return
    del _native_ops[ident]
    if kind == b"K":  # the client's timeout: nothing is placed
        op.discard()
        _answer(ident, None, timed_out=True)
        return
    try:
        code = op.finish()
    except Exception as exc:  # as in `start_native_op`
        op.discard()
        send(b"E", ident, ("%s: %s" % (type(exc).__name__, exc)).encode("utf-8", "replace"), answer=True)
        return
    _answer(ident, code)


def abort_native_ops():
    """The client is gone: nobody will send the rest, so no op is placed and no temp file stays."""
    for op in list(_native_ops.values()):
        op.discard()
    _native_ops.clear()
