"""`KubernetesProvider`: creates sandbox pods from a template, finds them by label, deletes them,
sweeps the expired and the orphaned, and keeps a warm pool of ready pods.

The cluster is the record: every pod carries ``app.kubernetes.io/managed-by=sandboxes``, its
owner, its sandbox id and its expiry as labels, so a new process (or another replica) with the
same template lists, adopts and reaps what exists. Only the warm pool's membership lives in
memory, and it is marked on the pods too (``io.sandboxes.pool=<provider id>``) until handed out.

Pooled pods and their expiry. A pooled pod is created to expire at ``creation + pool_max_idle +
ttl`` (label and ``activeDeadlineSeconds``), and the pool never keeps one idle longer than
``pool_max_idle``. When one is handed out its pool label is removed and its expiry label set
to ``now + ttl`` (labels, unlike a container's, can change); its ``activeDeadlineSeconds`` stays
the upper bound. A pool label left on a pod older than ``pool_max_idle`` (plus a grace) means
its provider died: a sweep of the same owner deletes it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field
from tenacity import Retrying, before_sleep_log, stop_when_event_set, wait_exponential

from sandboxes.kubernetes._pods import (
    caller_labels,
    core_api,
    create_pod,
    delete_pod,
    load_api_client,
    owner_selector,
    pod_annotations,
    pod_record,
)
from sandboxes.kubernetes.config import LABEL_EXPIRES, LABEL_POOL, KubernetesSandboxConfig
from sandboxes.kubernetes.sandbox import KubernetesSandbox
from sandboxes.lifecycle import CreateOptions, SandboxRecord, Sweep

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

logger = logging.getLogger(__name__)


class KubernetesProviderConfig(BaseModel):
    """How a provider pools and sweeps. The defaults pool nothing and sweep every 5 minutes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pool_size: int = Field(default=0, ge=0)
    """Ready pods, exec helper started, kept for `KubernetesProvider.acquire`."""
    refill_interval: float = Field(default=1.0, gt=0)
    sweep_interval: float | None = Field(default=300.0, gt=0)
    sweep_on_start: bool = True
    pool_max_idle: float = Field(default=600.0, gt=0)
    orphan_grace: float = Field(default=60.0, ge=0)
    """A pod that never became ready (its creator died while waiting) is only reaped once this
    much older than the template's startup timeout."""
    fail_unschedulable: bool = True
    """Give up on a pod at once when the scheduler says it is unschedulable; ``False`` on
    clusters whose autoscaler adds nodes (the startup timeout still bounds the wait)."""
    retry_max_backoff: float = Field(default=30.0, gt=0)
    close_timeout: float = Field(default=60.0, gt=0)


@dataclass
class _Idle:
    sandbox: KubernetesSandbox
    born: float


class KubernetesProvider:
    """Creates `KubernetesSandbox` instances from one template (a `PooledProvider` and a
    `SharedProvider`).

    ``KubernetesProvider(template, api_client=client, pool_size=2)`` takes any
    `KubernetesProviderConfig` field as a keyword. The pool and the periodic sweep run in one
    background thread between `start` and `close` (or ``with provider:``); everything else
    works without it."""

    def __init__(
        self,
        template: KubernetesSandboxConfig | None = None,
        *,
        api_client: ApiClient | None = None,
        config: KubernetesProviderConfig | None = None,
        **options: Any,
    ) -> None:
        self.template = template or KubernetesSandboxConfig()
        self.api = core_api(api_client or load_api_client(self.template))
        if options:
            base = config.model_dump(exclude_unset=True) if config is not None else {}
            config = KubernetesProviderConfig.model_validate({**base, **options})
        self.config = config or KubernetesProviderConfig()
        self.id = uuid.uuid4().hex[:12]
        ttl = None if self.template.ttl is None else self.template.ttl + self.config.pool_max_idle
        self._pool_template = self.template.model_copy(
            update={"labels": {**self.template.labels, LABEL_POOL: self.id}, "ttl": ttl}
        )
        self._idle: deque[_Idle] = deque()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    # ------------------------------------------------------------------ the Provider protocol

    def create(self, options: CreateOptions | None = None) -> KubernetesSandbox:
        """A new pod, Running and Ready; the caller owns it (``with`` deletes it)."""
        options = options or CreateOptions()
        pod: Any = create_pod(
            self.api,
            self.template,
            labels=options.labels,
            env=options.env,
            ttl=options.ttl,
            expires_at=options.expires_at,
            fail_unschedulable=self.config.fail_unschedulable,
        )
        config = self.template.model_copy(update={"env": {**self.template.env, **options.env}})
        return KubernetesSandbox(pod.metadata.name, self.api, config)

    def attach(self, ref: str) -> KubernetesSandbox:
        """A handle on an existing pod of this owner, by name; `LookupError` if none."""
        from kubernetes.client.exceptions import ApiException

        try:
            pod = self.api.read_namespaced_pod(ref, self.template.namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise LookupError(f"no pod {ref!r} in namespace {self.template.namespace!r}") from exc
            raise
        env = {item.name: item.value or "" for item in (pod.spec.containers[0].env or [])} if pod.spec else {}
        return KubernetesSandbox(ref, self.api, self.template.model_copy(update={"env": env}), owned=False)

    def select(self, labels: Mapping[str, str]) -> list[SandboxRecord]:
        """This owner's pods carrying all of ``labels``, chosen by the API server's label
        selector; pooled pods and pods being deleted excepted."""
        selector = ",".join([owner_selector(self.template.owner), *(f"{k}={v}" for k, v in labels.items())])
        listed: Any = self.api.list_namespaced_pod(self.template.namespace, label_selector=selector)
        records = []
        for pod in listed.items:
            record = pod_record(pod)
            if LABEL_POOL in record.labels or pod.metadata.deletion_timestamp is not None:
                continue
            caller = {k: v for k, v in caller_labels(record.labels).items() if self.template.labels.get(k) != v}
            records.append(
                SandboxRecord(
                    id=record.name,
                    ref=record.name,
                    labels=caller,
                    created_at=record.created_at,
                    expires_at=record.expires_at,
                    running=record.running,
                    starting=not record.running and _phase(pod) in (None, "Pending", "Running"),
                )
            )
        return records

    def list(self) -> list[SandboxRecord]:
        """Every pod of this owner, pooled ones excepted (nobody holds them yet)."""
        return self.select({})

    def set_expiry(self, ref: str, expires_at: float) -> None:
        """Move the pod's expiry label (what every sweep reads) and its annotation; labels,
        unlike a container's, can change. `LookupError` if the pod is gone or being deleted."""
        from kubernetes.client.exceptions import ApiException

        patch = {
            "metadata": {
                "labels": {LABEL_EXPIRES: str(int(expires_at))},
                "annotations": pod_annotations(self.template, expires_at),
            }
        }
        try:
            pod: Any = self.api.patch_namespaced_pod(ref, self.template.namespace, patch)
        except ApiException as exc:
            if exc.status == 404:
                raise LookupError(f"no pod {ref!r} in namespace {self.template.namespace!r}") from exc
            raise
        if pod.metadata.deletion_timestamp is not None:  # gone, as `select` sees it
            raise LookupError(f"pod {ref!r} is being deleted")

    def destroy(self, ref: str) -> None:
        """Delete the pod and wait until it is gone; gone already is fine."""
        delete_pod(self.api, self.template.namespace, ref, grace_seconds=self.template.termination_grace_seconds)

    def sweep(self, now: float | None = None) -> Sweep:
        """Delete this owner's pods whose expiry passed, that died (the cluster's deadline,
        an eviction), that never became ready, or that a dead provider's pool left behind.
        Other owners' pods and this provider's idle pool are never touched."""
        now = time.time() if now is None else now
        report = Sweep()
        with self._lock:
            pooled = {entry.sandbox.name for entry in self._idle}
        listed: Any = self.api.list_namespaced_pod(
            self.template.namespace, label_selector=owner_selector(self.template.owner)
        )
        for pod in listed.items:
            name = pod.metadata.name
            if name in pooled or pod.metadata.deletion_timestamp is not None:
                continue
            why = self._reapable(pod, now)
            if why is None:
                continue
            try:
                why = self._reapable_now(name, now)  # the list ages while pods are deleted
                if why is None:
                    continue
                delete_pod(self.api, self.template.namespace, name, grace_seconds=0, wait=False)
            except Exception as exc:
                report.errors.append(f"pod {name} ({why}): {exc}")
            else:
                logger.info("sweep deleted pod %s: %s", name, why)
                report.removed.append(name)
        return report

    def _reapable_now(self, name: str, now: float) -> str | None:
        """`_reapable`, as the API server says now: another process may have moved its expiry
        (`set_expiry`) since the sweep's list. Gone, or being deleted: nothing to do."""
        from kubernetes.client.exceptions import ApiException

        try:
            pod: Any = self.api.read_namespaced_pod(name, self.template.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return None if pod.metadata.deletion_timestamp is not None else self._reapable(pod, now)

    def _reapable(self, pod: Any, now: float) -> str | None:
        record = pod_record(pod)
        age = now - record.created_at
        if record.expires_at is not None and record.expires_at < now:
            return "expired"
        phase = _phase(pod)
        if phase in ("Failed", "Succeeded"):
            return f"phase {phase}"
        if not record.running and age > self.template.startup_timeout + self.config.orphan_grace:
            return "never became ready"
        if (
            record.labels.get(LABEL_POOL) not in (None, self.id)
            and age > self.config.pool_max_idle + self.config.orphan_grace
        ):
            return "left in a dead provider's pool"
        return None

    # ------------------------------------------------------------------ the warm pool

    def acquire(self) -> KubernetesSandbox:
        """A ready pod with its exec helper up, from the pool; a cold `create` if the pool is
        empty. The caller owns it: ``with provider.acquire() as sandbox:`` deletes it."""
        while True:
            with self._lock:
                if self._closed:
                    raise RuntimeError(f"KubernetesProvider {self.id} is closed")
                entry = self._idle.popleft() if self._idle else None
            if entry is None:
                return self.create()
            self._wake.set()
            if time.monotonic() - entry.born <= self.config.pool_max_idle and _usable(entry.sandbox):
                try:
                    self._hand_out(entry.sandbox)
                    return entry.sandbox
                except Exception:
                    logger.warning("could not hand out pooled pod %s", entry.sandbox.name, exc_info=True)
            _discard(entry.sandbox)

    def _hand_out(self, sandbox: KubernetesSandbox) -> None:
        """Unmark it as pooled and let its ttl count from now (labels can change)."""
        expires_at = None if self.template.ttl is None else time.time() + self.template.ttl
        labels: dict[str, str | None] = {LABEL_POOL: None}
        if expires_at is not None:
            labels[LABEL_EXPIRES] = str(int(expires_at))
        patch = {"metadata": {"labels": labels, "annotations": pod_annotations(self.template, expires_at)}}
        self.api.patch_namespaced_pod(sandbox.name, self.template.namespace, patch)

    @property
    def idle(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(entry.sandbox.name for entry in self._idle)

    def wait_filled(self, timeout: float | None = None) -> bool:
        """Block until the pool holds ``pool_size`` pods; whether it did within ``timeout``."""
        with self._changed:
            return self._changed.wait_for(lambda: self._closed or len(self._idle) >= self.config.pool_size, timeout)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> KubernetesProvider:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"KubernetesProvider {self.id} is closed")
            if self._thread is not None:
                return self
        if self.config.sweep_on_start:
            _log_sweep(self.sweep())
        if self.config.pool_size or self.config.sweep_interval is not None:
            thread = threading.Thread(target=self._run, name=f"sandboxes-k8s-pool-{self.id}", daemon=True)
            with self._lock:
                self._thread = thread
            thread.start()
        return self

    def close(self) -> None:
        """Stop the background thread and delete the pods still idle in the pool. Handed-out
        sandboxes are their holders'. Idempotent."""
        with self._changed:
            self._closed = True
            idle = list(self._idle)
            self._idle.clear()
            self._changed.notify_all()
            thread, self._thread = self._thread, None
        self._stop.set()
        self._wake.set()
        for entry in idle:
            _discard(entry.sandbox)
        if thread is not None:
            thread.join(self.config.close_timeout)

    def __enter__(self) -> KubernetesProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ background thread

    def _run(self) -> None:
        interval = self.config.sweep_interval
        next_sweep = time.monotonic() + interval if interval is not None else None
        while not self._stop.is_set():
            self._wake.clear()
            try:
                if next_sweep is not None and interval is not None and time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + interval
                    _log_sweep(self.sweep())
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
                sleep=self._sleep,
                before_sleep=before_sleep_log(logger, logging.WARNING),
                reraise=True,
            )
            for attempt in retrying:
                with attempt:
                    self._add_one()

    def _sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _add_one(self) -> None:
        born = time.monotonic()
        pod: Any = create_pod(self.api, self._pool_template, fail_unschedulable=self.config.fail_unschedulable)
        sandbox = KubernetesSandbox(pod.metadata.name, self.api, self.template)
        try:
            warm = sandbox.execute("true")
            if warm.exit_code != 0:
                raise RuntimeError(f"warming pod {sandbox.name} failed: {warm.error or warm.exit_code} {warm.message}")
        except BaseException:
            _discard(sandbox)
            raise
        with self._changed:
            if not self._closed:
                self._idle.append(_Idle(sandbox, born))
                self._changed.notify_all()
                return
        _discard(sandbox)

    def _replace_stale(self) -> None:
        cutoff = time.monotonic() - self.config.pool_max_idle
        with self._lock:
            stale = [entry for entry in self._idle if entry.born < cutoff or not _usable(entry.sandbox)]
            for entry in stale:
                self._idle.remove(entry)
        for entry in stale:
            _discard(entry.sandbox)


def _phase(pod: Any) -> str | None:
    return pod.status.phase if pod.status is not None else None


def _usable(sandbox: KubernetesSandbox) -> bool:
    """Whether a pooled pod can be handed out: its exec stream is up (which proves the pod
    runs, for free), or it has no helper to keep up (an image without python3)."""
    return sandbox.helper_alive or sandbox._helper_unavailable


def _discard(sandbox: KubernetesSandbox) -> None:
    try:
        sandbox.close()
        delete_pod(sandbox.api, sandbox.config.namespace, sandbox.name, grace_seconds=0, wait=False)
    except Exception:
        logger.warning("could not delete pooled pod %s; a sweep will", sandbox.name, exc_info=True)


def _log_sweep(report: Sweep) -> None:
    if report.removed:
        logger.info("sweep deleted %d pods", len(report.removed))
    for error in report.errors:
        logger.warning("sweep could not delete %s", error)
