"""Native searches in the exec helper: `sandboxes._scripts.GREP` and ``FIND_FILES`` without
starting a process (imported with `_files` when the helper idles or at its first file op:
stdlib only, Python 3.6-compatible).

Why: the scripts walk with ``find`` and search with ``grep`` (or ``rg``), each a process start
on top of the shell's, so a grep cost four commands and a glob two; here each is one frame round
trip, the walk and the reads done in this process.

The answer is what the script answers once parsed: the same exit codes for a root that is not
there, ``find -P ROOT ( -name N ... ) -type f`` for the files (no symlink followed, not even a
symlinked root; hidden files and names of any bytes included; ``-name`` with ``*`` and ``?``
as `fnmatch` in the C locale sees them), and ``grep -F -n`` for the matches (lines split on LF,
the text as raw bytes, CR kept), in the NUL-named form ``=Z`` of the script's ripgrep path.

Where the tools themselves would disagree, or the result depends on a tool's buffering, this
answers ``N`` and the script decides: a file with a NUL byte past its first 8 KiB holding a
match (``grep`` and ``rg`` stop at the first buffer holding a NUL, 32 KiB or more: a NUL in the
first 8 KiB makes a file binary for both, so it has no matches here either), a UTF-16 BOM
(``rg`` transcodes), a UTF-8 BOM before a match (``rg`` strips it), a ``-name`` pattern with a
bracket expression. And where the work is not bounded: more than `SEARCH_MAX_ENTRIES`
directory entries, `SEARCH_MAX_BYTES` read or (a glob) `SEARCH_MAX_OUTPUT` answered, or
`SEARCH_MAX_SECONDS` spent (this loop serves every other command meanwhile), a path too long
for the kernel (``find`` walks relative to each directory, deeper), a walk that
crosses into another filesystem (``/proc`` answers differently for this process than for
``grep``; a network mount may block), or a root on ``/proc``, ``/sys`` or ``/dev``. Nothing is
sent before the whole answer is known, so handing back costs only the time spent. A grep's
lines stop at `SEARCH_MAX_OUTPUT` bytes, cut there as the script's ``head -c`` cuts them
(``GREP_PART_MAX``): that answer is the script's too.
"""

import os
import re
import stat
import time

from ._native import _why

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: `typing` is not imported in the sandbox
    from collections.abc import Callable

    Matcher = Callable[[bytes], object]  # a basename -> whether it is one of the names

SEARCH_OPS = ["grep", "find_files"]
SEARCH_MAX_ENTRIES = 20000
SEARCH_MAX_BYTES = 16 << 20
SEARCH_MAX_OUTPUT = 8 << 20
SEARCH_MAX_SECONDS = 0.1
_BINARY_PREFIX = 8192
_PSEUDO_ROOTS = (b"/proc", b"/sys", b"/dev")
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
_UTF8_BOM = b"\xef\xbb\xbf"
_SEARCH_MAX_PATH = 4096
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class _HandBack(Exception):
    """The script must answer this one (see the module's docstring)."""


class _Full(Exception):
    """A grep's lines filled ``SEARCH_MAX_OUTPUT``: what was found so far is the answer."""


def search(op: "list[str]") -> "tuple[int, bytes] | None":
    """``(exit code, output)`` of the search ``op`` (its name and the script's arguments as
    `sandboxes.base` passes them natively), or ``None``: run the script. ValueError when
    malformed."""
    if not isinstance(op, list) or len(op) < 2 or not all(isinstance(a, str) for a in op):
        raise ValueError("bad search")
    if op[0] == "grep" and len(op) >= 3:
        root, pattern, names = op[1], op[2], op[3:]
    elif op[0] == "find_files":
        root, pattern, names = op[1], None, op[2:]
    else:
        raise ValueError("wrong arguments for %s" % op[0])
    if not root.startswith("/") or "\0" in root:
        raise ValueError("bad path")
    if len(os.fsencode(root)) >= _SEARCH_MAX_PATH - 1:
        return None  # the kernel refuses it: what the script says then
    if pattern is not None and ("\0" in pattern or "\n" in pattern):
        return None  # no argument holds a NUL; grep splits a pattern at newlines
    try:
        matcher = _name_matcher(names)
        return _Search(os.fsencode(root), None if pattern is None else os.fsencode(pattern), matcher).run()
    except _HandBack:
        return None


def _name_matcher(names: "list[str]") -> "Matcher | None":
    """A predicate over basenames: ``find``'s ``( -name N1 -o -name N2 ... )`` (none: all)."""
    if not names:
        return None
    parts: "list[str]" = []
    for name in names:
        if not name or "[" in name or "\\" in name or "\0" in name:
            raise _HandBack()  # bracket expressions differ between fnmatch(3) and Python's
        pieces = re.split(r"([*?])", name)
        parts.append("".join({"*": ".*", "?": "."}.get(p, re.escape(p)) for p in pieces))
    return re.compile(("(?:%s)" % "|".join(parts)).encode("utf-8", "surrogateescape"), re.DOTALL).fullmatch


class _Search(object):
    def __init__(self, root: bytes, pattern: "bytes | None", matcher: "Matcher | None") -> None:
        self.root, self.pattern, self.matcher = root, pattern, matcher
        self.entries = 0
        self.read = 0
        self.output = [b"=Z\n"] if pattern is not None else []
        self.size = 0
        self.deadline = _now() + SEARCH_MAX_SECONDS

    def run(self) -> "tuple[int, bytes]":
        root = self.root
        if not os.path.exists(root):  # the script's `[ ! -e "$root" ]`: why not
            return _why(os.fsdecode(root)), b""
        try:
            st = os.lstat(root)
        except OSError:
            raise _HandBack() from None
        real = os.path.realpath(root)
        if any(real == pseudo or real.startswith(pseudo + b"/") for pseudo in _PSEUDO_ROOTS):
            raise _HandBack()
        try:
            if stat.S_ISREG(st.st_mode):
                self.found(root, root.rpartition(b"/")[2] or root)
            elif stat.S_ISDIR(st.st_mode):
                self.walk(root, st.st_dev)
        except _Full:
            pass
        return 0, b"".join(self.output)

    def walk(self, root: bytes, device: int) -> None:
        """Depth first, as ``find -P``: no symlink followed, unreadable directories skipped."""
        pending = [root]
        while pending:
            directory = pending.pop()
            try:
                entries = os.scandir(directory)
            except OSError:
                continue
            with entries:
                for entry in entries:
                    self.entries += 1
                    if self.entries > SEARCH_MAX_ENTRIES or ((self.entries & 63) == 0 and _now() > self.deadline):
                        raise _HandBack()
                    if len(entry.path) >= _SEARCH_MAX_PATH - 1:  # the kernel refuses it; find, working
                        raise _HandBack()  # relative to each directory, goes deeper
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            if entry.stat(follow_symlinks=False).st_dev != device:
                                raise _HandBack()  # a mount point: another filesystem's rules
                            pending.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            self.found(entry.path, entry.name)
                    except OSError:  # gone meanwhile: find would not list it either
                        continue

    def found(self, path: bytes, name: bytes) -> None:
        if self.matcher is not None and not self.matcher(name):
            return
        if self.pattern is None:
            self.emit(path + b"\0")
        else:
            self.grep(path)

    def grep(self, path: bytes) -> None:
        """``grep -F -n`` of one file: found with ``find`` and the lines around each match cut
        out, numbered by counting newlines (splitting every line costs ten times more)."""
        data = self.contents(path)
        if not data:
            return
        if data[:2] in _UTF16_BOMS:
            raise _HandBack()
        pattern = self.pattern
        assert pattern is not None  # a grep's (a glob's files are only listed)
        at = data.find(pattern)
        if at == -1:
            return
        nul = data.find(b"\0")
        if nul != -1:
            if nul < _BINARY_PREFIX:
                return  # binary for grep and rg alike: no line of it is printed
            raise _HandBack()
        if data.startswith(_UTF8_BOM):
            raise _HandBack()
        prefix, size = path + b"\0", len(data)
        number, counted = 1, 0
        while at != -1 and at < size:  # at == size: an empty pattern past the last newline
            start = data.rfind(b"\n", 0, at) + 1
            end = data.find(b"\n", at)
            end = size if end == -1 else end
            number += data.count(b"\n", counted, start)
            counted = start
            self.emit(b"%s%d:%s\n" % (prefix, number, data[start:end]))
            at = data.find(pattern, end + 1)

    def contents(self, path: bytes) -> "bytes | None":
        """The bytes of the regular file ``path``, ``None`` if it cannot be opened (as grep's
        complaint, which nobody reads); never blocks on a FIFO swapped in."""
        try:
            fd = os.open(path, _READ_FLAGS)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _HandBack()
            chunks: "list[bytes]" = []
            while True:
                wanted = SEARCH_MAX_BYTES - self.read
                if wanted <= 0:
                    raise _HandBack()
                wanted = min(wanted, st.st_size + 4096)
                chunk = os.read(fd, wanted)
                self.read += len(chunk)
                chunks.append(chunk)
                if len(chunk) < wanted:  # a regular file's short read: its end
                    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        except OSError:  # what grep says then (EIO...) is the script's to tell
            raise _HandBack() from None
        finally:
            os.close(fd)

    def emit(self, data: bytes) -> None:
        room = SEARCH_MAX_OUTPUT - self.size
        self.size += len(data)
        if self.size > SEARCH_MAX_OUTPUT:
            if self.pattern is None:
                raise _HandBack()
            self.output.append(data[:room])  # as the script's ``head -c``: cut at the cap
            raise _Full()
        self.output.append(data)


def _now() -> float:
    return time.monotonic()
