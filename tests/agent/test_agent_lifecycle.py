"""SandboxMiddleware's registry: one live handle per sandbox however many calls attach at once."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agent_helpers import local_provider

from agent import ProviderAdapter, SandboxMiddleware
from sandboxes import protocol as p


class SlowAttach(ProviderAdapter):
    """Every attach waits until all the callers are inside it, so they overlap for sure."""

    def __init__(self, inner: ProviderAdapter, parties: int) -> None:
        super().__init__(inner.provider, virtual_root=inner.virtual_root)
        self.barrier = threading.Barrier(parties, timeout=30)
        self.detached: list[p.SandboxBackendProtocol] = []

    def attach(self, sandbox_id: str) -> p.SandboxBackendProtocol:
        sandbox = super().attach(sandbox_id)
        self.barrier.wait()
        return sandbox

    def detach(self, sandbox: p.SandboxBackendProtocol) -> None:
        self.detached.append(sandbox)
        super().detach(sandbox)


class Starts:
    def __init__(self) -> None:
        self.started: list[str] = []

    def on_sandbox_start(self, sandbox: Any) -> None:
        self.started.append(sandbox.id)

    def on_sandbox_stop(self, sandbox: Any) -> None:
        pass


def test_concurrent_attaches_keep_one_handle_and_start_once(local_provider: ProviderAdapter) -> None:
    made = local_provider.create()
    key = local_provider.key(made)
    provider = SlowAttach(local_provider, parties=4)
    starts = Starts()
    lifecycle = SandboxMiddleware(provider, hooks=[starts])
    with ThreadPoolExecutor(4) as pool:
        handles = list(pool.map(lambda _: lifecycle.sandbox(key), range(4)))
    assert len({id(h) for h in handles}) == 1
    assert starts.started == [made.id]
    assert len(provider.detached) == 3
    assert all(d is not handles[0] for d in provider.detached)
    assert lifecycle.live == (key,)


__all__ = ["local_provider"]  # the fixture, used by name
