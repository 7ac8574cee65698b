"""Native multi-file uploads in the exec helper: `sandboxes._scripts.UPLOAD` without starting a
process (imported with `_files`: stdlib only, Python 3.6-compatible; it uses `_native`'s writer
and its answers).

Why: the script spools the stream to a temporary file, then puts each file with a ``tail | head``
pipeline, ``stat``, ``umask``, ``mv``: about six processes a file; here the whole upload is one frame
round trip.

Same arguments as the script (a token, then path and byte count per file) and the same stream
(the files' bytes one after the other, as I frames); the same answer: one status line per file,
in order, then exit 0. Each file is the script's ``put``, which is what `_files`' native write
does (`_NativeWrite`: the bytes go to ``.sandboxes-write.<token>.<k>`` beside the target, renamed
over it once all arrived). A file the script would write in place (a symlink, a FIFO, another
user's file, ...) makes the whole upload go to the script (``N``), decided before a byte is
written. Should one become such a file while the upload runs (the sandbox racing it), that file
answers 12 and is not written: the script cannot take over halfway, since the files before it
are already placed. A stream shorter than announced leaves the files it does not complete
unwritten (18), as the script's spool would; bytes past the announced ones are ignored, as the
script never reads them.
"""

import os

from ._loop import send
from ._native import _Answer, _NativeWrite, _NotNative, _spec, _writes_in_place
from .frames import OUTPUT


def upload_spec(op: "list[str]") -> "tuple[str, list[tuple[str, int]]]":
    """(token, [(path, size)]) of an upload ``op``; ValueError when malformed."""
    if len(op) < 4 or len(op) % 2:
        raise ValueError("wrong arguments for upload")
    token = op[1]
    files: "list[tuple[str, int]]" = []
    for index in range(2, len(op), 2):
        _, path, size, _, _ = _spec(["write", op[index], op[index + 1], token])
        files.append((path, size))
    return token, files


class NativeUpload(object):
    """One upload in flight: its files written one after the other as the stream arrives."""

    failure = None  # never answered early: a failed file's bytes still lead to the next file's

    def __init__(self, ident: int, token: str, files: "list[tuple[str, int]]") -> None:
        for path, _ in files:  # before anything is written: the script does it all
            special = os.path.exists(path) and not os.path.isfile(path)  # refused natively: 11 or 16
            if not special and _writes_in_place(path):
                raise _NotNative()
        self.ident, self.token, self.files = ident, token, files
        self.statuses: "list[int]" = []  # one per file done
        self.writer: "_NativeWrite | None" = None  # the file being written; None: its bytes are skipped (refused)
        self.refused: "int | None" = None
        self.left = 0  # its bytes still to come
        self._begin()

    def _begin(self) -> None:
        """Start the next file; one of no bytes is done at once, and the next started."""
        while len(self.statuses) < len(self.files):
            k = len(self.statuses)
            path, size = self.files[k]
            self.writer, self.refused, self.left = None, None, size
            try:
                self.writer = _NativeWrite(path, size, "%s.%d" % (self.token, k + 1), None)
            except _Answer as refused:  # a directory, a parent that cannot be made, ...
                self.refused = refused.code
            except _NotNative:  # became a file written in place meanwhile: not written
                self.refused = 12
            if size:
                return
            self._end_file()

    def _end_file(self) -> None:
        code = self.refused
        if self.writer is not None:
            try:
                code = self.writer.finish()
            except Exception:  # as `feed_native_op` would, but the files before it are placed
                self.writer.discard()
                code = 12
        self.writer = None
        assert code is not None  # a file is refused or has its writer (`_begin`)
        self.statuses.append(code)

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view and len(self.statuses) < len(self.files):
            part, view = view[: self.left], view[self.left :]
            if self.writer is not None:
                self.writer.feed(part)
            self.left -= len(part)
            if self.left == 0:
                self._end_file()
                self._begin()

    def finish(self) -> int:
        """The stream ended: a file it did not complete is refused by its writer's size check
        (18), as the script's is; the status lines go out; the script's exit code."""
        while len(self.statuses) < len(self.files):
            self._end_file()
            self._begin()
        send(OUTPUT, self.ident, "".join("%d\n" % code for code in self.statuses).encode())
        return 0

    def discard(self) -> None:
        if self.writer is not None:
            self.writer.discard()
            self.writer = None
