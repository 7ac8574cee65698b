"""A snapshot's tar made inside a sandbox by its exec helper, in one command, as the sandbox's
user (`archive_by_helper`): the program `sandboxes._helper._tar` walks the directory and writes
the tar in the snapshot's layout on its stdout, which goes into the store as it arrives, and
answers on its stderr each member's entry (path, type, mode, size, sha256 of the bytes it wrote,
link target): the snapshot's manifest, made in the same pass, as `manifest.keep` makes it of a
``tar -c``.

Every byte of that answer is hostile: counted as it arrives, each line bounded in length, the
lines bounded in number, each path checked (relative, no ``..``), parsed in linear time; an
answer that breaks a bound ends the command. The manifest is the sandbox's word on its own
files: a restore checks every file of the tar against it and refuses what differs
(`sandboxes.server.snapshotting`), so a sandbox that lies spoils only its own snapshot.
"""

from __future__ import annotations

import shlex
import threading
from typing import IO

from sandboxes._mux import HoldsHelper
from sandboxes._mux._shipped import program
from sandboxes.api import WireErrorCode
from sandboxes.server.archive import member_parts
from sandboxes.server.errors import ServiceError
from sandboxes.server.manifest import FileEntry, _inside, _refuse, printable
from sandboxes.server.untar import AnswerLines, _Garbled, helper_channel, known_code
from sandboxes.server.untar import _entry as answered_entry
from sandboxes.server.untar import _text as answered_text

__all__ = ["archive_by_helper"]

_TIMEOUT = 3600.0
_PYTHON = "python3 -I -S -c"
_STDERR_TAIL = 2048
_CODES: tuple[WireErrorCode, ...] = (
    "file_not_found",
    "permission_denied",
    "not_a_directory",
    "too_large",
    "file_changed",
)
"""The program's refusals (`sandboxes._helper._tar`) the service answers as they are; any other
code it sends is answered ``backend_unavailable``."""


class _Answer:
    """The tar (stdout) written into the store and the manifest (stderr) read line by line, as
    they arrive, on the reader's thread: it never raises; what went wrong is kept in
    ``failure`` (the store refused a write) or ``garbled``, and ``stop`` is set."""

    def __init__(self, out: IO[bytes], max_members: int) -> None:
        self.out = out
        self.entries: list[FileEntry] = []
        self.refused: list[str] = []
        self.finished: int | None = None
        self.error: tuple[str, str, str] | None = None
        self.garbled: str | None = None
        self.failure: ServiceError | None = None
        self.tail = b""
        self.stop = threading.Event()
        self._max_lines = max_members + 2
        self._lines = 0
        self._answer_lines = AnswerLines()

    def __call__(self, chunk: bytes, stream: str = "stdout") -> None:
        if self.failure is not None or self.garbled is not None:
            return
        try:
            if stream == "stdout":
                self.out.write(chunk)
            else:
                self._take(chunk)
        except ServiceError as failure:
            self.failure = failure
        except _Garbled as garbled:
            self.garbled = str(garbled)
        except (ValueError, UnicodeDecodeError) as error:
            self.garbled = f"an answer line that does not parse ({error})"
        except OSError as error:
            self.failure = ServiceError("backend_unavailable", f"the snapshot could not be stored: {error}")
        if self.failure is not None or self.garbled is not None:
            self.stop.set()

    def _take(self, chunk: bytes) -> None:
        self.tail = (self.tail + chunk)[-_STDERR_TAIL:]
        for line in self._answer_lines.completed(chunk):
            self._lines += 1
            if self._lines > self._max_lines:
                raise _Garbled(f"more than {self._max_lines} answer lines")
            self._line(line)

    def _line(self, line: bytes) -> None:
        if self.finished is not None or self.error is not None:
            raise _Garbled("an answer line after its last")
        kind, _, rest = line.partition(b" ")
        if kind == b"M":
            entry = answered_entry(rest)
            _check_path(entry.path)
            if entry.type == "symlink" and (entry.link.startswith("/") or not _inside(entry.path, entry.link)):
                self.refused.append(
                    f"{printable(entry.path)} (a symbolic link out of the tree: {printable(entry.link)})"
                )
            else:
                self.entries.append(entry)
        elif kind == b"R":
            name = answered_text(rest)
            _check_path(name)
            self.refused.append(f"{printable(name)} (a device or FIFO)")
        elif kind == b"K":
            self.finished = int(rest)
        elif kind == b"E":
            code, where, message = rest.split(b" ")
            self.error = (code.decode("ascii"), answered_text(where), answered_text(message))
        else:
            raise _Garbled("an answer line of no known kind")


def _check_path(path: str) -> None:
    """A member's path: relative, plain components, no ``..``."""
    try:
        parts = member_parts(path)
    except ServiceError:  # absolute, or with ``..``
        parts = []
    if not path or parts != path.split("/"):
        raise _Garbled(f"a member path that is not a plain relative one: {printable(path)!r}")


def archive_by_helper(sandbox: object, path: str, out: IO[bytes], *, max_members: int) -> list[FileEntry] | None:
    """The snapshot's tar of the directory ``path`` written into ``out`` through the sandbox's
    exec helper; the manifest of what was written. ``None``: the sandbox runs no helper
    (nothing was done). `ServiceError` in the protocol's words if it could not be made."""
    mux = sandbox.exec_helper() if isinstance(sandbox, HoldsHelper) else None
    if mux is None:
        return None
    answer = _Answer(out, max_members)
    command = f"exec {_PYTHON} {shlex.quote(program('_tar'))} {shlex.join([path, str(max_members)])}"
    with helper_channel(mux, command, answer, _TIMEOUT) as channel:
        channel.close_stdin()
        channel.on_end(answer.stop.set)
        answer.stop.wait(_TIMEOUT)
        if not channel.done:
            channel.kill()
        ended = channel.wait(_TIMEOUT)
    return _result(answer, path, None if ended is None else ended.exit_code)


def _result(answer: _Answer, path: str, exit_code: int | None) -> list[FileEntry]:
    if answer.failure is not None:
        raise answer.failure
    if answer.garbled is not None:
        raise ServiceError("backend_unavailable", f"the sandbox's archive of {path} answered {answer.garbled}")
    if answer.error is not None:
        code, name, message = answer.error
        where = f"{path}/{printable(name)}" if name else path
        raise ServiceError(known_code(code, _CODES), f"{where}: {message}")
    if answer.finished is None or exit_code != 0:
        detail = printable(answer.tail.decode("utf-8", "surrogateescape"))[-500:]
        raise ServiceError(
            "backend_unavailable", f"the archive of {path} ended without its answer (exit {exit_code}) {detail}"
        )
    _refuse(answer.refused)
    return answer.entries
