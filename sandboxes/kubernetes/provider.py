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
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import Field

from sandboxes._pool import PoolConfig, WarmPool
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
from sandboxes.kubernetes._volumes import create_claim, delete_claim
from sandboxes.kubernetes.config import ANNOTATION_NETWORK, LABEL_EXPIRES, LABEL_POOL, KubernetesSandboxConfig
from sandboxes.kubernetes.sandbox import KubernetesSandbox
from sandboxes.lifecycle import (
    FINAL_EXPIRY,
    NETWORK_RECORD_LIMIT,
    CreateOptions,
    SandboxRecord,
    Sweep,
    label_expiry,
)

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

logger = logging.getLogger(__name__)


class KubernetesProviderConfig(PoolConfig):
    """How a provider pools and sweeps (`PoolConfig`), and what it tolerates while pods start."""

    orphan_grace: float = Field(default=60.0, ge=0)
    """A pod that never became ready (its creator died while waiting) is only reaped once this
    much older than the template's startup timeout."""
    fail_unschedulable: bool = True
    """Give up on a pod at once when the scheduler says it is unschedulable; ``False`` on
    clusters whose autoscaler adds nodes (the startup timeout still bounds the wait)."""


class KubernetesProvider(WarmPool[KubernetesSandbox]):
    """Creates `KubernetesSandbox` instances from one template (a `PooledProvider`, a
    `SharedProvider` and a `RecordsNetwork`: a pod's annotation holds its network).

    ``KubernetesProvider(template, api_client=client, pool_size=2)`` takes any
    `KubernetesProviderConfig` field as a keyword. The pool and the periodic sweep run in one
    background thread between `start` and `close` (or ``with provider:``); everything else
    works without it."""

    config: KubernetesProviderConfig

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
        super().__init__(config or KubernetesProviderConfig())
        ttl = None if self.template.ttl is None else self.template.ttl + self.config.pool_max_idle
        self._pool_template = self.template.model_copy(
            update={"labels": {**self.template.labels, LABEL_POOL: self.id}, "ttl": ttl}
        )

    # ------------------------------------------------------------------ the Provider protocol

    def create(self, options: CreateOptions | None = None) -> KubernetesSandbox:
        """A new pod, Running and Ready; the caller owns it (``with`` deletes it)."""
        options = options or CreateOptions()
        template = self.template.model_copy(update={"mounts": options.mounts}) if options.mounts else self.template
        pod: Any = create_pod(
            self.api,
            template,
            labels=options.labels,
            env=options.env,
            ttl=options.ttl,
            expires_at=options.expires_at,
            fail_unschedulable=self.config.fail_unschedulable,
            name_hint=options.name,
        )
        config = template.model_copy(update={"env": {**self.template.env, **options.env}})
        return KubernetesSandbox(pod.metadata.name, self.api, config)

    def create_volume(self, name: str, labels: Mapping[str, str], size: int) -> str:
        """`sandboxes.lifecycle.VolumeProvider`: a PersistentVolumeClaim (`sandboxes.kubernetes._volumes`)."""
        return create_claim(self.api, self.template, name, labels, size)

    def remove_volume(self, ref: str) -> None:
        delete_claim(self.api, self.template, ref)

    def check_ready(self) -> None:
        """Ready whenever configured: a create that the API refuses says why."""

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
                    network=(pod.metadata.annotations or {}).get(ANNOTATION_NETWORK),
                )
            )
        return records

    def list(self) -> list[SandboxRecord]:
        """Every pod of this owner, pooled ones excepted (nobody holds them yet)."""
        return self.select({})

    def set_expiry(self, ref: str, expires_at: float) -> None:
        """Move the pod's expiry label (what every sweep reads) and its annotation; labels,
        unlike a container's, can change. A final expiry (`FINAL_EXPIRY`) stays: the patch is
        made on the version of the pod read before it (``resourceVersion``), so no other
        process's change lands between. `LookupError` if the pod is gone, being deleted, or its
        expiry is final."""

        def patch(pod: Any) -> dict[str, Any]:
            _refuse_to_move(pod, expires_at)
            return _expiry_patch(self.template, pod, expires_at)

        self._patch_read(ref, patch, "its expiry")

    def set_network(self, ref: str, change: Callable[[str | None], str]) -> None:
        """`sandboxes.lifecycle.RecordsNetwork`: what ``change`` makes of the pod's network
        annotation (`ANNOTATION_NETWORK`) as last read, patched on that version of the pod
        (``resourceVersion``), as `set_expiry` is: a 409 reads it and calls ``change`` again.
        `ValueError` beyond `NETWORK_RECORD_LIMIT`; `LookupError` if the pod is gone, being
        deleted or recorded deleted."""

        def patch(pod: Any) -> dict[str, Any]:
            _refuse_to_move(pod, FINAL_EXPIRY + 1)  # a pod recorded deleted takes no change
            data = change((pod.metadata.annotations or {}).get(ANNOTATION_NETWORK))
            if len(data) > NETWORK_RECORD_LIMIT:
                raise ValueError(f"a network record of {len(data)} characters, the most is {NETWORK_RECORD_LIMIT}")
            version = pod.metadata.resource_version
            return {"metadata": {"resourceVersion": version, "annotations": {ANNOTATION_NETWORK: data}}}

        self._patch_read(ref, patch, "its network")

    def _patch_read(self, ref: str, make: Callable[[Any], dict[str, Any]], what: str) -> None:
        """Patch the pod ``ref`` with what ``make`` says of the version just read; a 409 (it
        changed since) reads it again. `LookupError` if it is gone or being deleted."""
        from kubernetes.client.exceptions import ApiException

        for _ in range(_PATCH_ATTEMPTS):
            try:
                pod: Any = self.api.read_namespaced_pod(ref, self.template.namespace)
                pod = self.api.patch_namespaced_pod(ref, self.template.namespace, make(pod))
            except ApiException as exc:
                if exc.status == 404:
                    raise LookupError(f"no pod {ref!r} in namespace {self.template.namespace!r}") from exc
                if exc.status == 409:  # changed since the read: read it again
                    continue
                raise
            if pod.metadata.deletion_timestamp is not None:  # gone, as `select` sees it
                raise LookupError(f"pod {ref!r} is being deleted")
            return
        raise RuntimeError(f"pod {ref!r} kept changing: {what} was not recorded")

    def destroy(self, ref: str) -> None:
        """Delete the pod and wait until it is gone; gone already is fine."""
        delete_pod(self.api, self.template.namespace, ref, grace_seconds=self.template.termination_grace_seconds)

    def sweep(self, now: float | None = None) -> Sweep:
        """Delete this owner's pods whose expiry passed, that died (the cluster's deadline,
        an eviction), that never became ready, or that a dead provider's pool left behind.
        Other owners' pods and this provider's idle pool are never touched."""
        now = time.time() if now is None else now
        report = Sweep()
        pooled = self._pooled_refs()
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

    def _hand_out(self, sandbox: KubernetesSandbox) -> None:
        """Unmark it as pooled and let its ttl count from now (labels can change)."""
        expires_at = None if self.template.ttl is None else time.time() + self.template.ttl
        labels: dict[str, str | None] = {LABEL_POOL: None}
        if expires_at is not None:
            labels[LABEL_EXPIRES] = str(int(expires_at))
        patch = {"metadata": {"labels": labels, "annotations": pod_annotations(self.template, expires_at)}}
        self.api.patch_namespaced_pod(sandbox.name, self.template.namespace, patch)

    def _make_pooled(self) -> KubernetesSandbox:
        pod: Any = create_pod(self.api, self._pool_template, fail_unschedulable=self.config.fail_unschedulable)
        return KubernetesSandbox(pod.metadata.name, self.api, self.template)

    def _ref(self, sandbox: KubernetesSandbox) -> str:
        return sandbox.name

    def _usable(self, sandbox: KubernetesSandbox) -> bool:
        """Its exec stream is up (which proves the pod runs, for free), or it has no helper to
        keep up (an image without python3)."""
        return sandbox.helper_alive or sandbox.helper_driver.starts.unavailable

    def _stale(self, sandbox: KubernetesSandbox) -> bool:
        return not self._usable(sandbox)

    def _discard(self, sandbox: KubernetesSandbox) -> None:
        try:
            sandbox.close()
            delete_pod(sandbox.api, sandbox.config.namespace, sandbox.name, grace_seconds=0, wait=False)
        except Exception:
            logger.warning("could not delete pooled pod %s; a sweep will", sandbox.name, exc_info=True)


def _phase(pod: Any) -> str | None:
    return pod.status.phase if pod.status is not None else None


_PATCH_ATTEMPTS = 5
"""Reads and patches of a pod's expiry or network while other processes keep changing it (409s)."""


def _refuse_to_move(pod: Any, expires_at: float) -> None:
    """`LookupError` if ``pod`` is being deleted or its expiry is final (`FINAL_EXPIRY`) and
    ``expires_at`` is not."""
    if pod.metadata.deletion_timestamp is not None:
        raise LookupError(f"pod {pod.metadata.name!r} is being deleted")
    recorded = label_expiry(pod.metadata.labels or {}, LABEL_EXPIRES, logger)
    if recorded is not None and recorded <= FINAL_EXPIRY < expires_at:
        raise LookupError(f"pod {pod.metadata.name!r} is recorded deleted: its expiry is final")


def _expiry_patch(template: KubernetesSandboxConfig, pod: Any, expires_at: float) -> dict[str, Any]:
    """The merge patch of the pod's expiry, valid only on the version read (``resourceVersion``:
    the API server answers 409 to it once the pod has changed)."""
    return {
        "metadata": {
            "resourceVersion": pod.metadata.resource_version,
            "labels": {LABEL_EXPIRES: str(int(expires_at))},
            "annotations": pod_annotations(template, expires_at),
        }
    }
