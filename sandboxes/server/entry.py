"""`Entry`: what the registry (`sandboxes.server.registry`) holds of one live sandbox, and
what routes answer about it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from sandboxes.api import SandboxInfo
from sandboxes.base import BaseSandbox
from sandboxes.server.backends import ProviderBackend
from sandboxes.server.processes import ProcessTable
from sandboxes.server.store import Network, SandboxState

__all__ = ["Entry"]


@dataclass
class Entry:
    state: SandboxState
    sandbox: BaseSandbox
    backend: ProviderBackend
    processes: ProcessTable
    confirmed: float = field(default_factory=time.monotonic)
    """When its record was last read from a shared backend (`time.monotonic`)."""
    pausing: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held across a pause or a resume of it, so they happen one at a time."""
    network_seen: Network | None = None
    """Its network (`SandboxState.network`) as this replica last wrote it (its state file, its
    record) or read it there: one read back the same is no other replica's change (this one's may
    be newer); what a change that cannot be recorded gives back."""
    network_written: float = 0.0
    """When this replica last recorded its network on its record (`time.monotonic`): a read of
    its record that started before says nothing newer."""
    expiring: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held across what its expiry does (a removal, or a pause it asked for), so that a sweep
    finding one under way (a timer's, another sweep's) returns once it is done."""

    def info(self) -> SandboxInfo:
        return SandboxInfo(
            id=self.state.id,
            template=self.state.template,
            backend=self.backend.template.backend,
            created_at=self.state.created_at,
            expires_at=self.state.expires_at,
            labels=self.state.labels,
            workdir=self.state.workdir,
            state="paused" if self.state.paused else "running",
            processes_kept=not (self.state.hibernated or self.state.processes_ended) if self.state.paused else None,
        )

    def kill_marked(self, token: str) -> None:
        self.backend.kill_marked(self.sandbox, token)
