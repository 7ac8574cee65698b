"""The warm pool and periodic sweep that the Docker and Kubernetes providers share.

A provider that pools keeps ``pool_size`` started sandboxes, exec helper up, for `acquire`;
one background thread, between ``start`` and ``close``, refills the pool (with backoff while
the backend is down), replaces entries idle longer than ``pool_max_idle`` and sweeps every
``sweep_interval``. What differs between backends (how a pooled sandbox is made, whether it
is still usable, how it is handed out and discarded, what a sweep removes) are the hooks a
subclass implements; the thread, the locking and the hand-over are written once, here.

Pool membership lives in memory only: a pooled sandbox carries its provider's id as a label,
and its expiry is pushed back by ``pool_max_idle``, so a provider that dies leaves nothing a
later sweep of the same owner cannot reap.
"""

from __future__ import annotations

import abc
import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Generic, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from tenacity import Retrying, before_sleep_log, stop_when_event_set, wait_exponential

from sandboxes.base import BaseSandbox
from sandboxes.lifecycle import CreateOptions, Sweep

__all__ = ["PoolConfig", "WarmPool"]

logger = logging.getLogger(__name__)

S = TypeVar("S", bound=BaseSandbox)


class PoolConfig(BaseModel):
    """How a provider pools and sweeps. The defaults pool nothing and sweep every 5 minutes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pool_size: int = Field(default=0, ge=0)
    """Started, helper-warmed sandboxes kept ready for `WarmPool.acquire`."""
    refill_interval: float = Field(default=1.0, gt=0)
    """Seconds between the background thread's looks at the pool; an acquire wakes it at once."""
    sweep_interval: float | None = Field(default=300.0, gt=0)
    """Seconds between background sweeps; ``None``: only the sweep at `WarmPool.start`."""
    sweep_on_start: bool = True
    pool_max_idle: float = Field(default=600.0, gt=0)
    """Seconds a sandbox may wait in the pool; older ones are replaced, which is what bounds
    the pushed-back expiry of pooled sandboxes."""
    retry_max_backoff: float = Field(default=30.0, gt=0)
    """Ceiling of the exponential backoff between failed refills (the backend may be down)."""
    close_timeout: float = Field(default=60.0, gt=0)
    """Seconds ``close`` waits for the background thread's work in hand."""


@dataclass
class _Idle(Generic[S]):
    sandbox: S
    born: float
    """`time.monotonic` just before the sandbox was made, so its age never understates."""


class WarmPool(abc.ABC, Generic[S]):
    """A provider's warm pool and background sweep; subclasses supply the backend's hooks."""

    config: PoolConfig

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.id = uuid.uuid4().hex[:12]
        self._idle: deque[_Idle[S]] = deque()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    # ------------------------------------------------------------------ the backend's hooks

    @abc.abstractmethod
    def create(self, options: CreateOptions | None = None) -> S:
        """A cold sandbox, for an `acquire` that finds the pool empty."""

    @abc.abstractmethod
    def sweep(self, now: float | None = None) -> Sweep:
        """Remove this owner's expired and orphaned sandboxes (never the idle pool's)."""

    @abc.abstractmethod
    def _make_pooled(self) -> S:
        """A new sandbox made to wait in the pool (pool label, pushed-back expiry), not warmed."""

    @abc.abstractmethod
    def _ref(self, sandbox: S) -> str:
        """What `idle` lists for a pooled sandbox: the ref `attach` and `destroy` take."""

    @abc.abstractmethod
    def _usable(self, sandbox: S) -> bool:
        """Whether a pooled sandbox may still be handed out."""

    @abc.abstractmethod
    def _discard(self, sandbox: S) -> None:
        """Remove a pooled sandbox nobody holds; log rather than raise (a sweep reaps it)."""

    def _hand_out(self, sandbox: S) -> None:
        """Turn a pooled sandbox into an acquired one (unmark it, start its ttl); raising
        discards it and tries the next."""

    def _stale(self, sandbox: S) -> bool:
        """Whether an idle entry that is not too old must be replaced all the same; checked on
        every look at the pool, so it must be cheap."""
        return False

    def _log_sweep(self, report: Sweep) -> None:
        if report.removed:
            logger.info("sweep of provider %s removed %d sandboxes", self.id, len(report.removed))
        for error in report.errors:
            logger.warning("sweep could not remove %s", error)

    # ------------------------------------------------------------------ the pool

    def acquire(self) -> S:
        """A started sandbox with its exec helper up, from the pool; a cold `create` if the pool
        is empty. The caller owns it: ``with provider.acquire() as sandbox:`` destroys it."""
        while True:
            with self._lock:
                if self._closed:
                    raise RuntimeError(f"{type(self).__name__} {self.id} is closed")
                entry = self._idle.popleft() if self._idle else None
            if entry is None:
                return self.create()
            self._wake.set()
            if time.monotonic() - entry.born <= self.config.pool_max_idle and self._usable(entry.sandbox):
                try:
                    self._hand_out(entry.sandbox)
                    return entry.sandbox
                except Exception:
                    logger.warning("could not hand out pooled sandbox %s", self._ref(entry.sandbox), exc_info=True)
            self._discard(entry.sandbox)

    @property
    def idle(self) -> tuple[str, ...]:
        """Refs of the sandboxes waiting in the pool, next to be handed out first."""
        with self._lock:
            return tuple(self._ref(entry.sandbox) for entry in self._idle)

    def wait_filled(self, timeout: float | None = None) -> bool:
        """Block until the pool holds ``pool_size`` sandboxes; whether it did within ``timeout``."""
        with self._changed:
            return self._changed.wait_for(lambda: self._closed or len(self._idle) >= self.config.pool_size, timeout)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        """Sweep once (errors listing sandboxes surface: the backend is unusable), then start
        the background thread that fills the pool and sweeps periodically."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{type(self).__name__} {self.id} is closed")
            if self._thread is not None:
                return self
        if self.config.sweep_on_start:
            self._log_sweep(self.sweep())
        if self.config.pool_size or self.config.sweep_interval is not None:
            thread = threading.Thread(target=self._run, name=f"sandboxes-pool-{self.id}", daemon=True)
            with self._lock:
                self._thread = thread
            thread.start()
        return self

    def close(self) -> None:
        """Stop the background thread and remove the sandboxes still idle in the pool. Handed-out
        sandboxes are their holders' to destroy. Idempotent."""
        with self._changed:
            self._closed = True  # from here on, a sandbox the thread finishes is discarded
            idle = list(self._idle)
            self._idle.clear()
            self._changed.notify_all()
            thread, self._thread = self._thread, None
        self._stop.set()
        self._wake.set()
        for entry in idle:
            self._discard(entry.sandbox)
        if thread is not None:
            thread.join(self.config.close_timeout)
            if thread.is_alive():
                logger.warning("pool thread of provider %s still busy after close; it cleans up after itself", self.id)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _pooled_refs(self) -> set[str]:
        """What a sweep must leave alone: the pool replaces its own stale entries."""
        with self._lock:
            return {self._ref(entry.sandbox) for entry in self._idle}

    # ------------------------------------------------------------------ background thread

    def _run(self) -> None:
        """Fill the pool, replace stale entries, sweep when due; log every failure, never die."""
        interval = self.config.sweep_interval
        next_sweep = time.monotonic() + interval if interval is not None else None
        while not self._stop.is_set():
            self._wake.clear()
            try:
                if next_sweep is not None and interval is not None and time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + interval
                    self._log_sweep(self.sweep())
                self._replace_stale()
                self._refill()
            except Exception:
                if not self._stop.is_set():
                    logger.exception("pool maintenance of provider %s failed; trying again", self.id)
            self._wake.wait(self.config.refill_interval)

    def _refill(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if len(self._idle) >= self.config.pool_size:
                    return
            retrying = Retrying(
                stop=stop_when_event_set(self._stop),
                wait=wait_exponential(multiplier=0.5, max=self.config.retry_max_backoff),
                sleep=self._interruptible_sleep,
                before_sleep=before_sleep_log(logger, logging.WARNING),
                reraise=True,
            )
            for attempt in retrying:
                with attempt:
                    self._add_one()

    def _interruptible_sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _add_one(self) -> None:
        born = time.monotonic()
        sandbox = self._make_pooled()
        try:
            warm = sandbox.execute("true")
            if warm.exit_code != 0:
                reason = f"{warm.error or warm.exit_code} {warm.message}"
                raise RuntimeError(f"warming {self._ref(sandbox)} failed: {reason}")
        except BaseException:
            self._discard(sandbox)
            raise
        with self._changed:
            if not self._closed:
                self._idle.append(_Idle(sandbox, born))
                self._changed.notify_all()
                return
        self._discard(sandbox)

    def _replace_stale(self) -> None:
        cutoff = time.monotonic() - self.config.pool_max_idle
        with self._lock:
            stale = [entry for entry in self._idle if entry.born < cutoff or self._stale(entry.sandbox)]
            for entry in stale:
                self._idle.remove(entry)
        for entry in stale:
            self._discard(entry.sandbox)
