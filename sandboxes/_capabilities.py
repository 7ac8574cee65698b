"""What a sandbox may offer beyond the protocol, checked with ``isinstance``: kills and
command markers through an exec helper it already runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["KillsTagged", "MarksAhead"]


@runtime_checkable
class KillsTagged(Protocol):
    """A sandbox that can kill by environment marker WITHOUT starting a process in it: through
    a helper it already runs (the exec helper of Docker, SSH, Kubernetes and a local jail).

    Why a capability: a command that filled the sandbox's process limit (a fork bomb, a runaway
    job) leaves no room for the ``sh`` that `sandboxes._scripts.KILL_MARKED` needs, and killing
    it is exactly what is wanted then. Checked with ``isinstance``; without it, or when it
    answers ``False``, callers fall back to commands."""

    def kill_tagged(self, name: str, value: str) -> bool:
        """Kill every running command given ``name=value`` in its ``env`` (however it changed
        its environment since) and every process of the sandbox whose environment holds
        ``name=value``; whether that was done and none is left (``False``: no helper is running
        right now, or the kill did not finish)."""
        ...


@runtime_checkable
class MarksAhead(Protocol):
    """A sandbox whose exec helper can start a command's shell before the command comes, for a
    caller that marks each command with a value of its own (``SANDBOXES_EXEC_ID``, the service's
    kill token): the shell's environment, the marker in it, is fixed when it starts, so the
    marker must be known a command ahead. Checked with ``isinstance``; without it, any fresh
    value does, and the command starts cold."""

    def command_marker(self, new: Callable[[], str]) -> str:
        """The marker to give the caller's next command: one announced to the helper, or one
        from ``new`` (which makes unique values) when no helper runs or others are in flight.
        Only a speed-up: any marker works, and kills find the command by it either way
        (`sandboxes._mux.MuxClient.marker`)."""
        ...
