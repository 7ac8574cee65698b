"""What a sandbox offers through its exec helper: the helper itself, for every capability built on
it (`HoldsHelper`), and commands awaited on an event loop (`AwaitsOnHelper`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sandboxes import protocol as p
from sandboxes._mux._command import Command
from sandboxes._mux._stream import MuxBroken
from sandboxes._mux.client import MuxClient

__all__ = ["AwaitedCommand", "AwaitsOnHelper", "HoldsHelper"]


@dataclass(frozen=True)
class AwaitedCommand:
    """A command as the sandbox's own ``execute_streaming`` would send it to its helper."""

    command: Command
    """Its defaults filled in (`Command.within`)."""
    lost: str
    """``connection_lost``'s message (then ``: `` and why) when the helper broke once it was sent."""
    checked: Callable[[p.ExecuteResponse], p.ExecuteResponse]
    """Its answer for an exit 137, as ``execute_streaming`` gives it: ``out_of_memory`` when the
    sandbox's memory limit killed it; may block (it may ask the sandbox)."""


@runtime_checkable
class HoldsHelper(Protocol):
    """A sandbox that runs the exec helper (Docker, Kubernetes, SSH, a local jail): the one driver
    every capability beyond the protocol goes through (`sandboxes._mux._channel.open_channel`:
    terminals, stdin as it goes, file watches, relayed ports), the same on every backend. Checked
    with ``isinstance``; a sandbox without it answers such a capability ``unavailable``."""

    def exec_helper(self) -> MuxClient | None:
        """The running exec helper, started if none runs; ``None`` when none can run now (no
        python3 in the sandbox, or its last start failed and the next is not due yet)."""
        ...


@runtime_checkable
class AwaitsOnHelper(Protocol):
    """A sandbox whose running exec helper a caller may await a command on
    (`sandboxes._mux._awaited.arun`) instead of holding a thread, with the same answer as its own
    ``execute_streaming``: `awaited_command` prepares it (or answers it without running it), a
    helper that broke is let go of with `drop_helper`, an exit 137 is checked with
    `AwaitedCommand.checked`. Methods only, so that a class can be checked once (``issubclass``)."""

    def running_helper(self) -> MuxClient | None:
        """The exec helper if one is running now (none is started), without blocking."""
        ...

    def awaited_command(self, command: Command) -> AwaitedCommand | p.ExecuteResponse:
        """``command`` as ``execute_streaming`` sends it to its helper (`Command.within` the
        sandbox's defaults), or its answer where it answers without running anything (a working
        directory that is not there); without blocking."""
        ...

    def drop_helper(self, mux: MuxClient, broken: MuxBroken) -> None:
        """Let go of ``mux``, found ``broken``, as ``execute_streaming`` does: the next command
        starts a new helper."""
        ...
