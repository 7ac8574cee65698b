"""Every egress sandbox's proxy port, served (`EgressHub`): the exec helper listens on the
template's ``egress_port`` inside the sandbox (`sandboxes._mux._listen`), each connection a
command makes there is adopted as a relay, and the service's `EgressProxy` serves it with the
sandbox's allow-list and its tenant's credentials. The sandbox has no network interface: the
helper's stream is its only way out, the same on every backend that holds a helper.

A listener lives as long as its helper: when the helper is restarted, or the sandbox made again
(a resume from hibernation), it is listened on again; when the sandbox is no longer held here
(deleted, expired), it stops. The allow-list and headers a sandbox is served are its state's
(`SandboxState.egress_allow`, ``egress_headers``: its create's, or its template's list); a change
through the API (`set_allow`, `set_headers`) is written there and applies to the next connection.
One made through another replica sharing the data directory applies from the next connection
too: each connection first has its sandbox's record read again (``refresh``, at most once per
``confirm_interval``), which takes the network that replica recorded (`network_changed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from sandboxes._mux import HoldsHelper, MuxBroken, MuxClient
from sandboxes._mux._listen import listen
from sandboxes._mux._relay import open_relay
from sandboxes.server.egress.policy import EgressPolicy
from sandboxes.server.egress.proxy import Credential, EgressContext, EgressProxy
from sandboxes.server.egress.rate import ByteRate
from sandboxes.server.entry import Entry
from sandboxes.server.errors import ServiceError
from sandboxes.server.relay_limits import limits_of
from sandboxes.server.settings import ServiceSettings

__all__ = ["EgressHub"]

logger = logging.getLogger(__name__)

_Refresh = Callable[[str], Awaitable[object]]
"""Read a held sandbox's record again if it is due (`Holdings.held_confirmed`)."""

_RETRY_FIRST = 0.5
_RETRY_MAX = 30.0
"""Seconds between tries to listen again (no helper now, its port taken by another replica)."""


class _Served:
    """One sandbox's listener, re-made on each new helper, and the connections it took."""

    def __init__(
        self, entry: Entry, policy: EgressPolicy, context: EgressContext, proxy: EgressProxy, refresh: _Refresh
    ) -> None:
        self.entry = entry
        self.refresh = refresh
        self.policy = policy
        self.context = context
        self.proxy = proxy
        self.port = entry.backend.template.egress_port
        self.connections: set[asyncio.Task[None]] = set()
        self.tenants = list(context.credentials)
        """The tenant's credentials (the operator's); the sandbox's own come after them."""
        self.remade = asyncio.Event()
        """Set when the sandbox was made again (`EgressHub.attach` once more): listen at once."""
        self.headers_changed()

    def headers_changed(self) -> None:
        """Serve the sandbox's own headers (its state's) after its tenant's."""
        own = self.entry.state.egress_headers
        self.context.credentials = [*self.tenants, *(Credential(host, dict(v)) for host, v in own.items())]

    async def run(self, held: Callable[[str], bool]) -> None:
        delay = _RETRY_FIRST
        while held(self.entry.state.id):
            sandbox = self.entry.sandbox  # another one once it is made again (a resume)
            mux = await asyncio.to_thread(sandbox.exec_helper) if isinstance(sandbox, HoldsHelper) else None
            why: str | None = "no exec helper runs"
            if mux is not None:
                why = await self._listen_on(mux)
                if why is None:  # it listened, then its helper went: listen on the next one at once
                    delay = _RETRY_FIRST
                    continue
            logger.info("egress of sandbox %s not listening: %s", self.entry.state.id, why)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.remade.wait(), delay)
            delay = _RETRY_FIRST if self.remade.is_set() else min(delay * 2, _RETRY_MAX)
            self.remade.clear()

    async def _listen_on(self, mux: MuxClient) -> str | None:
        """Listen through ``mux`` until it ends: ``None`` once it listened (and its helper went or
        it was stopped), else why it could not."""
        loop = asyncio.get_running_loop()

        def on_accept(number: int) -> None:
            loop.call_soon_threadsafe(self._adopt, mux, number)

        try:
            listening = listen(mux, self.port, on_accept)
        except MuxBroken as broken:
            return str(broken)
        assert listening.channel is not None
        try:
            answer = await listening.channel.wait_async()
        except MuxBroken:
            return None if listening.bound.is_set() else "its helper broke"
        except asyncio.CancelledError:
            listening.close()
            raise
        return None if answer.error is None and listening.failure is None else (answer.message or listening.failure)

    def _adopt(self, mux: MuxClient, number: int) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(mux, number))
        self.connections.add(task)
        task.add_done_callback(self.connections.discard)

    async def _serve(self, mux: MuxClient, number: int) -> None:
        try:
            reader, writer = await open_relay(mux, self.port, accepted=number)
        except (MuxBroken, OSError) as exc:
            logger.info("egress connection of sandbox %s lost before it was served: %s", self.entry.state.id, exc)
            return
        try:
            await self.refresh(self.entry.state.id)  # another replica's change to its network, taken
        except ServiceError as exc:  # its record unread: served as held
            logger.info("egress of sandbox %s served as held, its record unread: %s", self.entry.state.id, exc.message)
        await self.proxy.serve(reader, writer, self.context)


async def _unchanged(sandbox_id: str) -> None:
    """No record to read again: what is held is the sandbox's network."""


def _starting_policy(entry: Entry) -> EgressPolicy:
    """The create's allow-list if it gave one, else the template's; a recorded list that no
    longer parses allows nothing."""
    template = entry.backend.template
    allow = template.egress_allow if entry.state.egress_allow is None else entry.state.egress_allow
    try:
        return EgressPolicy(allow=allow, open_ranges=template.egress_open_ranges)
    except ValueError as exc:
        logger.warning("sandbox %s: its egress allow-list does not parse, nothing allowed: %s", entry.state.id, exc)
        return EgressPolicy(allow=[], open_ranges=template.egress_open_ranges)


class EgressHub:
    """The egress of every sandbox this replica holds whose template has egress."""

    def __init__(
        self,
        settings: ServiceSettings,
        held: Callable[[str], bool],
        proxy: EgressProxy | None = None,
        refresh: _Refresh | None = None,
    ) -> None:
        self._settings = settings
        self._held = held
        self._refresh = refresh or _unchanged
        self._proxy = proxy or EgressProxy()
        self._served: dict[str, tuple[_Served, asyncio.Task[None]]] = {}

    def attach(self, entry: Entry) -> None:
        """Serve ``entry``'s egress if its template has it (on the event loop, once per sandbox)."""
        template = entry.backend.template
        sandbox_id = entry.state.id
        if sandbox_id in self._served:
            self._served[sandbox_id][0].remade.set()
            return
        if not template.egress:
            return
        if not isinstance(entry.sandbox, HoldsHelper):
            logger.warning("sandbox %s has egress but no exec helper to relay it: it has none", sandbox_id)
            return
        policy = _starting_policy(entry)
        tenant = entry.state.tenant
        credentials = [
            Credential(item.host, {name: value.get_secret_value() for name, value in item.headers.items()})
            for item in self._settings.policy_for(tenant).egress_credentials
        ]
        served: _Served
        rate = None if template.egress_bytes_per_second is None else ByteRate(template.egress_bytes_per_second)
        context = EgressContext(
            sandbox=sandbox_id,
            tenant=tenant,
            policy=lambda: served.policy,
            credentials=credentials,
            rate=rate,
            limits=limits_of(entry.sandbox, template),
        )
        served = _Served(entry, policy, context, self._proxy, self._refresh)
        task = asyncio.get_running_loop().create_task(served.run(self._held))
        task.add_done_callback(lambda _: self._served.pop(sandbox_id, None))
        self._served[sandbox_id] = (served, task)

    def allow_list(self, sandbox_id: str) -> list[str] | None:
        """The sandbox's allow-list now; ``None``: it has no egress here."""
        found = self._served.get(sandbox_id)
        return None if found is None else list(found[0].policy.allow)

    def set_allow(self, sandbox_id: str, allow: list[str] | None) -> bool:
        """Replace the sandbox's allow-list (``None``: its template's) from its next connection
        on, in its state too; whether it has egress here. ValueError for a rule that does not parse."""
        found = self._served.get(sandbox_id)
        if found is None:
            return False
        served = found[0]
        rules = served.entry.backend.template.egress_allow if allow is None else allow
        served.policy = EgressPolicy(allow=rules, open_ranges=served.policy.open_ranges)
        served.entry.state.egress_allow = None if allow is None else list(allow)
        return True

    def set_headers(self, sandbox_id: str, headers: dict[str, dict[str, str]]) -> bool:
        """Replace the headers the proxy adds to the sandbox's plain-HTTP requests for each host
        (exact, or ``*.domain``), set after the tenant's; whether it has egress here."""
        found = self._served.get(sandbox_id)
        if found is None:
            return False
        served = found[0]
        served.entry.state.egress_headers = {host: dict(values) for host, values in headers.items()}
        served.headers_changed()
        return True

    def network_changed(self, entry: Entry) -> None:
        """Serve the allow-list and headers ``entry``'s state says now (another replica changed
        them) from the sandbox's next connection on."""
        found = self._served.get(entry.state.id)
        if found is None:
            return
        served = found[0]
        served.entry = entry
        served.policy = _starting_policy(entry)
        served.headers_changed()

    async def close(self) -> None:
        """Stop every listener and the connections they took."""
        tasks = [task for _, task in self._served.values()]
        tasks += [connection for served, _ in self._served.values() for connection in served.connections]
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
        self._served.clear()
