"""What one replica holds of the sandboxes, and how it keeps that true: registering and
adopting handles, reconciling with what the backends have, confirming a shared sandbox against
its record (`held_confirmed`; its network: `sandboxes.server.networks`), counting a tenant's
sandboxes for its quotas, and expiring, sweeping and removing.

All of it runs on the event loop thread (only backend calls go to worker threads), so a check
and the change that follows it never interleave with another request's. `Registry` adds the
requests on top (`sandboxes.server.registry`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from sandboxes.base import BaseSandbox
from sandboxes.lifecycle import Lifecycle
from sandboxes.server import census, idempotency
from sandboxes.server.auth import Tenant
from sandboxes.server.backends import ProviderBackend, workdir_of
from sandboxes.server.clock import Clock, WallClock
from sandboxes.server.entry import Entry
from sandboxes.server.errors import ServiceError, not_found
from sandboxes.server.metrics import Metrics
from sandboxes.server.processes import ProcessTable
from sandboxes.server.quotas import Quotas
from sandboxes.server.reconcile import reconcile
from sandboxes.server.settings import ServiceSettings
from sandboxes.server.store import DELETED_AT, SandboxState, StateStore
from sandboxes.server.volumes import Volumes

__all__ = ["Holdings"]

logger = logging.getLogger("sandboxes.server.registry")

_States = list[SandboxState]
_T = TypeVar("_T")

DELETED_GRACE = 60.0
"""Seconds (of the service's clock, from its first sweep that saw the mark) a replica leaves a
sandbox another one recorded deleted (`SandboxState.deleted_on_record`) to that one's destroy and
its retries, before its sweep destroys it too: the deleter may be gone for good, but while it
lives, two removals of one container at once fail one another."""


class Holdings:
    """The sandboxes this replica holds (`Entry` by id), their timers and the sweep; the base of
    `sandboxes.server.registry.Registry`."""

    def __init__(
        self,
        settings: ServiceSettings,
        backends: dict[str, ProviderBackend],
        metrics: Metrics,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.clock: Clock = clock or WallClock()
        self.backends = backends
        self.metrics = metrics
        self.store = StateStore(settings.data_dir / "state")
        self.ready = False
        self.on_register: list[Callable[[Entry], None]] = []
        """Called (on the event loop) with each sandbox this replica starts to hold."""
        self.on_network: list[Callable[[Entry], None]] = []
        """Called (on the event loop) with a held sandbox whose network another replica changed."""
        self._entries: dict[str, Entry] = {}
        self.volumes = Volumes(settings, backends)
        self._quotas = Quotas(self._counted, self._held, self.clock.now)
        self._keys: idempotency.Idempotency[Entry] = idempotency.Idempotency()
        self._keyed: idempotency.Lookups[SandboxState] = idempotency.Lookups(
            functools.partial(self._read, census.keyed_states_of, backends), _idempotency_key
        )
        """The shared backends' records made with a key digest, read for a burst of creates at once."""
        self._tenant_reads: idempotency.Lookups[SandboxState] = idempotency.Lookups(
            functools.partial(self._read, census.tenants_states, backends), _tenant_of
        )
        """The shared backends' records of a tenant, read for a burst of its quota counts at once."""
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._doomed: dict[str, Entry] = {}
        """Sandboxes whose destroy failed: the sweep tries again."""
        self._removing: set[str] = set()
        """Sandboxes deleted here whose destroy is under way: not adopted back from their records."""
        self._deleted_elsewhere: dict[str, float] = {}
        """Sandboxes another replica recorded deleted, by id: when a sweep here first listed them so."""
        self._sweeper: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unreconciled: dict[str, list[SandboxState]] = {}
        """Per template whose backend could not be reached: the states it keeps until it can."""
        self._reconciling = asyncio.Lock()
        self._confirming: dict[str, tuple[float, Entry, asyncio.Future[Entry]]] = {}
        """Sandbox id -> (when it started, for which entry, the read of its record in flight)."""
        self._last_read: dict[str, float] = {}
        """Template -> when a held sandbox's record was last read for a confirmation (`_read_record`)."""

    @property
    def entries(self) -> Mapping[str, Entry]:
        """The sandboxes this replica holds, by id (read-only: only the registry changes it)."""
        return self._entries

    def mounted_by(self, tenant: str, volume: str) -> list[str]:
        """The ids of the tenant's held sandboxes that mount ``volume``."""
        return sorted(
            e.state.id for e in self._entries.values() if e.state.tenant == tenant and volume in e.state.volumes
        )

    # ------------------------------------------------------------------ reconciling and registering

    async def _reconcile(self, backends: dict[str, ProviderBackend], states: list[SandboxState], now: float) -> None:
        """Adopt what ``backends`` have of ``states`` and reap the rest (`reconcile`). The states
        of a template whose provider cannot list stay recorded and wait in `_unreconciled`: each
        sweep tries again, and until then their sandboxes answer ``backend_unavailable``."""
        held = frozenset((entry.backend.name, entry.state.ref) for entry in self._entries.values()) | self._pooled()
        adopted, unreachable = await asyncio.to_thread(reconcile, backends, states, now, held=held)
        kept = set()
        for state, sandbox in adopted:
            backend = self._backend_of(state)
            entry = self._entries[state.id] = self._entry(state, sandbox, backend)
            if not backend.shared or state.kept_beside_record:  # a shared backend's is its own record, or
                kept.add(state.id)
                await asyncio.to_thread(self.store.save, state)
            self._schedule(state.id)
            self._settle(entry)
            for hook in self.on_register:  # what it was served before a restart (its egress)
                hook(entry)
        for template in backends:
            self._unreconciled.pop(template, None)
        for state in states:
            if state.template in unreachable:
                self._unreconciled.setdefault(state.template, []).append(state)
            elif state.id not in kept:
                await asyncio.to_thread(self.store.remove, state.id)
        for template in unreachable:
            self._unreconciled.setdefault(template, [])
            logger.error("template %s: its backend cannot be reached; retrying at every sweep", template)
        logger.info("reconciled: adopted %d sandboxes", len(adopted))

    def _settle(self, entry: Entry) -> None:
        """What an adopted sandbox's state says is still to do (a pause a crash interrupted)."""

    def _pooled(self) -> frozenset[tuple[str, str]]:
        """The sandboxes a warm pool holds now (backend kind, ref): neither adopted nor reaped."""
        return frozenset()

    async def _reconcile_unreachable(self) -> None:
        """Try again the templates whose backend could not be reached."""
        async with self._reconciling:  # a sweep on demand may overlap the periodic one
            if not self._unreconciled:
                return
            await self._reconcile_again()

    async def _reconcile_again(self) -> None:
        pending = dict(self._unreconciled)
        backends = {name: self.backends[name] for name in pending if name in self.backends}
        states = [state for waiting in pending.values() for state in waiting]
        await self._reconcile(backends, states, self.clock.now())

    def _unreachable(self, tenant: Tenant, sandbox_id: str) -> bool:
        """Whether it is the tenant's sandbox on a backend that cannot be reached now."""
        waiting = (state for states in self._unreconciled.values() for state in states)
        return any(state.id == sandbox_id and state.tenant == tenant.id for state in waiting)

    def _entry(self, state: SandboxState, sandbox: BaseSandbox, backend: ProviderBackend) -> Entry:
        """What the service holds of a sandbox: its file operations are bounded by the service's
        ``file_operation_timeout`` (when lower than the sandbox's own), its background processes
        live in it (`sandboxes.server.processes`)."""
        sandbox.operation_timeout = min(sandbox.operation_timeout, self.settings.file_operation_timeout)
        processes = ProcessTable(sandbox, self.settings.max_processes, self.settings.max_output_bytes)
        return Entry(state, sandbox, backend, processes, network_seen=state.network())

    async def _register(self, state: SandboxState, sandbox: BaseSandbox, backend: ProviderBackend) -> Entry:
        entry = self._entry(state, sandbox, backend)
        self._entries[state.id] = entry
        self._schedule(state.id)
        self._update_gauge()
        if not backend.shared:
            await asyncio.to_thread(self.store.save, state)
        for hook in self.on_register:
            hook(entry)
        return entry

    def holds(self, sandbox_id: str) -> bool:
        """Whether this replica holds the sandbox now."""
        return sandbox_id in self._entries

    # ------------------------------------------------------------------ other replicas' changes

    @property
    def _shared(self) -> bool:
        return any(backend.shared for backend in self.backends.values())

    def _trusted(self, entry: Entry) -> bool:
        """Whether what is held of it may be used without reading its record again (a hibernated
        sandbox has no record on the backend: this replica's is all there is)."""
        if not entry.backend.shared or entry.state.hibernated:
            return True
        return time.monotonic() - entry.confirmed < self.settings.confirm_interval

    async def _confirm(self, entry: Entry) -> Entry:
        """Read a held sandbox's record again: gone (deleted by another replica) is a 404 and
        forgotten here; a new expiry (renewed by another) is taken.

        One read for all the requests that find the same sandbox unconfirmed at once, as long as
        it started within ``confirm_interval`` (no request is answered on an older read than it
        would trust anyway): each read is a label-selected list of the engine, a worker thread's
        and the engine's time, and one answers them all."""
        now, sandbox_id = time.monotonic(), entry.state.id
        flight = self._confirming.get(sandbox_id)
        if flight is None or flight[1] is not entry or now - flight[0] >= self.settings.confirm_interval:
            read = asyncio.ensure_future(self._read_record(entry))
            flight = self._confirming[sandbox_id] = (now, entry, read)
            read.add_done_callback(lambda done: self._landed(sandbox_id, done))
        return await asyncio.shield(flight[2])  # a request that leaves does not cancel the others' read

    def _landed(self, sandbox_id: str, read: asyncio.Future[Entry]) -> None:
        if (flight := self._confirming.get(sandbox_id)) is not None and flight[2] is read:
            del self._confirming[sandbox_id]
        if not read.cancelled():
            read.exception()  # retrieved: every request that waited has it, or none is left to

    async def _read_record(self, entry: Entry) -> Entry:
        """Read ``entry``'s record again. The second read of a backend within ``confirm_interval``
        lists all its records and confirms every held sandbox found there, so requests spread
        over many held sandboxes read the backend about twice per interval, not once per sandbox."""
        checked, backend, sandbox_id = time.monotonic(), entry.backend, entry.state.id
        last = self._last_read.get(backend.template_name)
        self._last_read[backend.template_name] = checked
        if last is None or checked - last >= self.settings.confirm_interval:
            found = await self._read(backend.select, sandbox_id=sandbox_id)
        else:
            found = await self._read(backend.select)
            for state in found:
                held = self._entries.get(state.id)
                if held is not None and held.backend is backend and not census.gone(held.state, state):
                    self._refresh(held, state, checked)
        recorded = next((state for state in found if state.id == sandbox_id and state.ref == entry.state.ref), None)
        if recorded is None or recorded.deleted_on_record:  # gone, another's of its id, or deleted
            await self._forget(entry)
            raise not_found(sandbox_id)
        self._refresh(entry, recorded, checked)
        await self._reread_network(entry)
        return entry

    async def held_confirmed(self, sandbox_id: str) -> Entry | None:
        """The sandbox as this replica holds it, its record (and network) read again first if
        ``confirm_interval`` has passed, as `find` does; ``None`` if it is not held or gone.
        A failed read is a `ServiceError` (``backend_unavailable``)."""
        entry = self._entries.get(sandbox_id)
        if entry is None or self._trusted(entry):
            return entry
        try:
            return await self._confirm(entry)
        except ServiceError as exc:
            if exc.code == "not_found":
                return None
            raise

    async def _reread_network(self, entry: Entry) -> None:
        """Take what another replica set of the sandbox's network since (`sandboxes.server.
        networks.Networks`); here, nothing."""

    def _refresh(self, entry: Entry, recorded: SandboxState, checked: float) -> None:
        if checked < entry.confirmed:  # read before what is held was (a renewal here since)
            return
        entry.confirmed = checked
        if recorded.expires_at != entry.state.expires_at:
            entry.state.expires_at = recorded.expires_at
            self._schedule(entry.state.id)

    async def _adopt(self, state: SandboxState) -> Entry:
        """A handle on a sandbox another replica made (or this one before a restart)."""
        backend = self._backend_of(state)
        try:
            sandbox = await asyncio.to_thread(backend.attach, state)
        except LookupError:
            raise not_found(state.id) from None
        except Exception as exc:
            logger.warning("attaching to sandbox %s failed: %s", state.id, exc, exc_info=True)
            raise ServiceError("backend_unavailable", f"sandbox {state.id} cannot be reached now") from exc
        if state.id in self._entries:  # adopted meanwhile by a concurrent request
            with contextlib.suppress(Exception):
                await asyncio.to_thread(_close, sandbox)
            return self._entries[state.id]
        if not state.workdir:
            state.workdir = workdir_of(sandbox)
        kept = await asyncio.to_thread(self.store.load, state.id)  # its network, if a replica set it
        if kept is not None and kept.network_set and kept.ref == state.ref and not state.network_on_record:
            state.take_network(kept)  # (a network on its record is every replica's: newer)
        logger.info("adopted sandbox", extra={"sandbox": state.id, "tenant": state.tenant})
        return await self._register(state, sandbox, backend)

    async def _forget(self, entry: Entry) -> None:
        """Let go of a sandbox that is gone (removed elsewhere): its handle, not the sandbox. One
        this replica is deleting is its deleter's to destroy (its record says deleted already)."""
        if entry.state.id in self._removing or not self._unlist(entry):
            return
        entry.processes.close()
        if entry.backend.shared and entry.state.kept_beside_record:  # the file kept beside its record
            await asyncio.to_thread(self.store.remove, entry.state.id)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(_close, entry.sandbox)

    # ------------------------------------------------------------------ what quotas count

    async def _counted(self, tenant: Tenant) -> _States:
        """The tenant's sandboxes on the shared backends, as recorded there (every replica's),
        but those deleted here: a deletion answered frees its share at once, though its destroy
        is still under way or retried by the sweep (the service's to finish, not the tenant's)."""
        if not self._shared:
            return []
        states = await self._tenant_reads.find(tenant.id)  # a read started after this call: as fresh as its own
        return [state for state in states if not self._deleted_here(state.id) and not state.deleted_on_record]

    async def recorded(self) -> _States:
        """Every tenant's live sandboxes on the shared backends, as recorded there now (every
        replica's), but those deleted here; a failed read is a 503 (`_read`)."""
        if not self._shared:
            return []
        states = await self._read(census.all_states, self.backends)
        now = self.clock.now()
        return [state for state in states if state.expires_at > now and not self._deleted_here(state.id)]

    def _deleted_here(self, sandbox_id: str) -> bool:
        """Deleted by this replica, its destroy under way or to be retried: its records, still
        there, must not bring it back."""
        return sandbox_id in self._doomed or sandbox_id in self._removing

    def _held(self, tenant: Tenant) -> _States:
        """The tenant's sandboxes on the other backends: held here, or on a backend that cannot be
        reached now (still the tenant's)."""
        held = (entry.state for entry in self._entries.values() if not entry.backend.shared)
        unreachable = (state for waiting in self._unreconciled.values() for state in waiting)
        return [state for state in (*held, *unreachable) if state.tenant == tenant.id]

    async def _read(self, read: Callable[..., _T], *args: Any, **labels: str) -> _T:
        """A read of the shared backends' records, in a worker thread; one that fails (the
        engine or the API server not answering) is a 503, as any backend failure is."""
        try:
            return await asyncio.to_thread(read, *args, **labels)
        except Exception as exc:
            logger.warning("reading the sandboxes' records failed: %s", exc, exc_info=True)
            raise ServiceError(
                "backend_unavailable", "the backend's records cannot be read now; the service log has the request id"
            ) from exc

    # ------------------------------------------------------------------ expiry and removal

    def _schedule(self, sandbox_id: str) -> None:
        entry = self._entries.get(sandbox_id)
        old = self._timers.pop(sandbox_id, None)
        if old is not None:
            old.cancel()
        if entry is None:
            return
        delay = max(0.0, entry.state.expires_at - self.clock.now())
        loop = asyncio.get_running_loop()
        self._timers[sandbox_id] = loop.call_later(delay, self._spawn, lambda: self._expire(sandbox_id))

    def _spawn(self, make: Callable[[], Coroutine[Any, Any, None]]) -> None:
        task = asyncio.ensure_future(make())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _expire(self, sandbox_id: str) -> None:
        """What the sandbox's expiry does, if it expired; one at a time (`Entry.expiring`)."""
        entry = self._entries.get(sandbox_id)
        if entry is None:
            return
        async with entry.expiring:
            await self._expire_now(sandbox_id)

    async def _expire_now(self, sandbox_id: str) -> None:
        entry = self._entries.get(sandbox_id)
        # One reading of the clock for both checks: a timer fires a millisecond or so early
        # (uvloop rounds its delay to milliseconds), and with a reading for each the expiry
        # could pass between them, reaping a shared sandbox whose record (renewed by another
        # replica) was never read.
        now = self.clock.now()
        if entry is not None and entry.state.expires_at <= now and entry.backend.shared and not entry.state.hibernated:
            try:
                await self._confirm(entry)  # another replica may have renewed it
            except ServiceError as exc:
                if exc.code != "not_found":  # unknown whether it was renewed: not reaped now
                    raise
            entry = self._entries.get(sandbox_id)
        if entry is None or entry.state.paused == "stop":  # paused with its clock stopped
            return
        if entry.state.expires_at > now:  # renewed, or a timer a little early
            self._schedule(sandbox_id)
            return
        await self._expired(entry)

    async def _expired(self, entry: Entry) -> None:
        """What the end of a sandbox's TTL does: it is removed."""
        logger.info("sandbox expired", extra={"sandbox": entry.state.id, "tenant": entry.state.tenant})
        self.metrics.expired.inc()
        await self._remove(entry)

    async def sweep(self) -> None:
        """Remove what expired; retry the destroys that failed. On shared backends, compare
        what is held here with the records, and reap what expired whoever holds it. An expiry
        in progress (a timer's, another sweep's) is waited for: when a sweep returns, what had
        expired by its start is done with."""
        await self._reconcile_unreachable()
        if self._shared:
            try:
                await self._sweep_shared()
            except Exception:  # the other backends' sandboxes still expire
                logger.exception("sweeping the shared backends failed; the next sweep retries")
        now = self.clock.now()
        underway = [e for e in self._entries.values() if e.expiring.locked()]
        for entry in [e for e in self._entries.values() if e.state.expires_at <= now and not e.expiring.locked()]:
            try:
                await self._expire(entry.state.id)
            except Exception:
                logger.exception("expiring sandbox %s failed; the next sweep retries", entry.state.id)
        for sandbox_id, entry in list(self._doomed.items()):
            if await self._destroy(entry):
                self._doomed.pop(sandbox_id, None)
        for entry in underway:  # last: a slow one (a hibernate) delays no other sandbox's expiry
            async with entry.expiring:
                pass

    def sweep_soon(self) -> concurrent.futures.Future[None]:
        """Run `sweep` on the registry's loop now, from any other thread; done when the sweep
        is (what it expired is then destroyed, not merely scheduled)."""
        if self._loop is None:
            raise RuntimeError("the registry has not started")
        return asyncio.run_coroutine_threadsafe(self.sweep(), self._loop)

    async def _sweep_shared(self) -> None:
        listed_at = time.monotonic()
        states = await asyncio.to_thread(census.all_states, self.backends)
        now, recorded = self.clock.now(), {state.id: state for state in states}
        for entry in [e for e in self._entries.values() if e.backend.shared]:
            state = recorded.get(entry.state.id)
            if census.gone(entry.state, state):
                if entry.confirmed < listed_at and not entry.state.hibernated:  # nor one hibernated
                    await self._forget(entry)
            elif state is not None:
                self._refresh(entry, state, listed_at)
        seen: dict[str, float] = {}
        for state in states:
            if state.id in self._entries or state.expires_at > now or self._deleted_here(state.id):
                continue
            if state.deleted_on_record:  # the deleter's to destroy first (`DELETED_GRACE`)
                seen[state.id] = self._deleted_elsewhere.get(state.id, now)
                if now - seen[state.id] < DELETED_GRACE:
                    continue
            await self._reap(state, now)
        self._deleted_elsewhere = seen

    async def _reap(self, state: SandboxState, now: float) -> None:
        """Destroy a sandbox no replica may hold any more: expired, or deleted by a replica whose
        destroy failed (`SandboxState.deleted_on_record`: that replica may be gone, or never retry)."""
        backend = self._backend_of(state)
        try:
            if not await asyncio.to_thread(census.expired_now, backend, state, now):
                return  # renewed (or destroyed) since the list
            if state.deleted_on_record:
                logger.info("destroying deleted sandbox", extra={"sandbox": state.id, "tenant": state.tenant})
            else:
                logger.info("sandbox expired", extra={"sandbox": state.id, "tenant": state.tenant})
                self.metrics.expired.inc()
            await asyncio.to_thread(backend.destroy, state, None)
        except Exception:
            logger.exception("destroying sandbox %s failed; the next sweep retries", state.id)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.sweep_interval)
            try:
                await self.sweep()
            except Exception:
                logger.exception("sweep failed; trying again at the next interval")

    def _unlist(self, entry: Entry) -> bool:
        """Whether ``entry`` was still the one held under its id; if so, no longer held (its
        timer cancelled, the gauge updated). Not awaited: no other task takes it off between."""
        if self._entries.get(entry.state.id) is not entry:
            return False
        del self._entries[entry.state.id]
        timer = self._timers.pop(entry.state.id, None)
        if timer is not None:
            timer.cancel()
        self._update_gauge()
        return True

    async def _remove(self, entry: Entry) -> None:
        """Idempotent: the first caller removes, concurrent ones find it gone."""
        if not self._unlist(entry):
            return
        if not entry.backend.shared or entry.state.kept_beside_record:  # a record's alone: `record_deletion`
            entry.state.deleting = True
            await asyncio.to_thread(self.store.save, entry.state)
        entry.processes.close()  # its background processes die with the sandbox
        self._removing.add(entry.state.id)
        try:
            if not await self._destroy(entry):
                self._doomed[entry.state.id] = entry
        finally:
            self._removing.discard(entry.state.id)

    async def record_deletion(self, entry: Entry) -> None:
        """Record a shared backend's sandbox deleted on its record (`DELETED_AT`), where
        every replica and every start of this one read it, before its destroy, which may fail and
        then be retried from this replica's memory alone: a deletion answered is never undone. Gone
        already (or being removed) is fine; one the backend cannot record is a 503, nothing done."""
        if not entry.backend.shared or entry.state.hibernated:  # a hibernated one has no record there
            return
        try:
            await asyncio.to_thread(entry.backend.renew, entry.state, DELETED_AT)
        except LookupError:
            return
        except Exception as exc:
            logger.warning("recording sandbox %s deleted failed: %s", entry.state.id, exc, exc_info=True)
            raise ServiceError(
                "backend_unavailable",
                f"sandbox {entry.state.id} cannot be deleted now; the service log has the request id",
            ) from exc

    async def _destroy(self, entry: Entry) -> bool:
        try:
            await asyncio.to_thread(entry.backend.destroy, entry.state, entry.sandbox)
        except Exception:
            logger.exception("destroying sandbox %s failed; the sweep will retry", entry.state.id)
            return False
        if not entry.backend.shared or entry.state.kept_beside_record:
            await asyncio.to_thread(self.store.remove, entry.state.id)
        return True

    def _backend_of(self, state: SandboxState) -> ProviderBackend:
        """The backend of the sandbox's template; one of the same kind if the template is gone."""
        backend = self.backends.get(state.template)
        if backend is not None and backend.name == state.backend:
            return backend
        return next(b for b in self.backends.values() if b.name == state.backend)

    def _update_gauge(self) -> None:
        for name in {backend.name for backend in self.backends.values()}:
            self.metrics.sandboxes_live.labels(name).set(
                sum(1 for entry in self._entries.values() if entry.backend.name == name)
            )


def _close(sandbox: BaseSandbox) -> None:
    if isinstance(sandbox, Lifecycle):
        sandbox.close()


def _idempotency_key(state: SandboxState) -> str:
    return state.idempotency_key


def _tenant_of(state: SandboxState) -> str:
    return state.tenant
