"""One sandbox per thread: where it comes from, how a resumed thread finds it again, when it ends.

A `SandboxProvider` makes sandboxes (`create`), reaches an existing one by its key (`attach`)
and ends one (`release`); any `sandboxes.lifecycle.Provider` of any backend becomes one through
`ProviderAdapter` (the key is the sandbox's `sandboxes.lifecycle.Sandbox.ref`).
`SandboxMiddleware` asks it for a sandbox when a thread's first run starts and keeps the
sandbox's key in the graph state (``sandbox_id``), so the checkpointer saves it with the
conversation: a thread resumed later, in another process, reattaches to the same sandbox and
finds its files. Sandboxes reached in this process are kept in the middleware's registry by
key, which is how the tools (and subagents, which share the sandbox) find the live object.

The end of a thread is the caller's to declare: ``release="end"`` releases the sandbox when a
run finishes (a run stopped by an interrupt has not finished, so it keeps its sandbox), and
``release="ttl"`` never releases it: `release` ends it explicitly, and otherwise the provider's
TTL does (the service's sandbox TTL, a Docker provider's sweep).

A resumed thread whose sandbox no longer exists (its TTL passed, someone deleted it) gets a
new, empty one by default (``on_missing="replace"``), and the model is told in the conversation
that the files it made there are gone, so it does not act on files it only remembers; the
``/scratch/`` files live in the checkpointed state and survive. ``on_missing="raise"`` raises
`SandboxGone` instead, for callers who would rather stop.

Start/stop hooks follow seed 002's stack: hooks are in stack order (larger ``priority`` is
outer); ``on_sandbox_start`` runs from the innermost to the outermost, ``on_sandbox_stop`` in
reverse, so what started last stops first.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal, NotRequired, Protocol, runtime_checkable

from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain_core.messages import HumanMessage
from langgraph.runtime import Runtime

from agent.backends import FileRecord, merge_files
from agent.virtual import VirtualRoot, plain_path
from sandboxes import protocol as p
from sandboxes.lifecycle import PooledProvider, Provider, Sandbox

__all__ = [
    "FixedSandbox",
    "MissingPolicy",
    "ProviderAdapter",
    "ReleasePolicy",
    "RemoteProvider",
    "SandboxAgentState",
    "SandboxGone",
    "SandboxHook",
    "SandboxMiddleware",
    "SandboxProvider",
]

logger = logging.getLogger(__name__)

ReleasePolicy = Literal["end", "ttl"]
MissingPolicy = Literal["replace", "raise"]


class SandboxGone(LookupError):
    """A resumed thread's sandbox no longer exists (expired or deleted), and the middleware was
    told not to replace it."""

    def __init__(self, sandbox_id: str, reason: str) -> None:
        super().__init__(f"the thread's sandbox {sandbox_id!r} no longer exists ({reason})")
        self.sandbox_id = sandbox_id


def gone_notice() -> str:
    """What the model is told when its thread's sandbox was replaced (not its key: that may be a
    path on the agent's host)."""
    return (
        "[sandbox notice] The sandbox this conversation used before no longer exists: "
        "it expired or was deleted, and every file written there is gone. You are now in a new, empty "
        "sandbox; files under /scratch/ and /memories/ are kept. Check before relying on earlier files."
    )


class SandboxAgentState(AgentState[Any]):
    """The agent state with the thread's sandbox id and its ``/scratch/`` files, both checkpointed."""

    sandbox_id: NotRequired[str | None]
    files: Annotated[NotRequired[dict[str, FileRecord]], merge_files]


@runtime_checkable
class SandboxHook(Protocol):
    """Something to do when a thread's sandbox starts being used here, and when it stops."""

    def on_sandbox_start(self, sandbox: p.SandboxBackendProtocol) -> None: ...

    def on_sandbox_stop(self, sandbox: p.SandboxBackendProtocol) -> None: ...


class SandboxProvider(abc.ABC):
    """Where a thread's sandboxes come from. A sandbox's `key` is what the thread's state keeps
    and `attach` takes, in this process or another."""

    @abc.abstractmethod
    def create(self) -> p.SandboxBackendProtocol: ...

    @abc.abstractmethod
    def attach(self, key: str) -> p.SandboxBackendProtocol:
        """The live sandbox of that `key`, made by this provider, possibly in another process.
        Raises `LookupError` when it no longer exists."""

    @abc.abstractmethod
    def release(self, sandbox: p.SandboxBackendProtocol) -> None:
        """End the sandbox: it and its files are gone."""

    def detach(self, sandbox: p.SandboxBackendProtocol) -> None:  # noqa: B027 - optional hook
        """Drop this process's handle (connections, helpers); the sandbox lives on."""

    def key(self, sandbox: p.SandboxBackendProtocol) -> str:
        """What `attach` takes to reach ``sandbox`` again."""
        return sandbox.id

    def workdir(self, sandbox: p.SandboxBackendProtocol) -> str:
        """Where the sandbox's files live, as the model sees it."""
        if isinstance(sandbox, VirtualRoot):
            return sandbox.workspace
        return sandbox.workdir if isinstance(sandbox, Sandbox) else "/"


class ProviderAdapter(SandboxProvider):
    """The sandboxes of any `sandboxes.lifecycle.Provider` (a pooled one hands out warm ones),
    keyed by their `Sandbox.ref`: ``ProviderAdapter(DockerProvider(template))``.

    With ``virtual_root``, the model sees each sandbox's working directory as that path
    (`agent.virtual.VirtualRoot`) when the directory is plain enough to substitute: a local
    sandbox's host path stays out of the conversation."""

    def __init__(self, provider: Provider[Sandbox], *, virtual_root: str | None = None) -> None:
        self.provider = provider
        self.virtual_root = virtual_root

    def _view(self, sandbox: Sandbox) -> p.SandboxBackendProtocol:
        real = sandbox.workdir
        if self.virtual_root is None or real == self.virtual_root or not plain_path(real):
            return sandbox
        return VirtualRoot(sandbox, real, self.virtual_root)

    @staticmethod
    def _handle(sandbox: p.SandboxBackendProtocol) -> Sandbox:
        inner = sandbox.sandbox if isinstance(sandbox, VirtualRoot) else sandbox
        if not isinstance(inner, Sandbox):
            raise TypeError(f"{type(inner).__name__} was not made by a sandboxes.lifecycle.Provider")
        return inner

    def create(self) -> p.SandboxBackendProtocol:
        provider = self.provider
        return self._view(provider.acquire() if isinstance(provider, PooledProvider) else provider.create())

    def attach(self, key: str) -> p.SandboxBackendProtocol:
        return self._view(self.provider.attach(key))

    def release(self, sandbox: p.SandboxBackendProtocol) -> None:
        self._handle(sandbox).destroy()

    def detach(self, sandbox: p.SandboxBackendProtocol) -> None:
        self._handle(sandbox).close()

    def key(self, sandbox: p.SandboxBackendProtocol) -> str:
        return self._handle(sandbox).ref


class RemoteProvider(SandboxProvider):
    """Sandboxes of the sandbox service, through `sandboxes.client` (``ttl`` in seconds)."""

    def __init__(
        self, url: str, api_key: str, *, template: str = "default", ttl: float | None = None, client: Any = None
    ) -> None:
        from sandboxes.client import SandboxClient

        self.client = client or SandboxClient(url, api_key)
        self.template = template
        self.ttl = ttl

    def create(self) -> p.SandboxBackendProtocol:
        sandbox: p.SandboxBackendProtocol = self.client.create(self.template, ttl=self.ttl)
        return sandbox

    def attach(self, key: str) -> p.SandboxBackendProtocol:
        self.client.get(key)  # NotFound now rather than at the first tool call
        sandbox: p.SandboxBackendProtocol = self.client.attach(key)
        return sandbox

    def release(self, sandbox: p.SandboxBackendProtocol) -> None:
        ProviderAdapter._handle(sandbox).destroy()


class FixedSandbox(SandboxProvider):
    """One sandbox the caller made and owns: every thread uses it and nothing here ends it."""

    def __init__(self, sandbox: p.SandboxBackendProtocol) -> None:
        self.sandbox = sandbox

    def create(self) -> p.SandboxBackendProtocol:
        return self.sandbox

    def attach(self, key: str) -> p.SandboxBackendProtocol:
        if key != self.sandbox.id:
            raise LookupError(f"this agent's sandbox is {self.sandbox.id!r}, not {key!r}")
        return self.sandbox

    def release(self, sandbox: p.SandboxBackendProtocol) -> None:
        """The caller owns the sandbox."""


def hook_priority(hook: object) -> int:
    priority = getattr(hook, "priority", 0)
    return priority if isinstance(priority, int) else 0


class SandboxMiddleware(AgentMiddleware[SandboxAgentState, Any]):
    """Gives each thread its sandbox (``before_agent``) and ends it as configured (``after_agent``)."""

    state_schema = SandboxAgentState
    priority = 100

    def __init__(
        self,
        provider: SandboxProvider,
        *,
        release: ReleasePolicy = "ttl",
        on_missing: MissingPolicy = "replace",
        hooks: Iterable[SandboxHook] = (),
    ) -> None:
        super().__init__()
        self.provider = provider
        self.release_policy: ReleasePolicy = release
        self.on_missing: MissingPolicy = on_missing
        self.hooks: list[SandboxHook] = sorted(hooks, key=hook_priority, reverse=True)
        """Outermost first, like a middleware stack."""
        self._live: dict[str, p.SandboxBackendProtocol] = {}
        self._workdirs: dict[str, str] = {}
        self._lock = threading.Lock()
        self.tools = []

    def add_hooks(self, hooks: Iterable[SandboxHook]) -> None:
        """Hooks of an ordered stack, outermost first (`create_sandbox_agent` passes its stack's)."""
        self.hooks = [*self.hooks, *hooks]

    # ------------------------------------------------------------------ the registry

    def sandbox(self, sandbox_id: str) -> p.SandboxBackendProtocol:
        """The live sandbox of that id, attached on first use in this process."""
        with self._lock:
            found = self._live.get(sandbox_id)
        if found is not None:
            return found
        return self._adopt(self.provider.attach(sandbox_id))

    def _adopt(self, sandbox: p.SandboxBackendProtocol) -> p.SandboxBackendProtocol:
        key = self.provider.key(sandbox)
        workdir = self.provider.workdir(sandbox)  # may ask the service: not under the lock
        with self._lock:
            existing = self._live.get(key)
            if existing is None:
                self._live[key] = sandbox
                self._workdirs[key] = workdir
        if existing is not None:  # another call attached it first: keep one handle
            if existing is not sandbox:
                self.provider.detach(sandbox)
            return existing
        self._run_hooks("on_sandbox_start", sandbox, reversed(self.hooks))
        return sandbox

    def _forget(self, sandbox_id: str) -> p.SandboxBackendProtocol | None:
        with self._lock:
            sandbox = self._live.pop(sandbox_id, None)
            self._workdirs.pop(sandbox_id, None)
        if sandbox is not None:
            self._run_hooks("on_sandbox_stop", sandbox, self.hooks)
        return sandbox

    def workdir(self, sandbox_id: str) -> str:
        """The working directory of a live sandbox (looked up once, when it was adopted)."""
        with self._lock:
            found = self._workdirs.get(sandbox_id)
        return found if found is not None else self.provider.workdir(self.sandbox(sandbox_id))

    @staticmethod
    def _run_hooks(name: str, sandbox: p.SandboxBackendProtocol, hooks: Iterable[SandboxHook]) -> None:
        for hook in hooks:
            method: Callable[[p.SandboxBackendProtocol], None] = getattr(hook, name)
            method(sandbox)

    @property
    def live(self) -> tuple[str, ...]:
        """Ids of the sandboxes this process holds."""
        with self._lock:
            return tuple(self._live)

    def release(self, sandbox_id: str) -> None:
        """End a thread's sandbox now (the thread is over)."""
        sandbox = self._forget(sandbox_id)
        self.provider.release(sandbox if sandbox is not None else self.provider.attach(sandbox_id))

    def close(self) -> None:
        """Stop using every sandbox held here without ending them (they wait for their thread)."""
        for sandbox_id in self.live:
            sandbox = self._forget(sandbox_id)
            if sandbox is not None:
                with contextlib.suppress(Exception):
                    self.provider.detach(sandbox)

    # ------------------------------------------------------------------ hooks

    def before_agent(self, state: SandboxAgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        sandbox_id = state.get("sandbox_id")
        if not sandbox_id:
            key = self.provider.key(self._adopt(self.provider.create()))
            logger.info("thread got sandbox %s", key)
            return {"sandbox_id": key}
        try:
            self.sandbox(sandbox_id)
        except LookupError as exc:
            if self.on_missing == "raise":
                raise SandboxGone(sandbox_id, str(exc)) from exc
            key = self.provider.key(self._adopt(self.provider.create()))
            logger.warning("thread's sandbox %s is gone (%s); replaced by %s", sandbox_id, exc, key)
            return {"sandbox_id": key, "messages": [HumanMessage(content=gone_notice())]}
        return None

    def after_agent(self, state: SandboxAgentState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        sandbox_id = state.get("sandbox_id")
        if self.release_policy != "end" or not sandbox_id:
            return None
        self.release(sandbox_id)
        return {"sandbox_id": None}
