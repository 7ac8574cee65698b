"""An interactive terminal in a sandbox: a command (a login shell by default) on a pseudo-terminal
that the sandbox's exec helper opens (`sandboxes._helper._pty`), with the working directory,
environment and user the sandbox's commands get; on every sandbox that `HoldsHelper`.

Its output (the terminal's bytes, stdout and stderr as one, as a terminal shows them) goes to
the caller's ``on_data`` as it arrives; its input, size and end are the caller's (`Terminal`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from sandboxes import protocol as p
from sandboxes._helper.frames import RESIZE
from sandboxes._mux import Channel, Command, HoldsHelper, MuxBroken, open_channel
from sandboxes._mux._frames import wire_spec
from sandboxes._mux._shipped import sources_of
from sandboxes._output import as_output_hook

__all__ = [
    "DEFAULT_COMMAND",
    "MAX_SIDE",
    "HasCommandContext",
    "Terminal",
    "TerminalError",
    "aopen_terminal",
    "open_terminal",
    "pty_spec",
]

DEFAULT_COMMAND = "bash -i -l"
"""What a terminal runs unless told otherwise: an interactive login shell."""
MAX_SIDE = 10000
"""Columns or rows a terminal may have at most (the helper's bound, `_pty.MAX_SIDE`)."""

DataHook = Callable[[bytes], None]
"""Takes the terminal's output as it arrives, on the exec helper's reader thread: it must
neither block nor raise."""


def pty_spec(cols: int, rows: int) -> dict[str, object]:
    """The fields of a request that runs its command on a terminal of ``cols`` x ``rows``, with
    the helper's terminal module (not in its bootstrap: `sandboxes._mux._shipped.ON_DEMAND`)."""
    return {"pty": {"cols": cols, "rows": rows}, "sources": sources_of("_pty")}


class TerminalError(Exception):
    """A terminal could not be opened; ``code`` is the protocol's error code."""

    def __init__(self, code: p.ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@runtime_checkable
class HasCommandContext(Protocol):
    """A sandbox that says what its commands start with (its config's environment and working
    directory), so that a terminal starts alike."""

    def command_context(self) -> tuple[dict[str, str], str]:
        """(environment, working directory) of a command that names neither."""
        ...


def check_size(cols: int, rows: int) -> None:
    """ValueError unless both sides are integers from 1 to `MAX_SIDE`."""
    for side in (cols, rows):
        if isinstance(side, bool) or not isinstance(side, int) or not 1 <= side <= MAX_SIDE:
            raise ValueError(f"a terminal's cols and rows are integers from 1 to {MAX_SIDE}")


class Terminal:
    """A command running on a pseudo-terminal in a sandbox, from any thread: `send` its input,
    `resize` it, `kill` it, `wait` for its exit code (`wait_async` on an event loop)."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    @property
    def done(self) -> bool:
        """Whether the command ended (or the stream under it broke)."""
        return self._channel.done

    def send(self, data: bytes | str) -> None:
        """Bytes typed into the terminal (a str as UTF-8); `MuxBroken` if the stream broke.
        Nothing once the command ended."""
        if not self.done:
            self._channel.write(data.encode("utf-8") if isinstance(data, str) else data)

    def resize(self, cols: int, rows: int) -> None:
        """The terminal's new size: its foreground programs get SIGWINCH. ValueError for a size
        out of bounds; nothing once the command ended."""
        check_size(cols, rows)
        if not self.done:
            self._channel.send(RESIZE, wire_spec({"cols": cols, "rows": rows}))

    def kill(self) -> None:
        """Kill the command and everything it started (its session, its marker)."""
        self._channel.kill()

    def on_end(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the command ended (on the reader's thread: it must neither
        block nor raise)."""
        self._channel.on_end(callback)

    def wait(self, timeout: float | None = None) -> p.ExecuteResponse | None:
        """The command's answer (its ``exit_code``; ``error`` if its timeout or a broken stream
        ended it: ``timeout``, ``connection_lost``) once it ended within ``timeout`` seconds,
        else None."""
        try:
            return self._channel.wait(timeout)
        except MuxBroken as broken:
            return _lost(broken)

    async def wait_async(self) -> p.ExecuteResponse:
        """`wait` on an event loop, however long the command runs."""
        try:
            return await self._channel.wait_async()
        except MuxBroken as broken:
            return _lost(broken)

    async def asend(self, data: bytes | str) -> None:
        """`send` off the event loop (a stream that stalls would hold it)."""
        await asyncio.to_thread(self.send, data)

    async def aresize(self, cols: int, rows: int) -> None:
        """`resize` off the event loop."""
        await asyncio.to_thread(self.resize, cols, rows)

    async def akill(self) -> None:
        """`kill` off the event loop."""
        await asyncio.to_thread(self.kill)


def _lost(broken: MuxBroken) -> p.ExecuteResponse:
    return p.ExecuteResponse(
        "", error=p.CONNECTION_LOST, message=f"the sandbox's exec helper broke under the terminal: {broken}"
    )


def open_terminal(
    sandbox: object,
    on_data: DataHook,
    *,
    cols: int = 80,
    rows: int = 24,
    command: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout: float | None = None,
) -> Terminal:
    """Start ``command`` (`DEFAULT_COMMAND`) on a ``cols`` x ``rows`` terminal in ``sandbox``,
    in its commands' working directory and environment (``cwd`` and ``env`` over them), until it
    exits, is killed, or ``timeout`` seconds passed (None: no limit). `TerminalError`
    (``unavailable``) for a sandbox without an exec helper, or whose helper cannot run now;
    ValueError for a size out of bounds."""
    check_size(cols, rows)
    if not isinstance(sandbox, HoldsHelper):
        raise TerminalError(p.UNAVAILABLE, f"{type(sandbox).__name__} runs no exec helper, which a terminal needs")
    mux = sandbox.exec_helper()
    if mux is None:
        raise TerminalError(p.UNAVAILABLE, "the sandbox's exec helper cannot run now (no python3 in it?)")
    base_env, base_cwd = sandbox.command_context() if isinstance(sandbox, HasCommandContext) else ({}, None)
    env, cwd = {**base_env, **(env or {})}, cwd or base_cwd
    opened = Command(command or DEFAULT_COMMAND, timeout or 0, output_limit=0, env=env, cwd=cwd)
    try:
        channel = open_channel(mux, opened, on_output=as_output_hook(on_data), spec=pty_spec(cols, rows))
    except MuxBroken as broken:
        raise TerminalError(p.UNAVAILABLE, f"the sandbox's exec helper broke: {broken}") from broken
    return Terminal(channel)


async def aopen_terminal(
    sandbox: object,
    on_data: DataHook,
    *,
    cols: int = 80,
    rows: int = 24,
    command: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout: float | None = None,  # noqa: ASYNC109 - the command's own, enforced by the helper
) -> Terminal:
    """`open_terminal` off the event loop (it may start the sandbox's exec helper)."""
    return await asyncio.to_thread(
        open_terminal, sandbox, on_data, cols=cols, rows=rows, command=command, env=env, cwd=cwd, timeout=timeout
    )
