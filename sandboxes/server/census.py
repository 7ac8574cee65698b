"""What the shared backends (`ProviderBackend.shared`: Docker, Kubernetes) record of the service's
sandboxes, across templates: the one view every replica of the service reads, since none of
them holds the truth in memory or on its disk.

Templates of one backend may list the same sandboxes (one owner, one engine or namespace), so
results are told apart by ``(backend, ref)``, and templates of one `ProviderBackend.scope` are
listed once. Everything here blocks (one label-selected list per shared scope); the registry
calls it from worker threads.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from sandboxes.server.auth import Tenant
from sandboxes.server.backends import ProviderBackend
from sandboxes.server.settings import Template
from sandboxes.server.store import SandboxState

__all__ = [
    "Usage",
    "all_states",
    "expired_now",
    "find_state",
    "gone",
    "keyed_states",
    "keyed_states_of",
    "over_quota",
    "tenant_states",
    "tenants_states",
]


def gone(held: SandboxState, recorded: SandboxState | None) -> bool:
    """Whether ``recorded`` (what the backend records now of the id of the sandbox ``held``
    stands for) says that sandbox is gone: no record, another sandbox's of the same id, or its
    deletion's (`SandboxState.deleted_on_record`)."""
    return recorded is None or recorded.ref != held.ref or recorded.deleted_on_record


@dataclass(frozen=True, slots=True)
class Usage:
    """What a tenant's sandboxes count against its quota."""

    count: int = 0
    cpus: float = 0.0
    memory: int = 0

    @classmethod
    def of(cls, states: Iterable[SandboxState]) -> Usage:
        listed = list(states)
        return cls(len(listed), sum(s.cpus for s in listed), sum(s.memory for s in listed))


def _select(backends: dict[str, ProviderBackend], **labels: str) -> list[SandboxState]:
    seen: dict[tuple[str, str], SandboxState] = {}
    listed: set[Hashable] = set()
    for backend in backends.values():
        if backend.shared and backend.scope not in listed:  # one list per engine and owner
            listed.add(backend.scope)
            for state in backend.select(**labels):
                seen.setdefault((state.backend, state.ref), state)
    for state in seen.values():  # listed by any template of its backend: cost it by its own
        own = backends.get(state.template)
        if own is not None and own.name == state.backend:
            state.cpus, state.memory = own.template.cpus, own.template.memory_bytes
    return list(seen.values())


def over_quota(tenant: Tenant, used: Usage, template: Template) -> str | None:
    """Why one more sandbox of ``template`` would exceed the tenant's quota; ``None``: it fits."""
    policy = tenant.policy
    if used.count + 1 > policy.max_sandboxes:
        return f"{used.count} live sandboxes, the maximum is {policy.max_sandboxes}"
    if used.cpus + template.cpus > policy.max_cpus + 1e-9:
        return f"{used.cpus:g} cpus in use, {template.cpus:g} more would exceed {policy.max_cpus:g}"
    if used.memory + template.memory_bytes > policy.max_memory_bytes:
        return f"{used.memory} bytes of memory in use, {template.memory} more would exceed {policy.max_memory}"
    return None


def tenant_states(backends: dict[str, ProviderBackend], tenant: str) -> list[SandboxState]:
    """The tenant's sandboxes on the shared backends, whoever created them."""
    return _select(backends, tenant=tenant)


def tenants_states(backends: dict[str, ProviderBackend], tenants: frozenset[str]) -> list[SandboxState]:
    """The sandboxes of each of ``tenants`` on the shared backends (`tenant_states`, one after
    the other): what one coalesced read answers (`sandboxes.server.idempotency.Lookups`)."""
    return [state for tenant in sorted(tenants) for state in tenant_states(backends, tenant)]


def find_state(backends: dict[str, ProviderBackend], sandbox_id: str) -> SandboxState | None:
    """The sandbox whose service id is ``sandbox_id``, on whichever shared backend has it; a
    live one before one deleted (`SandboxState.deleted_on_record`) whose destroy is still retried:
    a create with the same ``Idempotency-Key`` may make a sandbox of that id again meanwhile."""
    found = sorted(_select(backends, sandbox_id=sandbox_id), key=lambda state: state.deleted_on_record)
    return found[0] if found else None


def keyed_states(backends: dict[str, ProviderBackend], key: str) -> list[SandboxState]:
    """The sandboxes on the shared backends created with the ``Idempotency-Key`` digest ``key``."""
    return _select(backends, idempotency_key=key)


def keyed_states_of(backends: dict[str, ProviderBackend], keys: frozenset[str]) -> list[SandboxState]:
    """The sandboxes on the shared backends created with any of the ``Idempotency-Key`` digests
    ``keys``: for one, its label-selected list; for several, one list of every sandbox (and
    every claim), filtered here."""
    if len(keys) == 1:
        return keyed_states(backends, next(iter(keys)))
    seen = {(state.backend, state.ref): state for state in _select(backends) if state.idempotency_key in keys}
    for backend in backends.values():
        if backend.shared and backend.claims is not None:
            for state in backend.claims.matching(backend.name):
                if state.idempotency_key in keys:
                    seen.setdefault((state.backend, state.ref), state)
    return list(seen.values())


def all_states(backends: dict[str, ProviderBackend]) -> list[SandboxState]:
    """Every tenant's sandboxes on the shared backends, for a sweep."""
    return _select(backends)


def expired_now(backend: ProviderBackend, state: SandboxState, now: float) -> bool:
    """Whether ``state``'s sandbox is still there and expired by ``now``, as its record says at
    this moment. A sweep's list ages while the sweep destroys what expired one after the other
    (a pod's deletion takes seconds): a renewal another replica acknowledged meanwhile is on the
    record, and must win over the list."""
    return any(found.ref == state.ref and found.expires_at <= now for found in backend.select(sandbox_id=state.id))
