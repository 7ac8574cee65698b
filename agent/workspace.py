"""What the tools of one call see: the thread's sandbox with ``/memories/`` and ``/scratch/`` mounted.

The default layout routes through `sandboxes.composite.CompositeBackend`:

* ``/memories/`` -> `StoreBackend` over the graph's store, in the run's user's namespace
  (`agent.identity`): outlives threads, never seen by another user. A run without a user id
  gets its thread's namespace, or, without a thread id either, the run's state.
* ``/scratch/``  -> `GraphStateBackend` over the thread's ``files`` state: checkpointed with the
  thread, gone with it.
* ``/large_tool_results/`` -> the thread's state too: tool results too long for the context
  are kept there (the sandbox's disk may be read-only outside its workdir).
* everything else -> the thread's sandbox, which alone runs commands (a command does not see
  the routes: they are not on the sandbox's disk).

A workspace is made per tool call (cheap: the routed backends load lazily) because state and
store belong to the call; `Workspace.updates` is the state update the call must return.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from langgraph.store.base import BaseStore

from agent.backends import GraphStateBackend, StoreBackend
from agent.identity import MemoryNamespace, current_identity, namespace_for, per_user_namespace
from agent.lifecycle import SandboxMiddleware
from sandboxes import protocol as p
from sandboxes.composite import CompositeBackend
from sandboxes.paths import join

__all__ = ["Layout", "Workspace", "WorkspaceFactory"]


@dataclass(frozen=True)
class Layout:
    """Where the long-lived and the thread-scoped files are mounted; ``None`` mounts nothing."""

    memories: str | None = "/memories/"
    scratch: str | None = "/scratch/"
    memories_namespace: MemoryNamespace = per_user_namespace
    """Each user's own (`per_user_namespace`); a constant tuple shares one between all runs."""
    large_results: str | None = "/large_tool_results/"


@dataclass
class Workspace:
    backend: p.BackendProtocol
    in_state: list[GraphStateBackend] = field(default_factory=list)
    sandbox: p.SandboxBackendProtocol | None = None
    workdir: str = "/"
    """The sandbox's working directory: relative paths and omitted search roots mean it."""

    def resolve(self, path: str | None) -> str:
        if not path:
            return self.workdir
        return path if path.startswith("/") else join(self.workdir, path)

    @property
    def executes(self) -> bool:
        return self.sandbox is not None

    def updates(self) -> dict[str, Any]:
        """State updates owed by the operations made so far (``/scratch/`` changes)."""
        changes = {k: v for backend in self.in_state for k, v in backend.changes().items()}
        return {"files": changes} if changes else {}


@dataclass
class WorkspaceFactory:
    """Builds the `Workspace` of a call from its state and store."""

    sandboxes: SandboxMiddleware
    layout: Layout = field(default_factory=Layout)
    fallback_store: BaseStore | None = None
    """Used for ``/memories/`` when the graph has no store of its own."""

    def __call__(self, state: Mapping[str, Any], store: BaseStore | None) -> Workspace:
        sandbox_id = state.get("sandbox_id")
        if not sandbox_id:
            raise LookupError("this thread has no sandbox: SandboxMiddleware did not run before the tools")
        sandbox = self.sandboxes.sandbox(sandbox_id)
        routes: dict[str, p.BackendProtocol] = {}
        in_state = []
        store = store if store is not None else self.fallback_store
        stored = [self.layout.scratch, self.layout.large_results]
        if self.layout.memories and store is not None:
            namespace = namespace_for(self.layout.memories_namespace, current_identity())
            if namespace is None:
                stored.append(self.layout.memories)
            else:
                routes[self.layout.memories] = StoreBackend(store, namespace)
        for prefix in stored:
            if prefix:
                backend = GraphStateBackend(state.get("files"), prefix)
                routes[prefix] = backend
                in_state.append(backend)
        composite: p.BackendProtocol = CompositeBackend.create(sandbox, routes) if routes else sandbox
        return Workspace(composite, in_state, sandbox, self.sandboxes.workdir(sandbox_id))


WorkspaceSource = Callable[[Mapping[str, Any], BaseStore | None], Workspace]
