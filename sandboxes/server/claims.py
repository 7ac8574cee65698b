"""Claims: whose a pooled sandbox became (`sandboxes.server.pool`), recorded where its labels
cannot say it.

A pooled sandbox is made before anyone asks for it, so its labels (fixed at creation on
Docker) name no tenant. When a create claims it, the claim is written as the sandbox's state
(`SandboxState`: tenant, expiry, the ``Idempotency-Key`` and request digests) to one small
JSON file of its own in this service's data directory, outside every sandbox, made exclusively
(`StateStore.save_new`): a sandbox is claimed once, and a ``kill -9`` leaves the claim whole or
absent. A claimed sandbox is then its tenant's like any other: `sandboxes.server.backends`
reads its state from its claim wherever it reads a sandbox's state from its labels.

The claims are this service's: they live in its data directory and in its memory (loaded at
start), and the pool label's value (`Claims.pool_id`) names this data directory, so another
service on the same engine neither claims nor reaps what this one pooled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import socket
import threading
from pathlib import Path

from sandboxes.server.store import DELETED_AT, SandboxState, StateStore

__all__ = ["Claims", "pool_id_of"]


def pool_id_of(data_dir: Path) -> str:
    """The pool label's value of the service keeping its state in ``data_dir``: 16 hex digits
    (a valid label value everywhere), the same across its restarts, another for another one."""
    where = f"{socket.gethostname()}\0{data_dir.resolve()}"
    return hashlib.sha256(where.encode()).hexdigest()[:16]


class Claims:
    """The claimed pooled sandboxes of this service, by sandbox id: on disk and in memory, the
    memory always the disk's (written there first)."""

    def __init__(self, directory: Path, pool_id: str) -> None:
        self.pool_id = pool_id
        self._store = StateStore(directory)
        self._lock = threading.Lock()
        self._held = {state.id: state for state in self._store.load_all()}

    def claim(self, state: SandboxState) -> bool:
        """Record ``state`` as its sandbox's claim; ``False`` if that sandbox is claimed already."""
        with self._lock:
            if state.id in self._held or not self._store.save_new(state):
                return False
            self._held[state.id] = dataclasses.replace(state)
            return True

    def get(self, sandbox_id: str) -> SandboxState | None:
        """A copy of the claim of ``sandbox_id``; ``None`` if it is not claimed."""
        with self._lock:
            held = self._held.get(sandbox_id)
            return None if held is None else dataclasses.replace(held)

    def matching(
        self, backend: str, tenant: str | None = None, idempotency_key: str | None = None
    ) -> list[SandboxState]:
        """Copies of the claims of ``backend``'s sandboxes, of ``tenant`` and with ``idempotency_key``
        where given."""
        with self._lock:
            return [
                dataclasses.replace(state)
                for state in self._held.values()
                if state.backend == backend
                and (tenant is None or state.tenant == tenant)
                and (idempotency_key is None or state.idempotency_key == idempotency_key)
            ]

    def counted(self, backend: str, tenant: str) -> list[SandboxState]:
        """The claims of ``backend``'s sandboxes of ``tenant`` themselves, not copies: for a
        caller that only reads them (a quota count, on every claim of a burst). A claim held is
        never changed in place, only replaced (`claim`, `renew`), so what this returns stays as
        it was read."""
        with self._lock:
            return [state for state in self._held.values() if state.backend == backend and state.tenant == tenant]

    def renew(self, sandbox_id: str, expires_at: float) -> bool:
        """Record a new expiry on the claim of ``sandbox_id`` (none: nothing to do); ``False``,
        nothing done, if the claim records its sandbox deleted (`DELETED_AT`): no renewal, not
        one under way since before the deletion, undoes a deletion."""
        with self._lock:
            held = self._held.get(sandbox_id)
            if held is None:
                return True
            if held.deleted_on_record and expires_at > DELETED_AT:
                return False
            renewed = dataclasses.replace(held, expires_at=expires_at)
            self._store.save(renewed)
            self._held[sandbox_id] = renewed
            return True

    def drop(self, sandbox_id: str) -> None:
        """Forget the claim of ``sandbox_id``, whose sandbox is gone (idempotent)."""
        with self._lock:
            if self._held.pop(sandbox_id, None) is not None:
                self._store.remove(sandbox_id)

    def ids(self) -> set[str]:
        with self._lock:
            return set(self._held)
