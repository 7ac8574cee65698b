"""Snapshots and forks of the sandboxes a replica holds, on top of pausing: a snapshot taken
into the store (`sandboxes.server.snapshots`, `sandboxes.server.snapshotting`), a new sandbox
restored from one (verified, or destroyed and refused), and a fork: one snapshot of a running
sandbox, then as many sandboxes restored from it at once.

A fork with an ``Idempotency-Key`` is a snapshot and creates that its key names: the snapshot's
id and each new sandbox's key are derived from it, so a retry finds the snapshot and the
sandboxes the first attempt made (each create is idempotent as any keyed create is) and makes
only what is missing; a killed service leaves each new sandbox labelled with its creation, to
adopt or reap like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import math
import socket
import time
from pathlib import Path
from typing import Any

from sandboxes import api
from sandboxes.server.archive import checked_path
from sandboxes.server.auth import Tenant
from sandboxes.server.entry import Entry
from sandboxes.server.errors import ServiceError
from sandboxes.server.inherited import kept_network
from sandboxes.server.pausing import PAUSED_AT_TIMEOUT, Pausing, TtlChoice
from sandboxes.server.released import Released
from sandboxes.server.snapshots import Snapshot, SnapshotStore
from sandboxes.server.snapshotting import restore, take
from sandboxes.server.store import SandboxState

__all__ = ["Keeping", "memory_unavailable", "snapshot_info"]

logger = logging.getLogger("sandboxes.server.registry")


def memory_unavailable(backend: str, sandbox_id: str) -> str:
    """Why a hibernate that keeps processes' memory is refused on every backend."""
    return (
        f"the {backend} backend cannot keep the processes of sandbox {sandbox_id} across a hibernate: "
        "that needs a CRIU checkpoint (docker checkpoint), which this service does not take, as Debian 12's "
        "CRIU 3.17 fails on Linux 6.13 and later (it does not know the kernel's vvar_vclock mapping); "
        "hibernate without memory keeps its files only, and a freeze keeps its processes and memory"
    )


class Keeping(Pausing):
    """`Pausing` with snapshots, restores and forks."""

    async def create(self, tenant: Tenant, request: api.CreateSandbox, key: str | None = None) -> tuple[Entry, bool]:
        """A new sandbox (`sandboxes.server.registry.Registry.create`)."""
        raise NotImplementedError

    @functools.cached_property
    def snapshots(self) -> SnapshotStore:
        directory = self.settings.snapshot_dir or self.settings.data_dir / "snapshots"
        return SnapshotStore(directory, writer=f"{socket.gethostname()}:{self.settings.data_dir.resolve()}")

    async def snapshot(
        self, entry: Entry, body: api.CreateSnapshot, snapshot_id: str | None = None, name: str = ""
    ) -> Snapshot:
        """Keep the sandbox's workspace and ``body.paths`` in the store, whole or not at all,
        with its network as it is now (`sandboxes.server.inherited`)."""
        state = entry.state
        paths = [(state.workdir, True)] if body.workspace else []
        paths += [(checked_path(path), False) for path in body.paths]
        quota = self.settings.policy_for(state.tenant).max_snapshot_bytes
        head: dict[str, Any] = {"sandbox_id": state.id, "template": state.template, "backend": entry.backend.name}
        head |= {"name": name, "network": kept_network(state)}  # its network now: a restore's (and a fork's)
        writing = await asyncio.to_thread(self.snapshots.begin, state.tenant, quota, head, snapshot_id)
        try:
            await asyncio.to_thread(take, entry.backend, entry.sandbox, writing, paths, self.settings)
        except BaseException as exc:
            await asyncio.to_thread(self.snapshots.abandon, writing)
            if isinstance(exc, ServiceError) and exc.code == "file_not_found":
                raise _named_path_missing(exc) from exc
            if isinstance(exc, Exception) and not isinstance(exc, ServiceError):
                logger.warning("snapshot of %s failed: %s", state.id, exc, exc_info=True)
                raise ServiceError("backend_unavailable", f"the snapshot of sandbox {state.id} failed") from exc
            raise
        snapshot = await asyncio.to_thread(self.snapshots.commit, writing)
        logger.info("snapshot taken", extra={"sandbox": state.id, "tenant": state.tenant, "snapshot": snapshot.id})
        return snapshot

    @functools.cached_property
    def restoring(self) -> Path:
        """One empty file per sandbox being restored here, named by its id, removed once it is
        verified or destroyed: what a killed service left there, its next start destroys
        (`reap_unverified`), so no sandbox restored halfway is ever adopted and handed out."""
        directory = self.settings.data_dir / "restoring"
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    async def reap_unverified(self) -> None:
        """Destroy the sandboxes whose restore a killed service left unfinished."""
        for mark in await asyncio.to_thread(lambda: list(self.restoring.iterdir())):
            entry = self._entries.get(mark.name)
            if entry is not None:
                logger.warning("destroying sandbox %s: its restore from a snapshot never finished", mark.name)
                await self._remove(entry)
            await asyncio.to_thread(mark.unlink, True)

    async def restored(self, entry: Entry, snapshot_id: str) -> Entry:
        """``entry``, a sandbox just made, with the snapshot's files, verified; on any failure
        it is destroyed, and the failure raised."""
        mark = self.restoring / entry.state.id  # made before the sandbox was (`Registry._create`)
        try:
            snapshot = await asyncio.to_thread(self.snapshots.get, entry.state.tenant, snapshot_id)
            args = (entry.backend, entry.sandbox, snapshot, entry.state.workdir, self.settings)
            await asyncio.to_thread(restore, *args)
        except BaseException as exc:
            await self._remove(entry)
            if isinstance(exc, Exception) and not isinstance(exc, ServiceError):
                logger.warning("restoring snapshot %s failed: %s", snapshot_id, exc, exc_info=True)
                raise ServiceError("backend_unavailable", f"restoring snapshot {snapshot_id} failed") from exc
            raise
        finally:
            await asyncio.to_thread(mark.unlink, True)
        return entry

    async def hibernate(self, entry: Entry, ttl: TtlChoice, memory: bool = False) -> Entry:
        """Keep the sandbox's workspace in a snapshot, then release its container or jail; its
        id, labels and tokens stay, and `resume` makes it again from the snapshot. Its processes
        end: one asked to keep their ``memory`` too is refused, ``unavailable``, and left running."""
        if memory:
            raise ServiceError("unavailable", memory_unavailable(entry.backend.name, entry.state.id))
        async with entry.pausing:
            state = entry.state
            if state.paused:
                raise ServiceError("paused", f"sandbox {state.id} is already paused")
            snapshot = await self.snapshot(entry, api.CreateSnapshot())
            state.hibernated, state.paused = snapshot.id, ttl
            if ttl == "stop":
                state.paused_remaining = max(0.0, state.expires_at - self.clock.now())
                timer = self._timers.pop(state.id, None)
                if timer is not None:
                    timer.cancel()
            await self._saved(entry)
            if entry.backend.shared:  # its record goes with its container: kept here instead
                await asyncio.to_thread(self.store.save, state)
            entry.processes.close()
            try:
                await asyncio.to_thread(entry.backend.destroy, state, entry.sandbox)
            except Exception as exc:  # it still runs, with its files: not hibernated after all
                state.hibernated, state.paused, state.paused_remaining = "", "", 0.0
                await self._saved(entry)
                await self._forget_hibernated(entry)
                self._schedule(state.id)
                await asyncio.to_thread(self.snapshots.delete, state.tenant, snapshot.id)
                raise ServiceError("backend_unavailable", f"sandbox {state.id} could not be released") from exc
            logger.info("sandbox hibernated", extra={"sandbox": state.id, "tenant": state.tenant})
            return entry

    async def _expired(self, entry: Entry) -> None:
        """A running sandbox created with an ``on_timeout`` pause is paused at the end of its TTL
        instead of removed (a freeze the backend cannot do is a hibernate); one paused already,
        or whose pause fails, is removed."""
        state = entry.state
        if state.paused or state.on_timeout not in ("freeze", "hibernate"):
            return await super()._expired(entry)
        try:
            await self._pause_at_timeout(entry)
        except Exception:
            if state.paused:  # paused meanwhile (a pause asked for, another sweep's)
                return
            logger.exception("pausing sandbox %s at the end of its TTL failed: it is removed", state.id)
            await super()._expired(entry)

    async def _pause_at_timeout(self, entry: Entry) -> None:
        """Paused (`PAUSED_AT_TIMEOUT`): kept ``max_ttl`` from now, then removed; a resume gives
        it its template's TTL again. Its intent is written first (`SandboxState.pause_intent`, with the
        new expiry): a restart before the pause is recorded makes it again (`_pause_interrupted`)."""
        state = entry.state
        given_back = min(entry.backend.template.ttl, self.settings.max_ttl)
        expires_at = self.clock.now() + self.settings.max_ttl
        expires_at = float(math.ceil(expires_at)) if entry.backend.shared else expires_at
        state.expires_at, state.paused_remaining, state.pause_intent = expires_at, given_back, PAUSED_AT_TIMEOUT
        try:
            await self._saved(entry)
            if entry.backend.shared:  # recorded before the pause: no replica's sweep removes it meanwhile
                await asyncio.to_thread(entry.backend.renew, state, expires_at)
                # as recorded now: a read of the records from before the renewal, landed meanwhile, took the old one
                state.expires_at, entry.confirmed = expires_at, time.monotonic()
            await self._pause_as_asked(entry)
        except BaseException:
            state.pause_intent = ""
            raise
        state.paused, state.paused_remaining, state.pause_intent = PAUSED_AT_TIMEOUT, given_back, ""
        logger.info("sandbox paused at the end of its TTL", extra={"sandbox": state.id, "tenant": state.tenant})
        if state.hibernated:  # its record is kept here, whatever the backend
            await asyncio.to_thread(self.store.save, state)
        else:  # a shared backend's too, beside its record (which says frozen alone)
            await self._saved(entry)
        self._schedule(state.id)

    async def _pause_as_asked(self, entry: Entry) -> None:
        """Frozen as `PAUSED_AT_TIMEOUT` if its ``on_timeout`` and backend allow, else hibernated
        (its intent kept: a restart reads the hibernation back as paused at its timeout)."""
        if entry.state.on_timeout == "freeze":
            try:
                async with entry.pausing:
                    if entry.state.paused:
                        raise ServiceError("paused", f"sandbox {entry.state.id} is already paused")
                    return await self._freeze(entry, PAUSED_AT_TIMEOUT)
            except ServiceError as exc:
                if exc.code != "unavailable":
                    raise
        entry.state.pause_intent = PAUSED_AT_TIMEOUT  # withdrawn by the freeze that could not be: written again
        await self._saved(entry)
        await self.hibernate(entry, "keep")

    async def _pause_interrupted(self, sandbox_id: str) -> None:
        """A pause at its timeout that a ``kill -9`` interrupted before its freeze, made again."""
        entry = self._entries.get(sandbox_id)
        if entry is None:
            return
        async with entry.expiring:
            if entry.state.pause_intent == PAUSED_AT_TIMEOUT and not entry.state.paused:
                await self._expired(entry)

    def _settle(self, entry: Entry) -> None:
        if entry.state.pause_intent == PAUSED_AT_TIMEOUT and not entry.state.paused:
            self._spawn(functools.partial(self._pause_interrupted, entry.state.id))

    async def resume(self, entry: Entry) -> Entry:
        """A frozen sandbox thawed; a hibernated one made again from its snapshot, verified."""
        if not entry.state.hibernated:
            return await super().resume(entry)
        async with entry.pausing:
            if entry.state.hibernated:
                await self._wake(entry)
            return entry

    async def _wake(self, entry: Entry) -> None:
        state, backend = entry.state, entry.backend
        now = self.clock.now()
        given_back = state.paused in ("stop", PAUSED_AT_TIMEOUT)
        expires_at = now + state.paused_remaining if given_back else state.expires_at
        expires_at = float(math.ceil(expires_at)) if backend.shared else expires_at
        await asyncio.to_thread((self.restoring / state.id).touch)
        try:
            made, sandbox = await asyncio.to_thread(
                backend.create, state.tenant, expires_at, dict(state.labels), dict(state.env),
                sandbox_id=state.id, auto_resume=state.auto_resume, egress_allow=state.egress_allow,
                on_timeout=state.on_timeout,
            )  # fmt: skip
        except Exception as exc:
            logger.warning("making hibernated sandbox %s again failed: %s", state.id, exc, exc_info=True)
            raise ServiceError("backend_unavailable", f"the {backend.name} backend could not make it again") from exc
        try:
            snapshot = await asyncio.to_thread(self.snapshots.get, state.tenant, state.hibernated)
            await asyncio.to_thread(restore, backend, sandbox, snapshot, made.workdir, self.settings)
        except BaseException:
            await asyncio.to_thread(backend.destroy, made, sandbox)
            raise
        finally:
            await asyncio.to_thread((self.restoring / state.id).unlink, True)
        fresh = self._entry(made, sandbox, backend)
        entry.sandbox, entry.processes, entry.confirmed = fresh.sandbox, fresh.processes, fresh.confirmed
        kept, state.ref, state.workdir, state.expires_at = state.hibernated, made.ref, made.workdir, expires_at
        state.paused, state.paused_remaining, state.hibernated = "", 0.0, ""
        await self._network_again(entry)
        await self._saved(entry)
        await self._forget_hibernated(entry)
        self._schedule(state.id)
        for hook in self.on_register:  # served again in the new one (its egress)
            hook(entry)
        await asyncio.to_thread(functools.partial(self.snapshots.delete, state.tenant, kept, wait=False))
        logger.info("sandbox resumed from hibernation", extra={"sandbox": state.id, "tenant": state.tenant})

    async def _remove(self, entry: Entry) -> None:
        """`Holdings._remove`, and a hibernated sandbox's snapshot with it."""
        kept = entry.state.hibernated
        await super()._remove(entry)
        if kept:
            await self._forget_hibernated(entry)
            with contextlib.suppress(ServiceError, OSError):
                await asyncio.to_thread(self.snapshots.delete, entry.state.tenant, kept)

    async def _network_again(self, entry: Entry) -> None:
        """A network set through the API recorded on the sandbox made again from hibernation, if
        its backend records it there; if it cannot be, its state file keeps it (this replica's)."""
        state = entry.state
        state.network_on_record = False  # its old record went with its old pod
        if not (state.network_set and entry.backend.records_network):
            return
        try:
            await self._record_on_sandbox(entry)
        except ServiceError as exc:
            logger.warning("sandbox %s resumed; its network kept here alone: %s", state.id, exc.message)

    async def _forget_hibernated(self, entry: Entry) -> None:
        """The record `hibernate` kept of a shared backend's sandbox, removed (running again, or
        gone), or kept for its network while it runs if its record does not hold it
        (`SandboxState.network_set`, ``network_on_record``)."""
        network_beside = entry.state.network_set and not entry.state.network_on_record
        if entry.backend.shared and network_beside and self._entries.get(entry.state.id) is entry:
            await asyncio.to_thread(self.store.save, entry.state)
        elif entry.backend.shared:
            await asyncio.to_thread(self.store.remove, entry.state.id)

    async def hold_hibernated(self, states: list[SandboxState]) -> None:
        """The hibernated sandboxes the store recorded, held again, paused, at start-up. Whatever
        a ``kill -9`` in the middle of their hibernate left of their container, pod or jail is
        destroyed: a state says hibernated only once its snapshot was complete."""
        for state in states:
            backend = self._backend_of(state)
            try:
                await asyncio.to_thread(backend.destroy, state, None)
            except Exception:
                logger.warning("what is left of hibernated sandbox %s stays for now", state.id, exc_info=True)
            if state.pause_intent:  # hibernated (its snapshot complete) at its timeout, not recorded so yet
                state.settle_pause(frozen=True)
                await asyncio.to_thread(self.store.save, state)
            self._entries[state.id] = self._entry(state, Released(state), backend)
            self._schedule(state.id)
        if states:
            logger.info("held %d hibernated sandboxes again", len(states))

    async def fork(self, tenant: Tenant, entry: Entry, count: int, key: str | None) -> tuple[Snapshot, list[Entry]]:
        """``count`` new sandboxes with ``entry``'s files (its workspace) and its network as it is
        now (its snapshot's, `sandboxes.server.inherited`), made at once."""
        state = entry.state
        snapshot_id = None if key is None else _derived(tenant.id, key, "snapshot")
        snapshot = None
        if snapshot_id is not None:  # a retry's, taken already
            with contextlib.suppress(ServiceError):
                snapshot = await asyncio.to_thread(self.snapshots.get, tenant.id, snapshot_id)
        if snapshot is None:
            snapshot = await self.snapshot(entry, api.CreateSnapshot(), snapshot_id)
        labels = {**state.labels, "forked-from": state.id}
        request = api.CreateSandbox(template=state.template, env=state.env, labels=labels, snapshot=snapshot.id)
        creates = [
            self.create(tenant, request, None if key is None else _derived(tenant.id, key, str(index)))
            for index in range(count)
        ]
        made: list[Any] = await asyncio.gather(*creates, return_exceptions=True)
        failed = [result for result in made if isinstance(result, BaseException)]
        if failed:
            for result in made:
                if not isinstance(result, BaseException):
                    await self._remove(result[0])
            raise failed[0]
        return snapshot, [result[0] for result in made]


def _derived(tenant: str, key: str, what: str) -> str:
    """An id (or key) named by a fork's key: the same on every retry of that fork."""
    return hashlib.sha256(f"{tenant}\0{key}\0{what}".encode()).hexdigest()[:32]


def snapshot_info(snapshot: Snapshot) -> api.SnapshotInfo:
    return api.SnapshotInfo(
        id=snapshot.id,
        sandbox_id=snapshot.sandbox_id,
        template=snapshot.template,
        backend=snapshot.backend,
        created_at=snapshot.created_at,
        bytes=snapshot.bytes,
        files=snapshot.files,
        paths=[part.path for part in snapshot.parts],
    )


def _named_path_missing(exc: ServiceError) -> ServiceError:
    """A path the request names that the sandbox lacks: the request's fault (422), so a 404 on
    a snapshot's route still means one thing, no such sandbox."""
    return ServiceError("file_not_found", exc.message, status=422)
