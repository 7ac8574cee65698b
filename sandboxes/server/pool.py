"""The service's warm pools: for each template with a ``pool_size`` (`TemplateConfig.pool_size`),
that many sandboxes started ahead, their exec helper up, that a create claims instead of
making one.

A pooled sandbox is made like any other (`ProviderBackend.create`) but labelled as a member of
this service's pool (`LABEL_POOL_MEMBER`, the pool's id) with no tenant, and an expiry
`MEMBER_LIFETIME` ahead: no tenant's list, census or quota ever counts it, and nothing but this
pool hands it out. A create that asks for nothing a pooled sandbox lacks (`claimable`: no env,
labels, volumes, snapshot or ``auto_resume``; a TTL is fine) takes one, on the event loop (so
two creates never take the same one), and writes its claim (`sandboxes.server.claims`: tenant,
expiry, ``Idempotency-Key`` digests) before it is answered; its recorded expiry is then moved
to the claim's in the background. From its claim on, it is its tenant's sandbox like any other.

Each claim starts a refill, and that move of its expiry, once the claims have paused for
`REFILL_DELAY` (at most `REFILL_MAX_DELAY` after the first of them; once for the claims until
then), so that neither contends with the first commands of a burst. Refills run in a few
threads of the pool's own (`REFILL_WORKERS`), and the expiries are recorded in one more, never in
the threads creates and requests use, so neither makes a create of a burst wait. A member whose
recorded expiry is less than `STALE_MARGIN` away is replaced, never handed out. At shutdown the unclaimed members are
destroyed; after a ``kill -9`` the start-up reconciliation adopts the claimed ones (their claims
name their tenants) and destroys the unclaimed ones, which the pool then makes again.

What it does not do: replicas. Claims live in one service's data directory; another replica
on the same engine leaves this pool's sandboxes alone but cannot see their claims, and a claim's
quota check counts what this service holds (`Quotas.admit_held`), not the engine's records.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sandboxes._output import DEFAULT_OUTPUT_LIMIT
from sandboxes.api import CreateSandbox
from sandboxes.base import BaseSandbox, MarksAhead
from sandboxes.server import idempotency
from sandboxes.server.backends import Adopted, ProviderBackend
from sandboxes.server.claims import Claims, pool_id_of
from sandboxes.server.logs import unique_id
from sandboxes.server.metrics import Metrics
from sandboxes.server.processes import Command, run_marked
from sandboxes.server.settings import ServiceSettings
from sandboxes.server.store import SandboxState

__all__ = ["MEMBER_LIFETIME", "REFILL_WORKERS", "STALE_MARGIN", "Pools", "claimable"]

logger = logging.getLogger(__name__)

MEMBER_LIFETIME = 3600.0
"""Seconds ahead of its making that a pooled sandbox's recorded expiry lies: a service that
dies for good leaves its pool to the backend's sweeps by then."""
STALE_MARGIN = 600.0
"""A member whose recorded expiry is nearer than this is replaced rather than handed out."""
REFILL_WORKERS = 2
"""Pooled sandboxes made at once, in threads of the pools' own."""
CLAIM_GRACE = 60.0
"""Seconds a claim may wait to be registered (the create's quota recount) before a sweep that
finds its sandbox held nowhere forgets it."""
REFILL_DELAY = 0.1
"""Seconds without a claim before the refill and the recording of the claims' expiries start:
the claimed sandboxes' first commands, and the claims of a burst, come before the backend work
that contends with them (a member's recorded expiry is `STALE_MARGIN` away at least: the delay
is safe)."""
REFILL_MAX_DELAY = 1.0
"""Seconds after the first claim not caught up yet by which the refill starts, however the
claims go on: a steady stream of claims never keeps the pool from refilling."""
RETRY_AFTER_FAILURE = 5.0
"""Seconds before a template whose pooled sandbox could not be made is refilled again."""


@dataclass
class _Member:
    state: SandboxState
    """Its state as made: its service id, ref and recorded expiry; no tenant."""
    sandbox: BaseSandbox


def claimable(request: CreateSandbox) -> bool:
    """Whether a pooled sandbox is what ``request`` asks for: it asks for nothing of its own
    (environment, labels, volumes, a snapshot, ``auto_resume``, ``on_timeout``, its own egress
    allow-list) but a TTL."""
    return not (
        request.env
        or request.labels
        or request.volumes
        or request.snapshot
        or request.auto_resume
        or request.on_timeout != "delete"
        or request.egress_allow is not None
    )


class Pools:
    """The warm pools of one service's templates, and the claims of what they handed out. Every
    method runs on the registry's event loop; members are made and destroyed in the pools'
    threads."""

    def __init__(
        self,
        settings: ServiceSettings,
        backends: dict[str, ProviderBackend],
        metrics: Metrics,
        now: Callable[[], float],
    ) -> None:
        self.claims = Claims(settings.data_dir / "claims", pool_id_of(settings.data_dir))
        for name, backend in backends.items():
            if backend.shared:
                backend.claims = self.claims
            elif backend.template.pool_size:
                raise ValueError(
                    f"template {name!r}: pool_size needs a backend whose sandboxes are selected by label and "
                    f"whose expiry can move (docker, kubernetes); {backend.name} has none"
                )
        self._backends = {name: b for name, b in backends.items() if b.template.pool_size}
        self._metrics = metrics
        self._now = now
        self._ready: dict[str, collections.deque[_Member]] = {name: collections.deque() for name in self._backends}
        self._making: collections.Counter[str] = collections.Counter()
        self._executor = ThreadPoolExecutor(REFILL_WORKERS, thread_name_prefix="sandboxes-pool")
        self._recorder = ThreadPoolExecutor(1, thread_name_prefix="sandboxes-pool-expiry")
        """Where the claims' expiries are recorded, one after the other: never in the threads
        requests use, so a burst's recordings never queue ahead of its creates' reads."""
        self._tasks: set[asyncio.Future[None]] = set()
        self._closing = False
        self._due: dict[str, list[str]] = {}
        """Per template, the claims since the last catch-up (`_after_claims`), by sandbox id."""
        self._catch_ups: dict[str, tuple[float, asyncio.TimerHandle]] = {}
        """Per template with claims due: when the first of them came (loop time), and the catch-up's timer."""

    def ready(self, template: str) -> int:
        """Members of ``template``'s pool ready to be claimed now."""
        return len(self._ready.get(template, ()))

    def offers(self, template: str, request: CreateSandbox) -> bool:
        """Whether `claim` would hand ``request`` one of ``template``'s members now (one is ready,
        and it asks for nothing a member lacks): a stale one may still leave it cold."""
        return bool(self._ready.get(template)) and claimable(request)

    # ------------------------------------------------------------------ lifecycle

    def start(self, held: Iterable[str], unreachable: Iterable[str]) -> None:
        """Forget the claims of sandboxes that are gone (not ``held`` by the registry once it has
        reconciled, nor of a template in ``unreachable``), and start filling every pool."""
        self._drop_gone(held, unreachable, time.time())
        for name in self._backends:
            self._refill(name)

    def _drop_gone(self, held: Iterable[str], unreachable: Iterable[str], before: float) -> None:
        """Forget the claims made before ``before`` of sandboxes the registry does not hold
        (removed from under it, or reaped while it was down), unless their backend is unreachable."""
        held, waiting = set(held), set(unreachable)
        for sandbox_id in self.claims.ids() - held:
            claim = self.claims.get(sandbox_id)
            if claim is not None and claim.template not in waiting and claim.created_at < before:
                logger.info("dropping the claim of pooled sandbox %s: it is gone", sandbox_id)
                self.claims.drop(sandbox_id)

    def refs(self) -> frozenset[tuple[str, str]]:
        """The members ready now, as (backend kind, ref)."""
        return frozenset((m.state.backend, m.state.ref) for members in self._ready.values() for m in members)

    async def close(self) -> None:
        """Stop refilling, and destroy every unclaimed member (the claimed ones are tenants')."""
        self._closing = True
        for name in list(self._due):  # the claims' expiries recorded; no refill, closing
            self._catch_up(name)
        while self._tasks:  # a refill under way destroys what it made, seeing the pool closing
            await asyncio.gather(*self._tasks, return_exceptions=True)
        loop = asyncio.get_running_loop()
        doomed = [(name, member) for name, members in self._ready.items() for member in members]
        for members in self._ready.values():
            members.clear()
        await asyncio.gather(
            *(loop.run_in_executor(self._executor, self._discard, self._backends[n], m) for n, m in doomed)
        )
        self._update_gauge()
        self._executor.shutdown(wait=True)
        self._recorder.shutdown(wait=True)

    async def sweep(self, held: Iterable[str], unreachable: Iterable[str]) -> None:
        """Replace the members whose recorded expiry is near (`STALE_MARGIN`); forget the claims
        of sandboxes gone from under the registry (`_drop_gone`), leaving alone those too recent
        to be registered yet."""
        self._drop_gone(held, unreachable, time.time() - CLAIM_GRACE)
        for name, members in self._ready.items():
            stale = [member for member in members if self._stale(member)]
            for member in stale:
                members.remove(member)
                self._spawn(self._discard_async(name, member))
            if stale:
                self._refill(name)
        self._update_gauge()

    # ------------------------------------------------------------------ claiming

    async def claim(
        self,
        backend: ProviderBackend,
        request: CreateSandbox,
        tenant: str,
        expires_at: float,
        keyed: idempotency.Keyed | None,
    ) -> Adopted | None:
        """One of the template's members, claimed for ``tenant`` until ``expires_at``; ``None``
        if the template pools none, ``request`` asks for what no member has, or none is ready
        (the create then makes one, cold)."""
        name = backend.template_name
        if name not in self._ready or not claimable(request):
            return None
        member = self._take(name)
        if member is None:
            return None
        state = dataclasses.replace(
            member.state, tenant=tenant, expires_at=expires_at, created_at=float(f"{time.time():.6f}")
        )
        if keyed is not None:
            state.idempotency_key, state.request_digest = keyed.key, keyed.request
        try:  # on the loop, a small file: no abandoned request can leave it taken and unanswered
            claimed = self.claims.claim(state)
        except Exception:
            logger.exception("recording the claim of pooled sandbox %s failed", state.id)
            claimed = False
        if not claimed:
            self._spawn(self._discard_async(name, member))
            return None
        self._after_claims(name, state.id)
        logger.debug("claimed a pooled sandbox", extra={"sandbox": state.id, "tenant": tenant, "template": name})
        return dataclasses.replace(state), member.sandbox

    def _take(self, name: str) -> _Member | None:
        members = self._ready[name]
        while members:
            member = members.popleft()
            if not self._stale(member):
                self._update_gauge()
                return member
            self._spawn(self._discard_async(name, member))
        self._update_gauge()
        return None

    def _stale(self, member: _Member) -> bool:
        return member.state.expires_at - self._now() < STALE_MARGIN

    async def _record_expiry(self, backend: ProviderBackend, sandbox_id: str) -> None:
        """Move the claimed sandbox's recorded expiry from the pool's to its claim's as it is now
        (what the backend's own sweeps go by); nothing if it is claimed no more (deleted)."""
        state = self.claims.get(sandbox_id)
        if state is None:
            return
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._recorder, backend.renew, state, math.ceil(state.expires_at))
        except LookupError:
            logger.info("pooled sandbox %s was gone before its expiry was recorded", state.id)
        except Exception:
            logger.exception("recording the expiry of claimed sandbox %s failed", state.id)

    # ------------------------------------------------------------------ refilling

    def _after_claims(self, name: str, sandbox_id: str) -> None:
        """`REFILL_DELAY` after the last claim of ``name``, but no later than `REFILL_MAX_DELAY`
        after the first not caught up yet, record the expiries of all the claims since
        (`_record_expiry`) and refill the pool, at once."""
        loop = asyncio.get_running_loop()
        first = loop.time()
        if name in self._catch_ups:
            first, timer = self._catch_ups[name]
            timer.cancel()
        at = min(loop.time() + REFILL_DELAY, first + REFILL_MAX_DELAY)
        self._catch_ups[name] = (first, loop.call_at(at, self._catch_up, name))
        self._due.setdefault(name, []).append(sandbox_id)

    def _catch_up(self, name: str) -> None:
        if (pending := self._catch_ups.pop(name, None)) is not None:
            pending[1].cancel()  # called at closing, before its timer
        for sandbox_id in self._due.pop(name, []):
            self._spawn(self._record_expiry(self._backends[name], sandbox_id))
        self._refill(name)

    def _refill(self, name: str) -> None:
        """Start making members until ready and under way make the pool's size."""
        backend = self._backends[name]
        while not self._closing and len(self._ready[name]) + self._making[name] < backend.template.pool_size:
            self._making[name] += 1
            self._spawn(self._fill_one(name))

    async def _fill_one(self, name: str) -> None:
        backend = self._backends[name]
        loop = asyncio.get_running_loop()
        try:
            member = await loop.run_in_executor(self._executor, self._make, backend)
        except Exception as exc:
            logger.warning("making a pooled %s sandbox failed: %s", name, exc, exc_info=True)
            loop.call_later(RETRY_AFTER_FAILURE, self._refill, name)
            return
        finally:
            self._making[name] -= 1
        if self._closing:
            await loop.run_in_executor(self._executor, self._discard, backend, member)
            return
        self._ready[name].append(member)
        self._update_gauge()

    def _make(self, backend: ProviderBackend) -> _Member:
        """A new member, its exec helper started by a first command and a second one marked as
        the service marks its commands, so that a helper that starts shells ahead has one
        waiting for its tenant's first command (blocks)."""
        expires_at = float(math.ceil(self._now() + MEMBER_LIFETIME))
        state, sandbox = backend.create("", expires_at, {}, {}, pool=self.claims.pool_id)
        try:
            sandbox.execute("true", timeout=60)  # starts the helper; the next command announces
            token = sandbox.command_marker(unique_id) if isinstance(sandbox, MarksAhead) else unique_id()
            warm = run_marked(sandbox, Command("true", 60.0, DEFAULT_OUTPUT_LIMIT), token, None)
            if warm.exit_code != 0:
                raise RuntimeError(f"warming it failed: {warm.error or warm.exit_code} {warm.message}")
        except BaseException:
            backend.destroy(state, sandbox)
            raise
        return _Member(state, sandbox)

    async def _discard_async(self, name: str, member: _Member) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._discard, self._backends[name], member)

    @staticmethod
    def _discard(backend: ProviderBackend, member: _Member) -> None:
        try:
            backend.destroy(member.state, member.sandbox)
        except Exception:
            logger.warning("destroying pooled sandbox %s failed; its expiry reaps it", member.state.id, exc_info=True)

    def _spawn(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _update_gauge(self) -> None:
        for name, members in self._ready.items():
            self._metrics.pool_ready.labels(name).set(len(members))
