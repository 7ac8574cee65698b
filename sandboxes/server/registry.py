"""The live sandboxes, per tenant: creation under quota, lookup, TTL, deletion, and the
reconciliation with the backends that makes a ``kill -9`` of the service lose nothing.

TTLs are enforced twice: a timer per sandbox fires at its expiry, and a periodic sweep catches
whatever a timer missed (a clock jump, a failed destroy to retry). All bookkeeping happens on
the event loop thread, so a quota check and the reservation that follows it cannot interleave
with another request's; only backend calls run in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from sandboxes.api import CreateSandbox, SandboxInfo
from sandboxes.base import BaseSandbox
from sandboxes.lifecycle import Lifecycle
from sandboxes.server.auth import Tenant
from sandboxes.server.backends import ProviderBackend, reconcile
from sandboxes.server.errors import ServiceError, not_found
from sandboxes.server.metrics import Metrics
from sandboxes.server.processes import ProcessTable
from sandboxes.server.settings import ServiceSettings, Template
from sandboxes.server.store import SandboxState, StateStore

logger = logging.getLogger(__name__)


@dataclass
class Entry:
    state: SandboxState
    sandbox: BaseSandbox
    backend: ProviderBackend
    processes: ProcessTable

    def info(self) -> SandboxInfo:
        return SandboxInfo(
            id=self.state.id,
            template=self.state.template,
            backend=self.backend.template.backend,
            created_at=self.state.created_at,
            expires_at=self.state.expires_at,
            labels=self.state.labels,
            workdir=self.state.workdir,
        )

    def kill_marked(self, token: str) -> None:
        self.backend.kill_marked(self.sandbox, token)


@dataclass
class _Reservation:
    tenant: str
    cpus: float
    memory: int
    key: str = field(default_factory=lambda: uuid.uuid4().hex)


class Registry:
    def __init__(self, settings: ServiceSettings, backends: dict[str, ProviderBackend], metrics: Metrics) -> None:
        self.settings = settings
        self.backends = backends
        self.metrics = metrics
        self.store = StateStore(settings.data_dir / "state")
        self.ready = False
        self._entries: dict[str, Entry] = {}
        self._reserved: dict[str, _Reservation] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._doomed: dict[str, Entry] = {}
        """Sandboxes whose destroy failed: the sweep tries again."""
        self._sweeper: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Adopt what the backends really have, reap the rest, then start enforcing TTLs."""
        now = time.time()
        states = await asyncio.to_thread(self.store.load_all)
        kinds = {backend.name for backend in self.backends.values()}
        mine = [state for state in states if state.backend in kinds]
        adopted = await asyncio.to_thread(reconcile, self.backends, mine, now)
        kept = set()
        for state, sandbox in adopted:
            backend = self._backend_of(state)
            self._entries[state.id] = Entry(state, sandbox, backend, self._process_table(sandbox))
            kept.add(state.id)
            await asyncio.to_thread(self.store.save, state)
            self._schedule(state.id)
        for state in mine:
            if state.id not in kept:
                await asyncio.to_thread(self.store.remove, state.id)
        logger.info("reconciled: adopted %d sandboxes", len(adopted))
        for state in states:
            if state.backend not in kinds:
                logger.warning("sandbox %s is on backend %s, which no template uses now", state.id, state.backend)
        self._update_gauge()
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
        for entry in self._entries.values():
            entry.processes.close()  # its background processes keep running in the sandbox
            if isinstance(entry.sandbox, Lifecycle):
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(entry.sandbox.close)
        for backend in self.backends.values():
            backend.close()

    # ------------------------------------------------------------------ requests

    async def create(self, tenant: Tenant, request: CreateSandbox) -> Entry:
        template = self.settings.templates.get(request.template)
        if template is None:
            known = ", ".join(sorted(self.settings.templates))
            raise ServiceError("invalid_request", f"unknown template {request.template!r} (known: {known})")
        _check_env(request.env)
        _check_labels(request.labels)
        backend = self.backends[request.template]
        ttl = min(request.ttl or template.ttl, self.settings.max_ttl)
        reservation = self._reserve(tenant, template)
        started = time.perf_counter()
        work = asyncio.ensure_future(
            asyncio.to_thread(backend.create, tenant.id, time.time() + ttl, dict(request.labels), dict(request.env))
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
        except Exception as exc:
            logger.exception("creating a %s sandbox failed", backend.name)
            raise ServiceError(
                "backend_unavailable", f"the {backend.name} backend failed; the service log has the request id"
            ) from exc
        finally:
            self._reserved.pop(reservation.key, None)
        entry = await self._register(state, sandbox, backend)
        self.metrics.create_seconds.labels(backend.name).observe(time.perf_counter() - started)
        logger.info("created sandbox", extra={"sandbox": state.id, "tenant": tenant.id, "template": request.template})
        return entry

    def _process_table(self, sandbox: BaseSandbox) -> ProcessTable:
        """Its background processes live in the sandbox (`sandboxes.server.processes`)."""
        return ProcessTable(sandbox, self.settings.max_processes, self.settings.max_output_bytes)

    async def _register(self, state: SandboxState, sandbox: BaseSandbox, backend: ProviderBackend) -> Entry:
        entry = Entry(state, sandbox, backend, self._process_table(sandbox))
        self._entries[state.id] = entry
        self._schedule(state.id)
        self._update_gauge()
        await asyncio.to_thread(self.store.save, state)
        return entry

    def _adopt_late(self, done: asyncio.Future[tuple[SandboxState, BaseSandbox]], backend: ProviderBackend) -> None:
        if not done.cancelled() and done.exception() is None:
            state, sandbox = done.result()
            self._spawn(lambda: self._register_quietly(state, sandbox, backend))

    async def _register_quietly(self, state: SandboxState, sandbox: BaseSandbox, backend: ProviderBackend) -> None:
        try:
            await self._register(state, sandbox, backend)
        except Exception:
            logger.exception("could not record sandbox %s; the next start-up will reconcile it", state.id)

    def get(self, tenant: Tenant, sandbox_id: str) -> Entry:
        entry = self._entries.get(sandbox_id)
        if entry is None or entry.state.tenant != tenant.id:
            raise not_found(sandbox_id)
        return entry

    def list(self, tenant: Tenant) -> list[Entry]:
        mine = [entry for entry in self._entries.values() if entry.state.tenant == tenant.id]
        return sorted(mine, key=lambda entry: (entry.state.created_at, entry.state.id))

    async def renew(self, tenant: Tenant, sandbox_id: str, ttl: float) -> Entry:
        entry = self.get(tenant, sandbox_id)
        entry.state.expires_at = time.time() + min(ttl, self.settings.max_ttl)
        await asyncio.to_thread(self.store.save, entry.state)
        self._schedule(sandbox_id)
        return entry

    async def delete(self, tenant: Tenant, sandbox_id: str) -> None:
        await self._remove(self.get(tenant, sandbox_id))

    # ------------------------------------------------------------------ quotas

    def _reserve(self, tenant: Tenant, template: Template) -> _Reservation:
        policy = tenant.policy
        entries = [entry.state for entry in self._entries.values() if entry.state.tenant == tenant.id]
        pending = [r for r in self._reserved.values() if r.tenant == tenant.id]
        count = len(entries) + len(pending)
        cpus = sum(s.cpus for s in entries) + sum(r.cpus for r in pending)
        memory = sum(s.memory for s in entries) + sum(r.memory for r in pending)
        if count + 1 > policy.max_sandboxes:
            refused = f"{count} live sandboxes, the maximum is {policy.max_sandboxes}"
        elif cpus + template.cpus > policy.max_cpus + 1e-9:
            refused = f"{cpus:g} cpus in use, {template.cpus:g} more would exceed {policy.max_cpus:g}"
        elif memory + template.memory_bytes > policy.max_memory_bytes:
            refused = f"{memory} bytes of memory in use, {template.memory} more would exceed {policy.max_memory}"
        else:
            reservation = _Reservation(tenant.id, template.cpus, template.memory_bytes)
            self._reserved[reservation.key] = reservation
            return reservation
        raise ServiceError("quota_exceeded", f"quota of tenant {tenant.id!r}: {refused}")

    # ------------------------------------------------------------------ expiry and removal

    def _schedule(self, sandbox_id: str) -> None:
        entry = self._entries.get(sandbox_id)
        old = self._timers.pop(sandbox_id, None)
        if old is not None:
            old.cancel()
        if entry is None:
            return
        delay = max(0.0, entry.state.expires_at - time.time())
        loop = asyncio.get_running_loop()
        self._timers[sandbox_id] = loop.call_later(delay, self._spawn, lambda: self._expire(sandbox_id))

    def _spawn(self, make: Callable[[], Coroutine[Any, Any, None]]) -> None:
        task = asyncio.ensure_future(make())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _expire(self, sandbox_id: str) -> None:
        entry = self._entries.get(sandbox_id)
        if entry is not None and entry.state.expires_at <= time.time():
            logger.info("sandbox expired", extra={"sandbox": sandbox_id, "tenant": entry.state.tenant})
            self.metrics.expired.inc()
            await self._remove(entry)

    async def sweep(self) -> None:
        """Remove what expired; retry the destroys that failed."""
        now = time.time()
        for entry in [e for e in self._entries.values() if e.state.expires_at <= now]:
            await self._expire(entry.state.id)
        for sandbox_id, entry in list(self._doomed.items()):
            if await self._destroy(entry):
                self._doomed.pop(sandbox_id, None)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.sweep_interval)
            try:
                await self.sweep()
            except Exception:
                logger.exception("sweep failed; trying again at the next interval")

    async def _remove(self, entry: Entry) -> None:
        """Idempotent: the first caller removes, concurrent ones find it gone."""
        if self._entries.get(entry.state.id) is not entry:
            return
        del self._entries[entry.state.id]
        timer = self._timers.pop(entry.state.id, None)
        if timer is not None:
            timer.cancel()
        self._update_gauge()
        entry.state.deleting = True
        await asyncio.to_thread(self.store.save, entry.state)
        entry.processes.close()  # its background processes die with the sandbox
        if not await self._destroy(entry):
            self._doomed[entry.state.id] = entry

    async def _destroy(self, entry: Entry) -> bool:
        try:
            await asyncio.to_thread(entry.backend.destroy, entry.state, entry.sandbox)
        except Exception:
            logger.exception("destroying sandbox %s failed; the sweep will retry", entry.state.id)
            return False
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


def _check_env(env: dict[str, str]) -> None:
    for name, value in env.items():
        if not name or "=" in name or "\x00" in name or "\x00" in value:
            raise ServiceError("invalid_request", f"invalid environment variable {name!r}")


_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def _check_labels(labels: dict[str, str]) -> None:
    """Labels travel as container labels: keep them to names every backend accepts."""
    if len(labels) > 64:
        raise ServiceError("invalid_request", "at most 64 labels")
    for key, value in labels.items():
        if not _LABEL_KEY.match(key) or len(value) > 1024 or "\x00" in value:
            raise ServiceError("invalid_request", f"invalid label {key!r} (name: [A-Za-z0-9._-], 63 max; value: 1 KiB)")
