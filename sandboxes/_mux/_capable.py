"""What a sandbox offers through its exec helper: the helper itself, for every capability built on
it (`HoldsHelper`), and commands awaited on an event loop (`AwaitsOnHelper`)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from sandboxes._mux._driven import CommandDefaults
from sandboxes._mux.client import MuxClient

__all__ = ["AwaitedDefaults", "AwaitsOnHelper", "HoldsHelper"]


class AwaitedDefaults(CommandDefaults, Protocol):
    """What fills in a command awaited on a helper, and the memory limit an OOM kill names."""

    @property
    def memory(self) -> str: ...


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
    (`sandboxes._mux._awaited.arun`) instead of holding a thread, as its own
    ``execute_streaming`` would run it: `awaited_defaults` filled in, a helper that broke let go
    of with `drop_helper`, an exit 137 checked with `oom_killed`. Methods only, so that a class
    can be checked once (``issubclass``)."""

    def awaited_defaults(self) -> AwaitedDefaults:
        """What fills in what an awaited command leaves out (the sandbox's config)."""
        ...

    def running_helper(self) -> MuxClient | None:
        """The exec helper if one is running now (none is started), without blocking."""
        ...

    def drop_helper(self, mux: MuxClient) -> None:
        """Let go of ``mux``, found broken: the next command starts a new helper."""
        ...

    def oom_killed(self) -> bool:
        """Whether the sandbox's memory limit killed something since the last look."""
        ...
