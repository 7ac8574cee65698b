"""Bounded capture of a command's output, shared by every transport."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Literal, Protocol

from sandboxes.protocol import OUT_OF_MEMORY, TIMEOUT, ExecuteResponse

Stream = Literal["stdout", "stderr", "merged"]
"""Which output of a command a chunk comes from: ``merged`` where a transport cannot tell (one
pipe for both: a command run without the exec helper)."""


class OutputHook(Protocol):
    """Sees each chunk of a command's output as it arrives, with the stream it came from
    (``merged`` when the caller does not say, as transports that merge them do not)."""

    def __call__(self, chunk: bytes, stream: Stream = "merged", /) -> None: ...


def as_output_hook(hook: Callable[..., Any] | None) -> OutputHook | None:
    """``hook`` as an `OutputHook`: a callable of one argument is handed the chunk alone."""
    if hook is None:
        return None
    try:
        inspect.signature(hook).bind(b"", "merged")
    except TypeError:
        one: Callable[[bytes], Any] = hook
        return lambda chunk, stream="merged", /: one(chunk)
    except ValueError:  # no signature to read (a builtin): taken as it is
        pass
    return hook


DEFAULT_OUTPUT_LIMIT = 1 << 20
"""Bytes of output ``execute`` keeps by default (1 MiB): enough for any tool result an agent can
use, small enough that a runaway ``yes`` cannot exhaust the caller's memory."""

UNLIMITED = 1 << 62


class OutputBuffer:
    """Keeps the first and last ``limit / 2`` bytes of a stream of unknown length.

    Memory stays O(limit) however much the command prints; what is dropped from the middle is
    counted and announced by a marker line in `text`.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(limit, 0)
        self._head = bytearray()
        self._tail = bytearray()
        self._half = self.limit // 2
        self.total = 0

    def write(self, data: bytes) -> None:
        self.total += len(data)
        if len(self._head) < self.limit - self._half:
            room = self.limit - self._half - len(self._head)
            self._head += data[:room]
            data = data[room:]
        if data and self._half:
            self._tail += data
            if len(self._tail) > 2 * self._half:  # trim in bulk, not on every write
                del self._tail[: len(self._tail) - self._half]

    @property
    def truncated(self) -> bool:
        return self.total > self.limit

    def getvalue(self) -> bytes:
        if not self.truncated:
            return bytes(self._head + self._tail)
        tail = self._tail[-self._half :] if self._half else b""
        return bytes(self._head) + bytes(tail)

    def _kept(self) -> bytes | bytearray:
        """What `getvalue` gives, without its two copies when it all fits the head (a command's
        usual output; a native download's, whose limit is none)."""
        return self._head if not self._tail else self.getvalue()

    def text(self, *, latin1: bool = False) -> str:
        """The kept output as text, with a marker where the middle was dropped. ``latin1``: one
        character per byte, which ``str.encode("latin-1")`` turns back into exactly those bytes
        (a native op's binary answer, `MuxClient.run_native`); UTF-8 otherwise."""
        if latin1:
            return self._kept().decode("latin-1")
        if not self.truncated:
            return self._kept().decode("utf-8", "replace")
        tail = bytes(self._tail[-self._half :]) if self._half else b""
        dropped = self.total - len(self._head) - len(tail)
        marker = f"\n... [{dropped} bytes of output truncated] ...\n"
        return self._head.decode("utf-8", "replace") + marker + tail.decode("utf-8", "replace")


def execute_response(
    output: OutputBuffer,
    exit_code: int | None,
    *,
    timed_out: bool,
    timeout: float | None,
    duration_ms: float,
    latin1: bool = False,
) -> ExecuteResponse:
    """The one place a finished (or killed) command becomes an `ExecuteResponse` (``latin1``: see
    `OutputBuffer.text`)."""
    if timed_out:
        return ExecuteResponse(
            output.text(latin1=latin1),
            exit_code=None,
            truncated=output.truncated,
            error=TIMEOUT,
            message=f"Command timed out after {timeout}s; its process tree was killed",
            duration_ms=duration_ms,
        )
    text = output.text(latin1=latin1)
    return ExecuteResponse(text, exit_code=exit_code, truncated=output.truncated, duration_ms=duration_ms)


def out_of_memory(response: ExecuteResponse, limit: str) -> ExecuteResponse:
    """``response`` (a command that died with 137) as what it was: the out-of-memory killer's
    work under a memory limit of ``limit``."""
    return ExecuteResponse(
        response.output,
        exit_code=137,
        truncated=response.truncated,
        error=OUT_OF_MEMORY,
        message=f"Command was killed by the out-of-memory killer (memory limit {limit})",
        duration_ms=response.duration_ms,
    )
