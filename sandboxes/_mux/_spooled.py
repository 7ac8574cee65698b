"""A command's stdout through the exec helper, read as a stream (`SpooledOutput`): what a
``GET /archive`` of a sandbox that runs no engine of its own (a local jail) reads as a
container's ``docker exec`` is read.

The helper hands a channel's output to a hook that must neither block nor raise, however slowly
the caller reads: so the bytes go to a temporary file as they arrive and are read back from it as
the caller wants them. The file starts again at its beginning whenever the caller has read all of
it; it never holds more than ``limit`` bytes: a command that gets further ahead of its reader is
killed, and the reader's next `SpooledOutput.recv` raises `OSError` (``EFBIG``). Memory holds
no chunk longer than the helper's frames.
"""

from __future__ import annotations

import errno
import os
import tempfile
import threading

from sandboxes._mux._channel import open_channel
from sandboxes._mux._command import Command
from sandboxes._mux.client import MuxClient

__all__ = ["SpooledOutput"]

_STDERR_TAIL = 2000
_WAIT = 3600.0
"""Seconds the command's answer is waited for once its output ended."""
_CHECK = 10.0
"""Seconds between checks, while no output comes, that the helper still answers for the command
within its timeout and a grace (`Channel.wait`, which kills it past them)."""


class SpooledOutput:
    """``command`` run by the exec helper of ``client``, its stdout read with `recv` as it comes
    (`sandboxes.server.backends.OutputStream`); the last bytes of its stderr in ``stderr``."""

    def __init__(self, client: MuxClient, command: str, *, limit: int, timeout: float) -> None:
        self.stderr = b""
        self._limit = limit
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 - closed by `close`
        self._changed = threading.Condition()
        self._written = self._read = 0
        self._ended = self._over = False
        try:
            self._channel = open_channel(
                client, Command(command, timeout, output_limit=0, cwd="/"), on_output=self._take
            )
        except BaseException:
            self._file.close()
            raise
        self._channel.close_stdin()
        self._channel.on_end(self._end)

    def _take(self, chunk: bytes, stream: str = "merged") -> None:
        """On the reader's thread: stdout into the file, or the command marked over its bound."""
        if stream == "stderr":
            self.stderr = (self.stderr + chunk)[-_STDERR_TAIL:]
            return
        with self._changed:
            if self._over:
                return
            if self._written + len(chunk) > self._limit:
                self._over = True
            else:
                os.pwrite(self._file.fileno(), chunk, self._written)
                self._written += len(chunk)
            self._changed.notify_all()

    def _end(self) -> None:
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def recv(self, size: int) -> bytes:
        """Up to ``size`` bytes of stdout, as soon as there are any; ``b""`` once it ended."""
        while not self._ready():
            if self._channel.wait(0) is not None:  # ended; or past its deadline: killed, and taken as ended
                self._end()
        with self._changed:
            if self._over:
                self._channel.kill()
                raise OSError(
                    errno.EFBIG, f"the command's output got more than {self._limit} bytes ahead of its reader"
                )
            at, wanted = self._read, min(size, self._written - self._read)
        data = os.pread(self._file.fileno(), wanted, at) if wanted else b""
        with self._changed:
            self._read += len(data)
            if self._read == self._written:  # all read: the file starts again
                self._read = self._written = 0
                self._file.truncate(0)
        return data

    def _ready(self) -> bool:
        """Whether there is output to read, or the command ended, within `_CHECK` seconds."""
        with self._changed:
            return self._changed.wait_for(lambda: self._read < self._written or self._ended or self._over, _CHECK)

    def exit_code(self) -> int | None:
        """The command's exit code once it ended; ``None`` if it answered none."""
        ended = self._channel.wait(_WAIT)
        return None if ended is None else ended.exit_code

    def close(self) -> None:
        """The command killed if it still runs; its spool removed."""
        if not self._channel.done:
            self._channel.kill()
        self._file.close()
