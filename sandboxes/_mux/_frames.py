"""A command's frames, on the client's side: their header and what the client accepts of a
helper (`MAX_FRAME`, the kinds a helper sends), a command's request (`_request_frame`) and its
stdin (`_send_stdin`), and what its answer frames add up to (`_Pending`, `_response`). What
every kind means, both ways, is `sandboxes._helper._server`'s docstring.

Apart from the client (`sandboxes._mux.client.MuxClient`, which owns the stream, reads it and
breaks it) because a command is framed and answered alike however it is waited for: blocking
(`MuxClient.run`, `MuxClient.run_native`) or on an event loop (`sandboxes._mux._awaited.arun`).
"""

from __future__ import annotations

import marshal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sandboxes import protocol as p
from sandboxes._helper._kill import RECORD_ENV
from sandboxes._helper.frames import CLOSE_STDIN, HEADER, HELPER_KINDS, RUN, STDIN
from sandboxes._mux._command import Command
from sandboxes._mux._shipped import sources_of
from sandboxes._mux._stall import SendWatch
from sandboxes._mux._stream import MuxBroken
from sandboxes._output import OutputBuffer, OutputHook, execute_response

__all__ = ["HEADER", "MAX_FRAME", "Sender", "wire_spec"]


class Sender(Protocol):
    """What a command's stdin is written through (`sandboxes._mux.client.MuxClient`)."""

    def _send(self, kind: bytes, ident: int, payload: bytes = b"") -> None: ...

    def close(self, reason: str = ...) -> None: ...


MAX_FRAME = 1 << 20
"""The largest frame the client accepts from a helper. The helper's own frames are far smaller
(output goes out in chunks of at most 256 KiB); a bigger announced length is a corrupt or forged
stream (a command writing into the helper's stdout), which is dropped before a byte of it is
buffered: nothing a sandbox sends can make the client hold more than this plus one read."""
_KINDS = frozenset(HELPER_KINDS)


class _Corrupt(Exception):
    """The helper's stream broke the framing: it is dropped."""


_STDIN_CHUNK = 1 << 16
"""Stdin goes to the helper in frames of this size. Not bigger: the helper hands a frame to the
command only once all of it arrived, so small frames keep the client, the helper and the command
busy at the same time; and every chunk of 128 KiB or more is a fresh mmap and its page faults, on
both sides."""
_BINARY_ANSWERS = frozenset({"read_file", "download"})
"""Native ops whose answer is bytes, not the script's text (`sandboxes._helper._reads.RAW`):
their output is kept exact, one character per byte."""


@dataclass
class _Pending:
    output: OutputBuffer
    done: threading.Event = field(default_factory=threading.Event)
    exit_code: int | None = None
    timed_out: bool = False
    failure: str | None = None
    start_error: str | None = None
    not_native: bool = False
    """A file op the helper handed back (N): nothing was done, the script must run."""
    accepted_at: float | None = None
    """When the helper acknowledged the command (monotonic); ``None``: not (yet)."""
    on_output: OutputHook | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    """The environment the caller gave the command: what `MuxClient.kill_tagged` matches."""
    on_frame: Callable[[bytes, bytes], None] | None = None
    """Frames of a capability's own kinds (kind, payload), for a channel (`open_channel`)."""

    @classmethod
    def of(
        cls,
        command: Command,
        on_output: OutputHook | None,
        *,
        done: threading.Event | None = None,
        on_frame: Callable[[bytes, bytes], None] | None = None,
    ) -> _Pending:
        """What ``command``'s answer frames add up to, waited on: its output kept within its
        ``output_limit``, and its ``env``, which `MuxClient.kill_tagged` matches."""
        output = OutputBuffer(command.output_limit)
        done = threading.Event() if done is None else done
        return cls(output, done=done, on_output=on_output, env=dict(command.env), on_frame=on_frame)


def wire_spec(spec: Mapping[str, object]) -> bytes:
    """The payload of an R, M or F frame: ``spec`` `marshal`'d, in a format every python3 from
    3.4 on reads (the helper's interpreter may be older than this one), and that the helper
    parses without importing `json` (see ``_server._json``). Only ever read by the helper, from
    this client: never parse `marshal` from a sandbox."""
    return marshal.dumps(_plain(spec), 4)


def _plain(value: object) -> Any:
    """``value`` in the built-in types `marshal` takes, as `json.dumps` sent it before: marshal
    refuses their subclasses, where json sent a ``(str, Enum)`` member as its value, a tuple as a
    list, a numpy float as a float. TypeError for what neither takes."""
    kind = type(value)
    if value is None or kind is str or kind is bool or kind is int or kind is float:
        return value
    if isinstance(value, str):
        return str.__str__(value)  # a str enum's value; str() would give its name
    if isinstance(value, int):  # bool has no subclasses
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    raise TypeError(f"{kind.__name__} cannot be sent to the exec helper")


def _request_frame(
    ident: int,
    command: Command,
    *,
    stdin_open: bool,
    next_marker: str | None = None,
    extra: Mapping[str, object] | None = None,
) -> bytes:
    """The R frame of ``command``, the one place a command's fields become a request's
    (``stdin_open``: its stdin frames follow; ``next_marker``: see `MuxClient.marker`;
    ``extra``: fields a capability adds, `sandboxes._mux._channel.open_channel`)."""
    env = command.env
    spec: dict[str, object] = {
        "command": command.command,
        "env": dict(env),
        "cwd": command.cwd,
        "timeout": command.timeout or None,
        "stdin": stdin_open,
    }
    if next_marker is not None:
        spec["next_marker"] = next_marker
    if RECORD_ENV in env:  # a command recorded in the sandbox: the helper's module for it
        spec["sources"] = sources_of("_record")
    if extra:
        spec.update(extra)
    payload = wire_spec(spec)
    return HEADER.pack(RUN, ident, len(payload)) + payload


def _send_stdin(client: Sender, ident: int, stdin: bytes, answered: threading.Event | None = None) -> None:
    """Stdin in chunks, then its end; stops early once ``answered`` (a file op the helper already
    answered or handed back: it drops the rest, as when a write failed on a full disk). The
    caller holds no read token meanwhile, and has the reader thread read (`MuxClient._lead`).
    More than a frame is watched (`SendWatch`): a helper that stops taking it closes the
    client, and the send raises `MuxBroken`."""
    if len(stdin) <= _STDIN_CHUNK:  # one frame: the buffers on the way hold it
        if stdin:
            client._send(STDIN, ident, stdin)
        client._send(CLOSE_STDIN, ident)
        return
    with SendWatch(client.close) as watch:
        for offset in range(0, len(stdin), _STDIN_CHUNK):
            if answered is not None and answered.is_set():
                return
            client._send(STDIN, ident, stdin[offset : offset + _STDIN_CHUNK])
            watch.sent()
        client._send(CLOSE_STDIN, ident)


def _response(pending: _Pending, timeout: float | None, started: float, *, latin1: bool = False) -> p.ExecuteResponse:
    """What a finished command answers; `MuxBroken` if the stream failed under it. ``latin1``:
    its output is bytes, kept exact (`OutputBuffer.text`)."""
    if pending.failure is not None:
        raise MuxBroken(pending.failure)  # after the request was written: its fate is unknown
    if pending.not_native:  # only a file op may be handed back: a forged frame
        raise MuxBroken("exec helper answered a command as a file op")
    if pending.start_error is not None:
        code: p.ErrorCode = p.FILE_NOT_FOUND if "FileNotFoundError" in pending.start_error else p.BACKEND_ERROR
        return p.ExecuteResponse("", error=code, message=f"could not start command: {pending.start_error}")
    return execute_response(
        pending.output,
        pending.exit_code,
        timed_out=pending.timed_out,
        timeout=timeout,
        duration_ms=(time.monotonic() - started) * 1000,
        latin1=latin1,
    )
