"""Reconciliation: what the service remembers (its state files) against what the providers
really have, at start-up and for a template whose backend comes back. The live sandboxes are
adopted; the expired, the deleted, the orphaned and the stopped that cannot come back whole are
destroyed (this service's unclaimed pooled ones too: its pool makes new ones,
`sandboxes.server.pool`); then every provider sweeps its own leftovers. This is what makes a ``kill -9`` of the
service lose nothing.

Everything here blocks (provider calls); the registry calls it from a worker thread.
"""

from __future__ import annotations

import logging
import math

from sandboxes.lifecycle import HolderBoundProvider, ResumableProvider, SandboxRecord, SharedProvider
from sandboxes.server.backends import (
    LABEL_POOL_MEMBER,
    Adopted,
    ProviderBackend,
    pooled_elsewhere,
    state_from_record,
    workdir_of,
)
from sandboxes.server.store import SandboxState

__all__ = ["reconcile"]

logger = logging.getLogger(__name__)


def reconcile(
    backends: dict[str, ProviderBackend],
    states: list[SandboxState],
    now: float,
    *,
    held: frozenset[tuple[str, str]] = frozenset(),
) -> tuple[list[Adopted], set[str]]:
    """Compare ``states`` (what the service remembers) with what the providers list: return the
    live sandboxes to adopt; destroy the expired, the deleted, the orphaned and the stopped that
    cannot come back whole. Then let every provider sweep its own leftovers (a volume whose
    container is gone, a record whose root is). Sandboxes in ``held`` (backend kind, ref) are
    the caller's already and left alone.

    Also returns the templates whose provider could not list (a host down, an engine not
    answering): what exists there is unknown, so nothing of theirs is adopted, dropped or
    swept on a guess; the caller keeps their states and tries again later, while every other
    template serves."""
    remembered = {(state.backend, state.ref): state for state in states}
    seen: set[tuple[str, str]] = set(held)
    adopted: list[Adopted] = []
    unreachable: set[str] = set()
    for backend in backends.values():
        try:
            records = backend.provider.list()
        except Exception:
            logger.exception("the %s template's provider cannot list its sandboxes", backend.template_name)
            unreachable.add(backend.template_name)
            continue
        for record in records:
            key = (backend.name, record.ref)
            if key in seen:  # templates of one backend may share what they list
                continue
            seen.add(key)
            state = _remembered(remembered.get(key), record, backend)
            if state is None and pooled_elsewhere(record, backend):  # its service's, its expiry bounds it
                continue
            try:
                found = _adopt(backends, backend, record, state, now)
            except Exception:
                logger.exception("adopting %s sandbox %s failed", backend.name, record.ref)
                continue
            if found is not None:
                adopted.append(found)
    for backend in backends.values():
        if backend.template_name in unreachable:
            continue
        try:
            swept = backend.provider.sweep(now)
        except Exception:
            logger.exception("sweeping the %s template's provider failed", backend.template_name)
            continue
        for ref in swept.removed:
            logger.info("swept %s leftover %s", backend.name, ref)
    return adopted, unreachable


def _remembered(state: SandboxState | None, record: SandboxRecord, backend: ProviderBackend) -> SandboxState | None:
    """The sandbox as the service remembers it: its state file's; a shared provider's sandbox
    whose file was kept beside its record (`SandboxState.kept_beside_record`) is its own
    record, with what that file says (`SandboxState.take_recorded`)."""
    if state is None or not state.kept_beside_record or not isinstance(backend.provider, SharedProvider):
        return state or state_from_record(record, backend)
    recorded = state_from_record(record, backend)
    if recorded is not None:
        recorded.take_recorded(state)
    return recorded


def _adopt(
    backends: dict[str, ProviderBackend],
    lister: ProviderBackend,
    record: SandboxRecord,
    state: SandboxState | None,
    now: float,
) -> Adopted | None:
    owner = backends.get(state.template) if state is not None else None
    backend = owner if owner is not None and owner.name == lister.name else lister
    provider = backend.provider
    if record.starting:  # another replica may be making it; its expiry and sweeps bound it
        return None
    shared = isinstance(provider, SharedProvider)
    claimed = bool(record.labels.get(LABEL_POOL_MEMBER))  # its claim's expiry is the one
    if state is not None and shared and record.expires_at is not None and not claimed:
        state.expires_at = max(state.expires_at, record.expires_at)  # renewed by another replica
    if state is not None and shared and not state.deleting and state.expires_at <= now:
        now_recorded = [found for found in backend.select(sandbox_id=state.id) if found.ref == record.ref]
        if not now_recorded:  # gone since the list
            return None
        state.expires_at = max(state.expires_at, now_recorded[0].expires_at)  # renewed since the list
    if state is not None and state.pause_intent:  # a kill -9 between its freeze and its record: frozen now?
        frozen = record.frozen or isinstance(provider, HolderBoundProvider)  # a jail's processes ended anyway
        state.settle_pause(frozen, float(math.ceil(now + backend.settings.max_ttl)) if shared else 0.0)
    if state is not None and state.resume_expiry:  # a kill -9 between its thaw and its record: thawed now?
        state.settle_resume(record.running and not record.frozen and not isinstance(provider, HolderBoundProvider))
    if state is None or state.deleting or (state.expires_at <= now and state.paused != "stop"):  # stop: no expiry
        logger.info("reaping %s sandbox %s (deleted, expired or not a tenant's)", backend.name, record.ref)
        provider.destroy(record.ref)
        return None
    if not record.running and not (isinstance(provider, ResumableProvider) and provider.resume(record.ref)):
        logger.warning("reaping %s sandbox %s: it stopped and cannot come back whole", backend.name, record.ref)
        provider.destroy(record.ref)
        return None
    try:
        sandbox = backend.attach(state)
    except LookupError:
        logger.info("%s sandbox %s is gone", backend.name, record.ref)
        return None
    if shared and state.expires_at != record.expires_at:
        try:
            _record_expiry(backend, state)
        except LookupError:
            logger.info("%s sandbox %s is gone", backend.name, record.ref)
            return None
    if not state.workdir:
        state.workdir = workdir_of(sandbox)
    if state.paused and isinstance(provider, HolderBoundProvider):  # frozen by a process that is gone
        state.processes_ended = True
    return state, sandbox


def _record_expiry(backend: ProviderBackend, state: SandboxState) -> None:
    """Put a remembered expiry on a shared provider's sandbox, which is its own record once
    adopted (its state file is dropped). A service of before replicas made its sandboxes with
    their creation's expiry in a label and kept renewals in its state files: without this, every
    replica would read the label's and reap a renewed sandbox early."""
    expires_at = float(math.ceil(state.expires_at))
    backend.renew(state, expires_at)
    state.expires_at = expires_at
