"""The live sandboxes, per tenant: creation under quota, lookup, TTL, deletion, and the
reconciliation with the backends that makes a ``kill -9`` of the service lose nothing.

TTLs are enforced twice: a timer per sandbox fires at its expiry, and a periodic sweep catches
whatever a timer missed (a clock jump, a failed destroy to retry). All bookkeeping happens on
the event loop thread, so a quota check and the reservation that follows it cannot interleave
with another request's; only backend calls run in worker threads. Expiries are decided on the
registry's `Clock` (the wall clock unless one is given), and `sweep_soon` runs a sweep now from
any thread: tests move a `ManualClock` and sweep instead of sleeping until a TTL passes.

Several replicas. A sandbox of a shared backend (Docker, Kubernetes: `ProviderBackend.shared`)
is its own record: tenant, template, expiry and creation time are on it (`sandboxes.server.
census`), and what a replica holds of it is a cache. A request for an id this replica does not
hold finds it by label and adopts it; one for an id it holds re-reads the record once
``confirm_interval`` has passed (deleted elsewhere: 404; renewed elsewhere: the new expiry;
its network set elsewhere: the one on its record, or in the state file of a replica sharing the
data directory: `sandboxes.server.networks`),
and every sweep compares the whole cache with the backend and reaps what expired, whoever
created it. Quotas are counted from the backend too, before a creation and again after it
(`sandboxes.server.quotas`): a newcomer that finds its tenant over quota (another replica
created at the same time) is destroyed again and refused. Two racing creations may both be
refused, but both are never kept over the quota, as long as the backend's list shows every
creation that returned before it (a Kubernetes list is a quorum read; one Docker engine is one
state). Local and SSH sandboxes belong to the one service that reaches them: their renewals
live in its state files.

A deletion is recorded before the sandbox is destroyed, where a restart and every replica read
it: a local sandbox's state file says ``deleting``, a shared backend's record (or claim) has
its expiry moved to `DELETED_AT` (`Holdings.record_deletion`). A destroy that fails is retried
by the sweep, and a restart in between finishes it: a deletion answered is never undone.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time

from sandboxes.api import CreateSandbox
from sandboxes.base import BaseSandbox
from sandboxes.lifecycle import Lifecycle, Mount, SandboxNameTaken, SandboxStartError
from sandboxes.server import census, idempotency
from sandboxes.server.auth import Tenant
from sandboxes.server.backends import Adopted, ProviderBackend
from sandboxes.server.entry import Entry
from sandboxes.server.errors import ServiceError, not_found
from sandboxes.server.inherited import take_kept, with_kept_egress
from sandboxes.server.keeping import Keeping
from sandboxes.server.pool import Pools
from sandboxes.server.quotas import Reservation
from sandboxes.server.settings import LABEL_VALUE
from sandboxes.server.store import SandboxState
from sandboxes.server.validation import check_egress, check_env, check_labels

__all__ = ["Entry", "Registry"]

logger = logging.getLogger(__name__)


class Registry(Keeping):
    _snapshots_swept = 0.0
    """When (`time.monotonic`) the snapshot store was last swept (`_sweep_snapshots`)."""

    # ------------------------------------------------------------------ lifecycle

    @functools.cached_property
    def pools(self) -> Pools:
        """The templates' warm pools (`sandboxes.server.pool`), and the claims of what they
        handed out, which the backends read a claimed sandbox's state from."""
        return Pools(self.settings, self.backends, self.metrics, self.clock.now)

    async def start(self) -> None:
        """Adopt what the backends really have, reap the rest, then start enforcing TTLs and
        filling the warm pools."""
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(lambda: self.pools)  # its claims are read before any record is
        now = self.clock.now()
        states = await asyncio.to_thread(self.store.load_all)
        kinds = {backend.name for backend in self.backends.values()}
        mine = [state for state in states if state.backend in kinds]
        await self._reconcile(self.backends, [state for state in mine if not state.hibernated], now)
        await self.hold_hibernated([state for state in mine if state.hibernated])
        for left in await asyncio.to_thread(self.snapshots.sweep):
            logger.info("removed %s, a snapshot a stopped service left half written or deleted", left.name)
        self._snapshots_swept = time.monotonic()
        await self.reap_unverified()
        for state in states:
            if state.backend not in kinds:
                logger.warning("sandbox %s is on backend %s, which no template uses now", state.id, state.backend)
        self._update_gauge()
        self.pools.start(self._entries, self._unreconciled)
        self._sweeper = asyncio.create_task(self._sweep_forever())
        self.ready = True

    async def close(self) -> None:
        """Stop enforcing; the sandboxes stay for the next start to adopt."""
        self.ready = False
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in list(self._tasks):
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task
        await self.pools.close()
        for entry in self._entries.values():
            entry.processes.close()  # its background processes keep running in the sandbox
            if isinstance(entry.sandbox, Lifecycle):
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(entry.sandbox.close)
        for backend in self.backends.values():
            backend.close()

    # ------------------------------------------------------------------ requests

    async def create(self, tenant: Tenant, request: CreateSandbox, key: str | None = None) -> tuple[Entry, bool]:
        """A new sandbox, or with an ``Idempotency-Key`` the live one it made (``True``: see
        `sandboxes.server.idempotency`); nothing is held across a backend's create but a key's."""
        keyed = idempotency.keyed(tenant.id, key, request)
        with self.volumes.mounting(tenant.id, [volume.name for volume in request.volumes]):
            if keyed is None:
                return await self._create(tenant, request, None), False
            made_with = functools.partial(self._made_with, tenant, request, keyed.key)
            return await self._keys.create(keyed, made_with, functools.partial(self._create, tenant, request, keyed))

    async def _made_with(self, tenant: Tenant, request: CreateSandbox, key: str) -> tuple[Entry, str] | None:
        """The tenant's live sandbox created with the key digest ``key``: held here, else
        recorded on a shared backend (another replica's, or this one's before a restart). A
        create that a warm pool will serve looks only at what this service holds (its sandboxes,
        adopted at start-up, and its claims), as its quota count does: no read of the backends."""
        now = self.clock.now()
        held = [e.state for e in self._entries.values() if e.state.idempotency_key == key]
        if not self._shared:
            recorded: list[SandboxState] = []
        elif self.pools.offers(request.template, request):  # a claim: the pool is this service's alone
            kinds = {backend.name for backend in self.backends.values() if backend.shared}
            recorded = [state for kind in kinds for state in self.pools.claims.matching(kind, tenant.id, key)]
        else:
            recorded = await self._keyed.find(key)
        for state in sorted([*held, *recorded], key=lambda state: (state.created_at, state.id)):
            if state.tenant != tenant.id or state.expires_at <= now or self._deleted_here(state.id):
                continue
            try:
                entry = self._entries.get(state.id) or await self._adopt(state)
                return await self.find(tenant, entry.state.id), state.request_digest
            except ServiceError as exc:
                if exc.code != "not_found":  # unknown whether it lives: not another one made
                    raise
        return None

    async def _create(self, tenant: Tenant, request: CreateSandbox, keyed: idempotency.Keyed | None) -> Entry:
        template = self.settings.templates.get(request.template)
        if template is None:
            known = ", ".join(sorted(self.settings.templates))
            raise ServiceError("invalid_request", f"unknown template {request.template!r} (known: {known})")
        check_env(request.env)
        check_labels(request.labels, pod_labels=template.label_values_only)
        kept = None
        if request.snapshot is not None:  # the tenant's, or a 404 before anything is made
            kept = (await asyncio.to_thread(self.snapshots.get, tenant.id, request.snapshot)).network
            request = with_kept_egress(request, kept, template)
        check_egress(request.template, template, request.egress_allow)
        backend = self.backends[request.template]
        mounts = self.volumes.mounts(tenant.id, request.template, request.volumes)
        ttl = min(request.ttl or template.ttl, self.settings.max_ttl)
        expires_at = _expiry(backend, ttl, self.clock.now())
        started = time.perf_counter()
        claimed = None
        if self.pools.offers(request.template, request):  # counted from what is held: no backend read
            held = self._quotas.admit_held(tenant, template, self._holding(tenant))
            if held is not None:
                reservation = held
                claimed = await self._claim(reservation, backend, request, tenant, expires_at, keyed)
                if claimed is None:  # a cold create is counted from the backends' records
                    self._quotas.release(reservation)
        if claimed is None:
            reservation = await self._quotas.reserve(tenant, template)
            claimed = await self._claim(reservation, backend, request, tenant, expires_at, keyed)
        if claimed is None:
            state, sandbox = await self._make(tenant, request, keyed, backend, expires_at, mounts, reservation)
        else:
            state, sandbox = claimed
        state.volumes = [volume.name for volume in request.volumes]
        try:
            if backend.shared and claimed is None:  # claims are one service's: no recount makes them replica-safe
                await self._quotas.recount(tenant, template, state, sandbox, backend)
        finally:
            self._quotas.release(reservation)
        taken = take_kept(state, kept, template)  # before its egress is served (`_register`)
        entry = await self._register(state, sandbox, backend)
        if taken or (backend.records_network and request.egress_allow is not None):  # its labels hold no list
            await self.record_made_network(entry)
        if request.snapshot is not None:
            entry = await self.restored(entry, request.snapshot)
        self.metrics.create_seconds.labels(backend.name).observe(time.perf_counter() - started)
        logger.info("created sandbox", extra={"sandbox": state.id, "tenant": tenant.id, "template": request.template})
        return entry

    async def record_made_network(self, entry: Entry) -> None:
        """Record the network a new sandbox was made with (`record_network`); one that cannot be
        recorded leaves no sandbox behind (removed), and its create answers the error."""
        try:
            await self.record_network(entry)
        except BaseException:
            await self._remove(entry)
            raise

    async def _claim(
        self,
        reservation: Reservation,
        backend: ProviderBackend,
        request: CreateSandbox,
        tenant: Tenant,
        expires_at: float,
        keyed: idempotency.Keyed | None,
    ) -> Adopted | None:
        """A pooled sandbox claimed for ``request`` (`Pools.claim`); the reservation is released
        if claiming fails."""
        try:
            return await self.pools.claim(backend, request, tenant.id, expires_at, keyed)
        except BaseException:
            self._quotas.release(reservation)
            raise

    def _holding(self, tenant: Tenant) -> list[SandboxState]:
        """The tenant's sandboxes on the shared backends as this service holds them: registered,
        or claimed from a pool and not registered yet (those deleted here count no more,
        as in `_counted`)."""
        held = (e.state for e in self._entries.values() if e.backend.shared)
        kinds = {backend.name for backend in self.backends.values() if backend.shared}
        claimed = (state for kind in kinds for state in self.pools.claims.counted(kind, tenant.id))
        return [state for state in (*held, *claimed) if state.tenant == tenant.id and not state.deleted_on_record]

    async def _make(
        self,
        tenant: Tenant,
        request: CreateSandbox,
        keyed: idempotency.Keyed | None,
        backend: ProviderBackend,
        expires_at: float,
        mounts: tuple[Mount, ...],
        reservation: Reservation,
    ) -> Adopted:
        """A new sandbox from the backend (cold); the reservation is released if none is made."""
        if request.snapshot is not None:  # a kill -9 from here on leaves it to reap (`reap_unverified`)
            await asyncio.to_thread((self.restoring / reservation.sandbox_id).touch)
        work = asyncio.ensure_future(
            asyncio.to_thread(
                backend.create,
                tenant.id,
                expires_at,
                dict(request.labels),
                dict(request.env),
                sandbox_id=reservation.sandbox_id,
                keyed=None if keyed is None else (keyed.key, keyed.request),
                mounts=mounts,
                auto_resume=request.auto_resume,
                egress_allow=request.egress_allow,
                on_timeout=request.on_timeout,
            )
        )
        try:
            state, sandbox = await asyncio.shield(work)
        except asyncio.CancelledError:
            # The request is abandoned (shutdown) but the sandbox is being made all the same:
            # track it, so its TTL reaps it, rather than leaking it until the next restart.
            work.add_done_callback(lambda done: self._adopt_late(done, backend))
            raise
        except ServiceError:
            raise
        except SandboxNameTaken:  # another replica's create with this key: its sandbox is the answer
            self._quotas.release(reservation)
            raise
        except SandboxStartError as exc:
            self._quotas.release(reservation)
            logger.error("a %s sandbox could not start: %s", backend.name, exc)
            raise ServiceError(
                "backend_unavailable",
                f"the {backend.name} backend could not start the sandbox: {exc.reason} (details in the service log)",
            ) from exc
        except Exception as exc:
            self._quotas.release(reservation)
            logger.exception("creating a %s sandbox failed", backend.name)
            raise ServiceError(
                "backend_unavailable", f"the {backend.name} backend failed; the service log has the request id"
            ) from exc
        return state, sandbox

    def _adopt_late(self, done: asyncio.Future[tuple[SandboxState, BaseSandbox]], backend: ProviderBackend) -> None:
        if not done.cancelled() and done.exception() is None:
            state, sandbox = done.result()
            self._spawn(lambda: self._register_quietly(state, sandbox, backend))

    async def _register_quietly(self, state: SandboxState, sandbox: BaseSandbox, backend: ProviderBackend) -> None:
        try:
            await self._register(state, sandbox, backend)
        except Exception:
            logger.exception("could not record sandbox %s; the next start-up will reconcile it", state.id)

    def held(self, tenant: Tenant, sandbox_id: str) -> Entry:
        """The tenant's sandbox as this replica holds it, without a backend call: a shared
        backend's only if confirmed within ``confirm_interval``. `not_found` otherwise, and
        `find` (after the tenant's rate check) asks the backend."""
        entry = self._entries.get(sandbox_id)
        if entry is None or entry.state.tenant != tenant.id or not self._trusted(entry):
            raise not_found(sandbox_id)
        return entry

    async def find(self, tenant: Tenant, sandbox_id: str) -> Entry:
        """The tenant's sandbox, held here or adopted from a shared backend's records (another
        replica made it); 404 if it does not exist, or is another tenant's."""
        entry = self._entries.get(sandbox_id)
        if entry is not None and entry.state.tenant != tenant.id:
            raise not_found(sandbox_id)
        if entry is not None and self._trusted(entry):
            return entry
        if entry is not None:
            return await self._confirm(entry)
        if self._unreachable(tenant, sandbox_id):
            raise ServiceError("backend_unavailable", f"the backend of sandbox {sandbox_id} cannot be reached now")
        # No lookup for an id no label can hold, nor one deleted here whose destroy is under way or retried.
        if not self._shared or not LABEL_VALUE.match(sandbox_id) or self._deleted_here(sandbox_id):
            raise not_found(sandbox_id)
        state = await self._read(census.find_state, self.backends, sandbox_id)
        if state is None or state.tenant != tenant.id or state.expires_at <= self.clock.now():
            raise not_found(sandbox_id)
        return await self._adopt(state)

    async def list(self, tenant: Tenant) -> list[Entry]:
        """The tenant's sandboxes: on shared backends as recorded there (adopting those another
        replica made, leaving out those deleted elsewhere), and the others held here."""
        mine = {entry.state.id: entry for entry in self._entries.values() if entry.state.tenant == tenant.id}
        if self._shared:
            listed_at = time.monotonic()
            states = await self._read(census.tenant_states, self.backends, tenant.id)
            now, recorded = self.clock.now(), {state.id: state for state in states}
            for sandbox_id, entry in list(mine.items()):
                gone = census.gone(entry.state, recorded.get(sandbox_id)) and not entry.state.hibernated
                if entry.backend.shared and gone and entry.confirmed < listed_at:
                    del mine[sandbox_id]
            for state in states:
                if state.id in mine and not census.gone(mine[state.id].state, state):
                    self._refresh(mine[state.id], state, listed_at)
                elif state.expires_at > now and not self._deleted_here(state.id):
                    with contextlib.suppress(ServiceError):
                        mine[state.id] = await self._adopt(state)
        return sorted(mine.values(), key=lambda entry: (entry.state.created_at, entry.state.id))

    async def renew(self, tenant: Tenant, sandbox_id: str, ttl: float) -> Entry:
        entry = await self.find(tenant, sandbox_id)
        expires_at = _expiry(entry.backend, min(ttl, self.settings.max_ttl), self.clock.now())
        try:
            await asyncio.to_thread(entry.backend.renew, entry.state, expires_at)
        except LookupError:
            await self._forget(entry)
            raise not_found(sandbox_id) from None
        entry.state.expires_at, entry.confirmed = expires_at, time.monotonic()  # as recorded now
        if not entry.backend.shared:
            await asyncio.to_thread(self.store.save, entry.state)
        self._schedule(sandbox_id)
        return entry

    async def delete(self, tenant: Tenant, sandbox_id: str) -> None:
        """Delete the tenant's sandbox: recorded first (`record_deletion`), then destroyed, or,
        if that fails, destroyed by a later sweep; answered deleted either way."""
        entry = await self.find(tenant, sandbox_id)
        self._removing.add(entry.state.id)  # from its mark on: no re-read forgets it (`_forget`)
        try:
            await self.record_deletion(entry)
        except BaseException:
            self._removing.discard(entry.state.id)
            raise
        await self._remove(entry)

    async def sweep(self) -> None:
        """`Holdings.sweep`, the warm pools' members that grew stale replaced, and what other
        writers left of snapshots (`_sweep_snapshots`)."""
        await super().sweep()
        await self.pools.sweep(self._entries, self._unreconciled)
        await self._sweep_snapshots()

    async def _sweep_snapshots(self) -> None:
        """At most once per `SNAPSHOT_SWEEP_INTERVAL`: remove what other writers left half
        written in the store, or half deleted (`SnapshotStore.sweep`, ``others_only``)."""
        if time.monotonic() - self._snapshots_swept < SNAPSHOT_SWEEP_INTERVAL:
            return
        self._snapshots_swept = time.monotonic()
        for left in await asyncio.to_thread(self.snapshots.sweep, others_only=True):
            logger.info("removed %s, a snapshot another writer left half written or deleted", left.name)

    def _pooled(self) -> frozenset[tuple[str, str]]:
        return self.pools.refs()


SNAPSHOT_SWEEP_INTERVAL = 600.0
"""Seconds between two sweeps of the snapshot store for what other writers left."""


def _expiry(backend: ProviderBackend, ttl: float, now: float) -> float:
    """``ttl`` from now; on a shared backend in whole seconds (rounded up), as its labels
    record it, so that the replica that set it and the others read the same instant."""
    expires_at = now + ttl
    return float(math.ceil(expires_at)) if backend.shared else expires_at
