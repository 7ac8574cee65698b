"""A tenant's quota at creation: what counts against it, and the second count that keeps two
replicas creating at the same time from both keeping a sandbox over it.

What counts: the shared backends' records (every replica's sandboxes: `sandboxes.server.census`),
the tenant's sandboxes on the other backends held by this service, those on a backend that
cannot be reached now (still the tenant's), and the creations under way here that no record
shows yet (`Reservation`). A claim of a pooled sandbox (`sandboxes.server.pool`, one service's)
counts the shared backends' sandboxes from what this service holds of them (`Quotas.admit_held`),
with no read of the backends on its path. The registry (`sandboxes.server.registry`) keeps the sandboxes and
hands in how to read the first two; this module keeps the reservations and the rules.

Why a module of its own: the counting is one concern with rules of its own (each sandbox counted
once, wherever it is seen; a creation counted from its admission until it is recorded; a count
that cannot be read admits nothing, a recount that cannot be read keeps what the first count
let in), kept apart from the registry's lookup, TTLs and reconciliation. All of it runs on the
registry's event loop thread, so a check and the reservation that follows it cannot interleave
with another request's.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from sandboxes.base import BaseSandbox
from sandboxes.server import census
from sandboxes.server.auth import Tenant
from sandboxes.server.backends import ProviderBackend, new_sandbox_id
from sandboxes.server.errors import ServiceError
from sandboxes.server.settings import Template
from sandboxes.server.store import SandboxState

__all__ = ["Quotas", "Reservation"]

logger = logging.getLogger(__name__)

_KEYS = itertools.count()
"""`Reservation.key`s: unique within the process, which is all they need to be."""


@dataclass
class Reservation:
    """A creation under way: it counts against its tenant's quota from the check that admitted
    it until `Quotas.release`, once the sandbox is recorded (or the creation failed)."""

    tenant: str
    cpus: float
    memory: int
    sandbox_id: str = field(default_factory=new_sandbox_id)
    key: str = field(default_factory=lambda: str(next(_KEYS)))


class Quotas:
    """The creations under way, and the quota checks before and after a creation.

    ``recorded`` reads the tenant's sandboxes on the shared backends (none without one; a
    `ServiceError` when the records cannot be read); ``held`` lists the tenant's others this
    service holds, including those on a backend it cannot reach now."""

    def __init__(
        self,
        recorded: Callable[[Tenant], Awaitable[list[SandboxState]]],
        held: Callable[[Tenant], Iterable[SandboxState]],
        now: Callable[[], float],
    ) -> None:
        self._recorded = recorded
        self._held = held
        self._now = now
        self._reserved: dict[str, Reservation] = {}

    async def reserve(self, tenant: Tenant, template: Template) -> Reservation:
        """Admit one more sandbox of ``template``, counting it until `release`; `ServiceError`
        ``quota_exceeded`` if it does not fit (`refusal` says whether waiting helps)."""
        recorded = await self._recorded(tenant)
        refused = census.over_quota(tenant, self._usage(tenant, recorded), template)
        if refused is not None:
            raise self._refusal(tenant, template, recorded, refused)
        return self._reserve(tenant, template)

    def admit_held(self, tenant: Tenant, template: Template, holding: Iterable[SandboxState]) -> Reservation | None:
        """Admit one more sandbox of ``template`` counting the tenant's shared sandboxes from
        ``holding`` (what this service holds of them) instead of the backends' records, without
        a backend read: for a claim of a pooled sandbox, which is one service's. ``None`` if it
        does not fit by that count (`reserve` then decides, and words the refusal)."""
        recorded = list({state.id: state for state in holding}.values())
        if census.over_quota(tenant, self._usage(tenant, recorded), template) is not None:
            return None
        return self._reserve(tenant, template)

    def _reserve(self, tenant: Tenant, template: Template) -> Reservation:
        reservation = Reservation(tenant.id, template.cpus, template.memory_bytes)
        self._reserved[reservation.key] = reservation
        return reservation

    def release(self, reservation: Reservation) -> None:
        """Stop counting ``reservation`` (idempotent): its sandbox is recorded, or was not made."""
        self._reserved.pop(reservation.key, None)

    async def recount(
        self, tenant: Tenant, template: Template, state: SandboxState, sandbox: BaseSandbox, backend: ProviderBackend
    ) -> None:
        """Count again once the new sandbox is recorded: another replica may have created one of
        the tenant's at the same time, unseen by the first count. Over quota, the newcomer is
        destroyed and refused (both racers may be; neither is kept over the quota)."""
        try:
            recorded = [s for s in await self._recorded(tenant) if s.id != state.id]
        except ServiceError:  # the first count let it in: keep it rather than leak it unanswered
            return
        refused = census.over_quota(tenant, self._usage(tenant, recorded, besides=state.id), template)
        if refused is None:
            return
        logger.info("created over quota (a concurrent creation): destroying it", extra={"sandbox": state.id})
        try:
            await asyncio.to_thread(backend.destroy, state, sandbox)
        except Exception:
            logger.exception("destroying sandbox %s created over quota failed; its expiry reaps it", state.id)
        raise self._refusal(tenant, template, recorded, f"{refused} (counted after creating)", racing=True)

    def _refusal(
        self, tenant: Tenant, template: Template, recorded: list[SandboxState], why: str, *, racing: bool = False
    ) -> ServiceError:
        """``quota_exceeded`` as 403 where waiting cannot help (one sandbox of ``template`` is
        over the whole quota), else as 429 with a ``Retry-After``: 1 s while creations under way
        (``racing``: another replica's) are what fills it, else until the first of the tenant's
        sandboxes expires, which frees its share."""
        never = census.over_quota(tenant, census.Usage(), template)
        if never is not None:
            message = f"quota of tenant {tenant.id!r}: {never}: no sandbox of this template fits it"
            return ServiceError("quota_exceeded", message, status=403)
        message = f"quota of tenant {tenant.id!r}: {why}"
        states = self._states(tenant, recorded)
        if racing or census.over_quota(tenant, census.Usage.of(states), template) is None:
            wait, until = 1, "creations under way fill it"
        else:
            first = min((state.expires_at for state in states), default=self._now())
            wait, until = max(1, math.ceil(first - self._now())), "its first sandbox expires then, unless renewed"
        return ServiceError(
            "quota_exceeded", f"{message}; retry in {wait}s ({until})", status=429, headers={"Retry-After": str(wait)}
        )

    def _states(self, tenant: Tenant, recorded: list[SandboxState]) -> list[SandboxState]:
        """The tenant's sandboxes that count: the shared backends' records and the others held."""
        ids = {state.id for state in recorded}
        return [*recorded, *(state for state in self._held(tenant) if state.id not in ids)]

    def _usage(self, tenant: Tenant, recorded: list[SandboxState], *, besides: str | None = None) -> census.Usage:
        """The tenant's usage: the shared backends' records, the others held here, and the
        creations under way here not recorded yet (``besides`` one of them)."""
        ids = {state.id for state in recorded}
        pending = [
            r
            for r in self._reserved.values()
            if r.tenant == tenant.id and r.sandbox_id not in ids and r.sandbox_id != besides
        ]
        used = census.Usage.of(self._states(tenant, recorded))
        return census.Usage(
            used.count + len(pending),
            used.cpus + sum(r.cpus for r in pending),
            used.memory + sum(r.memory for r in pending),
        )
