"""A sandbox's network set through the API (its egress allow-list and headers, E2B's public
traffic and masked host, its public preview ports), kept where every replica reads it.

On a backend that records it on the sandbox (`ProviderBackend.records_network`: a pod's
annotation) it is written there before the API answers, on the version of the sandbox just
read, and every replica takes it with the sandbox's record: at adoption, and at each re-read
(each request once ``confirm_interval`` has passed, each egress connection, each keyless port
request), whatever its data directory. A change the record cannot take (too big:
``invalid_request``; the backend not answering: ``backend_unavailable``) is undone here and
answered as an error. Elsewhere (Docker, whose labels cannot change; local and SSH sandboxes)
it lives in the state file of the replica that set it, which replicas sharing the data
directory read again at the same moments.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sandboxes.lifecycle import RecordsNetwork
from sandboxes.server import census
from sandboxes.server.entry import Entry
from sandboxes.server.errors import ServiceError, not_found
from sandboxes.server.holdings import Holdings
from sandboxes.server.network_record import merged, parse_record, record_of
from sandboxes.server.settings import LABEL_VALUE
from sandboxes.server.store import Network, SandboxState

__all__ = ["Networks"]

logger = logging.getLogger("sandboxes.server.registry")

_Listed = tuple[float, "asyncio.Future[list[SandboxState]]"]


class Networks(Holdings):
    """`Holdings`, and its sandboxes' networks recorded and read back (see the module)."""

    _records_read: _Listed | None = None
    """When the shared backends' records were last listed for a keyless request, and that list."""

    async def record_network(self, entry: Entry) -> None:
        """Keep what the API just set of the sandbox's network (in its state): on its record
        where its backend keeps one (`_record_on_sandbox`), else in its state file; across a
        restart and a hibernate either way (`SandboxState.network_set`). A change that cannot be
        recorded is undone (`Entry.network_seen`) and raised as a `ServiceError`."""
        state = entry.state
        if entry.backend.records_network and not state.hibernated:  # a hibernated one has no record now
            try:
                await self._record_on_sandbox(entry)
            except BaseException:
                if entry.network_seen is not None:
                    state.restore_network(entry.network_seen)
                    self._network_served(entry)
                raise
        else:  # kept in its state file (`SandboxState.kept_beside_record`)
            state.network_on_record = False
        state.network_set = True
        entry.network_seen = state.network()  # no re-read of the file undoes it meanwhile
        if self._entries.get(state.id) is entry and (not entry.backend.shared or state.kept_beside_record):
            await asyncio.to_thread(self.store.save, state)

    async def _record_on_sandbox(self, entry: Entry) -> None:
        """Write the sandbox's network on its record, merged there with what another replica
        changed since this one last read it (`merged`: what this change changed wins, the rest
        is the record's), and serve the result: ``invalid_request`` if it would exceed
        `sandboxes.lifecycle.NETWORK_RECORD_LIMIT`, ``not_found`` if the sandbox is gone (or recorded deleted),
        ``backend_unavailable`` if the backend does not take it."""
        state = entry.state
        after = state.network()
        before = after if entry.network_seen is None else entry.network_seen
        written: list[Network] = []

        def change(current: str | None) -> str:
            network = after if current is None else merged(parse_record(current), before, after)
            written.append(network)
            return record_of(network)

        provider = entry.backend.provider
        assert isinstance(provider, RecordsNetwork)  # `ProviderBackend.records_network`
        try:
            await asyncio.to_thread(provider.set_network, state.ref, change)
        except LookupError:
            await self._forget(entry)
            raise not_found(state.id) from None
        except ValueError as exc:
            message = f"sandbox {state.id}: its network does not fit its record ({exc}): fewer or shorter rules"
            message += ", headers or ports"
            raise ServiceError("invalid_request", message) from exc
        except Exception as exc:
            logger.warning("recording the network of sandbox %s failed: %s", state.id, exc, exc_info=True)
            message = f"sandbox {state.id}: its network cannot be recorded now; the service log has the request id"
            raise ServiceError("backend_unavailable", message) from exc
        state.network_on_record, entry.network_written = True, time.monotonic()
        if written[-1] != after:  # another replica's change kept beside this one
            state.restore_network(written[-1])
            self._network_served(entry)

    def _network_served(self, entry: Entry) -> None:
        for hook in self.on_network:
            hook(entry)

    def _refresh(self, entry: Entry, recorded: SandboxState, checked: float) -> None:
        """`Holdings._refresh`, and the network on ``recorded`` (its record, read at ``checked``)
        taken if another replica changed it; not from a read started before this replica last
        recorded it (that read may precede its own change)."""
        super()._refresh(entry, recorded, checked)
        if not (entry.backend.records_network and recorded.network_on_record) or checked < entry.network_written:
            return
        if recorded.network() == entry.state.network():
            return
        entry.state.take_network(recorded)
        entry.state.network_on_record, entry.network_seen = True, recorded.network()
        self._network_served(entry)

    async def _reread_network(self, entry: Entry) -> None:
        """Take what the sandbox's state file says of its network (`SandboxState.take_network`),
        which another replica sharing the data directory may have set since (`record_network`),
        and call `on_network` if that changed what this replica serves. Not for a network on
        its record: `_refresh` takes that one."""
        if entry.state.network_on_record:
            return
        seen = entry.network_seen
        kept = await asyncio.to_thread(self.store.load, entry.state.id)
        if kept is None or not kept.network_set or kept.ref != entry.state.ref or kept.network_on_record:
            return
        if kept.network() == seen or entry.network_seen is not seen:  # none since, or this replica's since
            return
        served, entry.network_seen = entry.state.network(), kept.network()
        entry.state.take_network(kept)
        if entry.state.network() != served:
            self._network_served(entry)

    async def network_of(self, sandbox_id: str) -> SandboxState | None:
        """The state that says who may reach the sandbox's ports without a key: as this replica
        holds it (`held_confirmed`); else, for a shared backend's, its record's if it holds its
        network (`_recorded_network`), or its state file, where another replica sharing the data
        directory recorded it (a `find` then adopts it); ``None`` if nothing says anything."""
        entry = await self.held_confirmed(sandbox_id)
        if entry is not None:
            return entry.state
        if not self._shared or not LABEL_VALUE.match(sandbox_id) or self._deleted_here(sandbox_id):
            return None
        recorded = await self._recorded_network(sandbox_id)
        if recorded is not None:
            return recorded
        kept = await asyncio.to_thread(self.store.load, sandbox_id)
        shared = {backend.name for backend in self.backends.values() if backend.shared}
        if kept is None or not kept.network_set or kept.backend not in shared or kept.deleted_on_record:
            return None
        return kept

    async def _recorded_network(self, sandbox_id: str) -> SandboxState | None:
        """The live record of ``sandbox_id`` if it holds its network, from a list of every record
        of the shared backends made at most once per ``confirm_interval`` for all the keyless
        requests of sandboxes not held here: requests for made-up ids cost the backend no more
        than that. A failed list is a `ServiceError` (``backend_unavailable``)."""
        if not any(backend.records_network for backend in self.backends.values()):
            return None
        now = time.monotonic()
        listed = self._records_read
        if listed is None or now - listed[0] >= self.settings.confirm_interval:
            listed = self._records_read = (now, asyncio.ensure_future(self._read(census.all_states, self.backends)))
            listed[1].add_done_callback(_retrieved)
        states = await asyncio.shield(listed[1])
        wall = self.clock.now()
        for state in states:
            if state.id == sandbox_id and state.network_on_record and state.expires_at > wall:
                return state
        return None


def _retrieved(read: asyncio.Future[list[SandboxState]]) -> None:
    """A list's failure retrieved, whether or not a request still waits for it."""
    if not read.cancelled():
        read.exception()
