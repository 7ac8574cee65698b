"""A snapshot's tar extracted inside a sandbox by its exec helper, in one command, as the
sandbox's user (`extract_by_helper`): the tar streams into the program `sandboxes._helper._untar`
on a channel (`sandboxes._mux.open_channel`), which writes every member without following a
symbolic link and answers, per member, what it wrote (path, type, mode, size, sha256, link
target): the manifest of the restored tree, read in the same pass, as `manifest.Witness` reads
it where the service writes the files itself.

Every byte of that answer is hostile: counted as it arrives, each line bounded in length, the
lines bounded in number, parsed in linear time; an answer that breaks a bound ends the command.
The tar is sent no further ahead of what the program acknowledged than `WINDOW` bytes, so the
helper never holds more of it than that.
"""

from __future__ import annotations

import binascii
import contextlib
import shlex
import threading
import time
from collections.abc import Iterator
from typing import IO

from sandboxes._mux import Channel, Command, HoldsHelper, MuxBroken, MuxClient, open_channel
from sandboxes._mux._shipped import program
from sandboxes._output import OutputHook
from sandboxes.api import WireErrorCode
from sandboxes.server.errors import ServiceError
from sandboxes.server.manifest import FileEntry, Kind, printable

__all__ = ["WINDOW", "AnswerLines", "extract_by_helper", "helper_channel", "known_code"]

WINDOW = 8 << 20
"""Bytes of the tar sent beyond what the program acknowledged reading, at most."""
_CHUNK = 256 << 10
_ACK_EVERY = 1 << 20
_MAX_LINE = 2 * 2 * 4096 + 256
"""The longest answer line: two names of 4,096 bytes in hex, and the rest."""
_MAX_STDERR = 64 << 10
_TIMEOUT = 3600.0
_CODES: tuple[WireErrorCode, ...] = (
    "no_space",
    "permission_denied",
    "invalid_path",
    "not_a_directory",
    "is_directory",
    "too_large",
    "invalid_request",
)
"""The program's refusals (`sandboxes._helper._untar`) the service answers as they are; any other
code it sends is answered ``backend_unavailable``."""
_KINDS: dict[bytes, Kind] = {b"f": "file", b"d": "dir", b"l": "symlink"}
_PYTHON = "python3 -I -S -c"


class _Garbled(Exception):
    """The program's answer broke a bound or its grammar."""


class _Answer:
    """The program's answer, read line by line as it arrives (on the reader's thread: it never
    raises; a broken answer is kept in ``garbled``)."""

    def __init__(self, max_members: int, max_acks: int) -> None:
        self.entries: list[FileEntry] = []
        self.acked = 0
        self.sent = 0
        """Bytes of the tar sent so far."""
        self.finished: int | None = None
        self.error: tuple[WireErrorCode, str, str] | None = None
        self.garbled: str | None = None
        self.stderr = b""
        self._max_members = max_members
        self._max_acks = max_acks
        self._acks = 0
        self._lines = AnswerLines()
        self._stderr_bytes = 0
        self.changed = threading.Condition()

    def room(self) -> bool:
        """Whether the tar may go further: what was sent is within `WINDOW` of the acknowledged."""
        return self.sent - self.acked <= WINDOW

    def __call__(self, chunk: bytes, stream: str = "stdout") -> None:
        with self.changed:
            try:
                if stream == "stdout":
                    self._take(chunk)
                else:
                    self._stderr_bytes += len(chunk)
                    self.stderr = (self.stderr + chunk)[:2048]
                    if self._stderr_bytes > _MAX_STDERR:
                        raise _Garbled(f"more than {_MAX_STDERR} bytes on stderr")
            except _Garbled as garbled:
                self.garbled = self.garbled or str(garbled)
            except (ValueError, UnicodeDecodeError, binascii.Error) as error:
                self.garbled = self.garbled or f"an answer line that does not parse ({error})"
            self.changed.notify_all()

    def _take(self, chunk: bytes) -> None:
        if self.garbled is not None:
            return
        for line in self._lines.completed(chunk):
            self._line(line)

    def _line(self, line: bytes) -> None:
        if self.finished is not None or self.error is not None:
            raise _Garbled("an answer line after its last")
        kind, _, rest = line.partition(b" ")
        if kind == b"A":
            self._acks += 1
            if self._acks > self._max_acks:
                raise _Garbled("more acknowledgements than the tar has megabytes")
            self.acked = int(rest)
        elif kind == b"M":
            if len(self.entries) >= self._max_members:
                raise _Garbled(f"more than {self._max_members} members answered")
            self.entries.append(_entry(rest))
        elif kind == b"K":
            self.finished = int(rest)
        elif kind == b"E":
            code, path, message = rest.split(b" ")
            self.error = (known_code(code.decode("ascii"), _CODES), _text(path), _text(message))
        else:
            raise _Garbled("an answer line of no known kind")


class AnswerLines:
    """A program's answer cut into lines as it arrives: each line, whole or still partial, at
    most `_MAX_LINE` bytes (`_Garbled` past it)."""

    def __init__(self) -> None:
        self.partial = b""

    def completed(self, chunk: bytes) -> Iterator[bytes]:
        """The lines ``chunk`` completes, in order, each checked when it is reached."""
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) > _MAX_LINE:
            raise _Garbled(f"an answer line longer than {_MAX_LINE} bytes")
        for line in lines:
            if len(line) > _MAX_LINE:
                raise _Garbled(f"an answer line longer than {_MAX_LINE} bytes")
            yield line


def known_code(code: str, codes: tuple[WireErrorCode, ...]) -> WireErrorCode:
    """A program's refusal code if it is one of ``codes``, else ``backend_unavailable``."""
    for known in codes:
        if known == code:
            return known
    return "backend_unavailable"


@contextlib.contextmanager
def helper_channel(mux: MuxClient, command: str, on_output: OutputHook, timeout: float) -> Iterator[Channel]:
    """A channel of ``mux`` running ``command``, killed on the way out if it still runs; the
    helper breaking, at its start or meanwhile, is `ServiceError` ``backend_unavailable``."""
    try:
        channel = open_channel(mux, Command(command, timeout, output_limit=0, cwd="/"), on_output=on_output)
    except MuxBroken as broken:
        raise ServiceError("backend_unavailable", f"the sandbox's exec helper broke: {broken}") from broken
    try:
        yield channel
    except MuxBroken as broken:
        raise ServiceError("backend_unavailable", f"the sandbox's exec helper broke: {broken}") from broken
    finally:
        if not channel.done:
            channel.kill()


def _text(field: bytes) -> str:
    return "" if field == b"-" else binascii.unhexlify(field).decode("utf-8", "surrogateescape")


def _entry(fields: bytes) -> FileEntry:
    """An ``M`` line's entry (`sandboxes._helper._untar`'s grammar)."""
    path, kind, mode, size, sha, link = fields.split(b" ")
    entry_mode, entry_size = int(mode, 8), int(size)
    if kind not in _KINDS or not 0 <= entry_mode <= 0o7777 or entry_size < 0:
        raise _Garbled("an entry of no known type, mode or size")
    digest = "" if sha == b"-" else sha.decode("ascii")
    if digest and (len(digest) != 64 or digest.strip("0123456789abcdef")):
        raise _Garbled("an entry whose sha256 is not one")
    return FileEntry(_text(path), _KINDS[kind], entry_mode, entry_size, digest, _text(link))


def extract_by_helper(
    sandbox: object, dest: str, archive: IO[bytes], size: int, *, max_members: int, max_bytes: int
) -> list[FileEntry] | None:
    """Extract the tar ``archive`` (``size`` bytes) under ``dest`` through the sandbox's exec
    helper; the entries it wrote. ``None``: the sandbox runs no helper (nothing was done).
    `ServiceError` in the protocol's words if a member could not be written, naming it."""
    mux = sandbox.exec_helper() if isinstance(sandbox, HoldsHelper) else None
    if mux is None:
        return None
    answer = _Answer(max_members, size // _ACK_EVERY + 2)
    command = f"exec {_PYTHON} {shlex.quote(program('_untar'))} {shlex.join([dest, str(max_members), str(max_bytes)])}"
    with helper_channel(mux, command, answer, _TIMEOUT) as channel:
        _send(channel, archive, answer)
        ended = channel.wait(_TIMEOUT)
    return _result(answer, dest, None if ended is None else ended.exit_code)


def _send(channel: Channel, archive: IO[bytes], answer: _Answer) -> None:
    """The tar into the channel, never more than `WINDOW` bytes beyond the acknowledged; stops
    early once the program answered its last line, or broke a bound."""
    deadline = time.monotonic() + _TIMEOUT
    while chunk := archive.read(_CHUNK):
        with answer.changed:
            answer.changed.wait_for(lambda: _stopped(channel, answer) or answer.room(), deadline - time.monotonic())
            if _stopped(channel, answer):
                return
            if not answer.room():
                raise ServiceError("backend_unavailable", "the sandbox stopped reading the snapshot's tar")
        channel.write(chunk)
        answer.sent += len(chunk)
    channel.close_stdin()


def _stopped(channel: Channel, answer: _Answer) -> bool:
    if answer.garbled is not None:
        channel.kill()
        return True
    return channel.done or answer.error is not None or answer.finished is not None


def _result(answer: _Answer, dest: str, exit_code: int | None) -> list[FileEntry]:
    if answer.garbled is not None:
        raise ServiceError("backend_unavailable", f"the sandbox's extraction under {dest} answered {answer.garbled}")
    if answer.error is not None:
        code, path, message = answer.error
        where = printable(path) if path.startswith("/") else f"{dest}/{printable(path)}" if path else dest
        raise ServiceError(code, f"{where}: {message}")
    if answer.finished is None or exit_code != 0:
        detail = printable(answer.stderr.decode("utf-8", "surrogateescape"))[:500]
        raise ServiceError(
            "backend_unavailable", f"the extraction under {dest} ended without its answer (exit {exit_code}) {detail}"
        )
    return answer.entries
