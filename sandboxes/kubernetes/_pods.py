"""Sandbox pods: the manifest with the secure defaults, creating one and waiting (by watch) until
it is Running and Ready, telling in the cluster's words why one cannot start, deleting one and
waiting until it is gone, and reading the labels that record ownership and expiry.

The one place `KubernetesSandbox` (``create``/``destroy``) and `KubernetesProvider` (pools and
sweeps) go through, so the import graph runs one way: config < pods < exec < sandbox < provider."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sandboxes.kubernetes.config import (
    ANNOTATION_EXPIRES,
    COMPONENT,
    LABEL_COMPONENT,
    LABEL_EXPIRES,
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_SANDBOX,
    MANAGED_BY,
    KubernetesSandboxConfig,
    parse_quantity,
)
from sandboxes.lifecycle import SandboxNameTaken, SandboxStartError, label_expiry

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, CoreV1Api

logger = logging.getLogger(__name__)

CONTAINER = "sandbox"
"""The name of the pod's one container, which exec addresses."""

_FATAL_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "CrashLoopBackOff",
    }
)
"""Waiting reasons of a container that will not start by itself (the kubelet backs off and
retries an image pull, but a sandbox request should not wait minutes on a typo)."""

_GONE_GRACE = 30.0
"""Seconds past the grace period `delete_pod` waits for the pod to disappear."""


class PodStartError(SandboxStartError):
    """A sandbox pod could not start; ``reason`` and ``message`` are the cluster's own words."""

    def __init__(self, pod: str, reason: str, message: str) -> None:
        super().__init__(
            f"pod {pod} cannot start: {reason}: {message}" if message else f"pod {pod} cannot start: {reason}",
            reason=reason,
        )
        self.pod = pod
        self.message = message


# ---------------------------------------------------------------------- the cluster


API_CONNECTIONS = 64
"""Connections an API client keeps for reuse: as many as the service's default
``worker_threads`` may use at once. The client's own default (5 per CPU, 10 on a 2-core node)
made a busy service discard a connection after nearly every call and open a new TLS one."""


def load_api_client(config: KubernetesSandboxConfig) -> ApiClient:
    """An API client from the pod's service account (in-cluster) or a kubeconfig, keeping
    `API_CONNECTIONS` connections."""
    from kubernetes import client
    from kubernetes import config as kube_config

    in_cluster = config.in_cluster
    if in_cluster is None:
        in_cluster = config.kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ
    configuration = client.Configuration()
    if in_cluster:
        kube_config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
    else:
        kube_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=config.kubeconfig, context=config.context, client_configuration=configuration
        )
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, API_CONNECTIONS)
    return client.ApiClient(configuration)


def core_api(api_client: ApiClient) -> CoreV1Api:
    from kubernetes import client

    return client.CoreV1Api(api_client)


# ---------------------------------------------------------------------- the manifest


def new_pod_name(name: str | None = None) -> str:
    """``sandbox-<name>`` (`CreateOptions.name`), else ``sandbox-<fresh id>``."""
    return f"sandbox-{name or uuid.uuid4().hex[:16]}"


def expiry(config: KubernetesSandboxConfig, ttl: float | None, now: float) -> float | None:
    ttl = config.ttl if ttl is None else ttl
    return None if ttl is None else now + ttl


def pod_labels(
    config: KubernetesSandboxConfig, name: str, expires_at: float | None, extra: Mapping[str, str] = {}
) -> dict[str, str]:
    """The caller's labels, then ours, which win: a template or a tenant cannot pose as another
    owner or move its own expiry."""
    labels = {**config.labels, **extra, LABEL_MANAGED: MANAGED_BY, LABEL_COMPONENT: COMPONENT}
    labels.update({LABEL_OWNER: config.owner, LABEL_SANDBOX: name})
    if expires_at is not None:
        labels[LABEL_EXPIRES] = str(int(expires_at))
    return labels


def pod_annotations(config: KubernetesSandboxConfig, expires_at: float | None) -> dict[str, str]:
    annotations = dict(config.annotations)
    if expires_at is not None:
        annotations[ANNOTATION_EXPIRES] = datetime.fromtimestamp(int(expires_at), UTC).isoformat()
    return annotations


def pod_manifest(
    config: KubernetesSandboxConfig,
    name: str,
    *,
    labels: Mapping[str, str] = {},
    env: Mapping[str, str] = {},
    ttl: float | None = None,
    expires_at: float | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The pod of one sandbox, secure by default: non-root uid/gid, no privilege escalation, no
    capabilities, the runtime's seccomp profile, a read-only root with size-limited ``emptyDir``
    for the workspace and ``/tmp``, no service-account token, no service links, no host
    namespaces, a short grace period, and ``activeDeadlineSeconds`` from the TTL so the cluster
    kills an expired pod even when no provider is alive to sweep it. An ``expires_at`` instead
    of a ttl is only recorded (labels, annotation): it may be moved later, which a deadline
    cannot (`KubernetesProvider.set_expiry`)."""
    now = time.time() if now is None else now
    ttl = None if expires_at is not None else config.ttl if ttl is None else ttl
    if expires_at is None and ttl is not None:
        expires_at = now + ttl
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        # The pause container becomes PID 1 and reaps orphans: without it ``sleep infinity``
        # is PID 1 and never waits, so what a per-command exec leaves behind stays a zombie.
        "shareProcessNamespace": True,
        "terminationGracePeriodSeconds": config.termination_grace_seconds,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": config.uid,
            "runAsGroup": config.gid,
            "fsGroup": config.gid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(config, env)],
        "volumes": [
            {"name": "workspace", "emptyDir": _empty_dir(config, config.workspace_size)},
            {"name": "tmp", "emptyDir": _empty_dir(config, config.tmp_size)},
            *(
                {"name": f"volume-{i}", "persistentVolumeClaim": {"claimName": m.volume, "readOnly": m.read_only}}
                for i, m in enumerate(config.mounts)
            ),
        ],
    }
    if ttl is not None:
        spec["activeDeadlineSeconds"] = max(1, int(ttl))
    if config.runtime_class_name is not None:
        spec["runtimeClassName"] = config.runtime_class_name
    if config.node_selector:
        spec["nodeSelector"] = dict(config.node_selector)
    if config.tolerations:
        spec["tolerations"] = [toleration.to_api() for toleration in config.tolerations]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": config.namespace,
            "labels": pod_labels(config, name, expires_at, labels),
            "annotations": pod_annotations(config, expires_at),
        },
        "spec": spec,
    }


def _container(config: KubernetesSandboxConfig, env: Mapping[str, str]) -> dict[str, Any]:
    environment = {**config.env, **env}
    return {
        "name": CONTAINER,
        "image": config.image,
        "imagePullPolicy": config.image_pull_policy,
        "command": list(config.command),
        "workingDir": config.workdir,
        "env": [{"name": key, "value": value} for key, value in environment.items()],
        "stdin": False,
        "tty": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": config.uid,
            "runAsGroup": config.gid,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "resources": _resources(config),
        "volumeMounts": [
            {"name": "workspace", "mountPath": config.workdir},
            {"name": "tmp", "mountPath": "/tmp"},
            *(
                {"name": f"volume-{i}", "mountPath": m.path, "readOnly": m.read_only}
                for i, m in enumerate(config.mounts)
            ),
        ],
    }


def _empty_dir(config: KubernetesSandboxConfig, size: str) -> dict[str, str]:
    volume = {"sizeLimit": size}
    if config.memory_backed:
        volume["medium"] = "Memory"
    return volume


def _resources(config: KubernetesSandboxConfig) -> dict[str, dict[str, str]]:
    """Requests and limits. A memory-backed workspace and ``/tmp`` are charged to the container's
    memory cgroup, so its limit is ``memory_limit`` plus their sizes: a full workspace answers
    ``no_space``, not the out-of-memory killer. A request above its limit is lowered to the
    limit: the API server refuses such a pod, and a small template (``cpus: 0.05``) under the
    default requests would otherwise make no sandbox at all."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if config.cpu_limit is not None:
        limits["cpu"] = config.cpu_limit
    if config.memory_limit is not None:
        memory = parse_quantity(config.memory_limit)
        if config.memory_backed:
            memory += parse_quantity(config.workspace_size) + parse_quantity(config.tmp_size)
        limits["memory"] = str(int(memory))
    for resource, request in (("cpu", config.cpu_request), ("memory", config.memory_request)):
        if request is not None:
            limit = limits.get(resource)
            capped = limit is not None and parse_quantity(request) > parse_quantity(limit)
            requests[resource] = limit if capped and limit is not None else request
    return {"requests": requests, "limits": limits}


# ---------------------------------------------------------------------- why a pod does not start


def is_ready(pod: Any) -> bool:
    status = pod.status
    if status is None or status.phase != "Running":
        return False
    return any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])


def start_failure(pod: Any, *, fail_unschedulable: bool = True) -> tuple[str, str] | None:
    """``(reason, message)`` when the pod will not become ready by itself, in the cluster's
    words (``ErrImagePull``, ``Unschedulable``, ``OOMKilled``, ``Evicted``,
    ``CrashLoopBackOff``, ``DeadlineExceeded``...); ``None`` while it may still.

    ``fail_unschedulable=False`` keeps waiting on an unschedulable pod, for clusters whose
    autoscaler adds nodes."""
    status = pod.status
    if status is None:
        return None
    if pod.metadata is not None and pod.metadata.deletion_timestamp is not None:
        return "Deleted", "the pod is being deleted"
    if status.phase == "Failed" and status.reason:
        # The node ended the whole pod (Evicted, DeadlineExceeded): its reason says why; the
        # container's end (exit code 137, Error) only says that it was killed.
        return status.reason, status.message or "the pod's phase is Failed"
    for container in status.container_statuses or []:
        state = container.state
        if state is not None and state.waiting is not None and state.waiting.reason in _FATAL_WAITING:
            return state.waiting.reason, state.waiting.message or ""
        for terminated in (state.terminated if state else None, _last_terminated(container)):
            if terminated is not None:
                return _terminated(terminated)
    if status.phase in ("Failed", "Succeeded"):
        reason = status.reason or ("Completed" if status.phase == "Succeeded" else "Failed")
        return reason, status.message or f"the pod's phase is {status.phase}"
    if fail_unschedulable:
        for condition in status.conditions or []:
            if condition.type == "PodScheduled" and condition.status == "False" and condition.reason == "Unschedulable":
                return "Unschedulable", condition.message or ""
    return None


def pending_reason(pod: Any | None) -> str:
    """What a pod that is not ready yet is waiting for, for a timeout's message."""
    if pod is None or pod.status is None:
        return "no status yet"
    status = pod.status
    parts = [f"phase {status.phase}"]
    for condition in status.conditions or []:
        if condition.status != "True" and (condition.reason or condition.message):
            parts.append(f"{condition.type}: {condition.reason or ''} {condition.message or ''}".strip())
    for container in status.container_statuses or []:
        waiting = container.state.waiting if container.state is not None else None
        if waiting is not None:
            parts.append(f"container {waiting.reason or 'waiting'}: {waiting.message or ''}".strip())
    return "; ".join(parts)


def _last_terminated(container: Any) -> Any:
    return container.last_state.terminated if container.last_state is not None else None


def _terminated(terminated: Any) -> tuple[str, str]:
    reason = terminated.reason or "Terminated"
    detail = f"exit code {terminated.exit_code}"
    if terminated.message:
        detail += f": {terminated.message}"
    return reason, detail


# ---------------------------------------------------------------------- create, wait, delete


def create_pod(
    api: CoreV1Api,
    config: KubernetesSandboxConfig,
    *,
    labels: Mapping[str, str] = {},
    env: Mapping[str, str] = {},
    ttl: float | None = None,
    expires_at: float | None = None,
    fail_unschedulable: bool = True,
    name_hint: str | None = None,
) -> Any:
    """Create a sandbox pod and wait until it is Running and Ready. A pod that cannot start (or
    not within ``config.startup_timeout``) is deleted, and `PodStartError` says why. A
    ``name_hint`` the API server already has a pod of is `SandboxNameTaken`."""
    from kubernetes.client.exceptions import ApiException

    name = new_pod_name(name_hint)
    body: Any = pod_manifest(config, name, labels=labels, env=env, ttl=ttl, expires_at=expires_at)
    try:
        api.create_namespaced_pod(config.namespace, body)
    except ApiException as exc:
        if name_hint is not None and exc.status == 409:
            raise SandboxNameTaken(f"a pod named {name!r} exists") from exc
        raise
    try:
        return wait_ready(api, config.namespace, name, config.startup_timeout, fail_unschedulable=fail_unschedulable)
    except BaseException:
        try:
            delete_pod(api, config.namespace, name, grace_seconds=0, wait=False)
        except Exception:
            logger.warning("could not delete pod %s that failed to start; a sweep will", name, exc_info=True)
        raise


def wait_ready(api: CoreV1Api, namespace: str, name: str, timeout: float, *, fail_unschedulable: bool = True) -> Any:
    """The pod once Running and Ready, watched (one list for the state and a resourceVersion,
    then a watch from it: no event is missed and nothing polls). `PodStartError` if it cannot
    start, `TimeoutError` (saying what it still waits for) past ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any | None = None
    for pod in _watch_pod(api, namespace, name, deadline):
        if pod is None:
            raise PodStartError(name, "Deleted", "the pod was deleted while starting")
        last = pod
        if is_ready(pod):
            return pod
        failure = start_failure(pod, fail_unschedulable=fail_unschedulable)
        if failure is not None:
            raise PodStartError(name, *failure)
    raise TimeoutError(f"pod {name} not ready within {timeout:g}s ({pending_reason(last)})")


def delete_pod(
    api: CoreV1Api, namespace: str, name: str, *, grace_seconds: int | None = None, wait: bool = True
) -> None:
    """Delete the pod; gone already is fine. With ``wait``, return only once it is gone
    (watched), or raise `TimeoutError` saying what holds it (finalizers, a node not answering)."""
    from kubernetes.client.exceptions import ApiException

    try:
        pod = api.delete_namespaced_pod(name, namespace, grace_period_seconds=grace_seconds)
    except ApiException as exc:
        if exc.status == 404:
            return
        raise
    if not wait:
        return
    grace = grace_seconds if grace_seconds is not None else _grace_of(pod)
    deadline = time.monotonic() + grace + _GONE_GRACE
    last: Any = None
    for seen in _watch_pod(api, namespace, name, deadline):
        if seen is None:
            return
        last = seen
    finalizers = list(getattr(getattr(last, "metadata", None), "finalizers", None) or [])
    held = f"finalizers {finalizers}" if finalizers else "the kubelet has not confirmed it stopped"
    raise TimeoutError(f"pod {name} still exists {grace + _GONE_GRACE:g}s after its deletion: {held}")


def _grace_of(pod: Any) -> int:
    spec = getattr(pod, "spec", None)
    grace = getattr(spec, "termination_grace_period_seconds", None)
    return int(grace) if isinstance(grace, int) else 30


def _watch_pod(api: CoreV1Api, namespace: str, name: str, deadline: float) -> Iterator[Any | None]:
    """The pod's successive states until ``deadline``; ``None`` once it is gone (then stops).

    Selected by name (``metadata.name`` field selector, which every API server supports for
    pods, so a pod attached by name without our labels is watched too); the name is checked
    here as well, for a server that ignores field selectors."""
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    selector = f"metadata.name={name}"
    while True:
        listed: Any = api.list_namespaced_pod(namespace, field_selector=selector)
        pods = [pod for pod in listed.items if pod.metadata.name == name]
        if not pods:
            yield None
            return
        yield pods[0]
        version = listed.metadata.resource_version
        while (remaining := deadline - time.monotonic()) > 0:
            watcher: Any = watch.Watch()  # type: ignore[no-untyped-call]
            try:
                for event in watcher.stream(
                    api.list_namespaced_pod,
                    namespace,
                    field_selector=selector,
                    resource_version=version,
                    timeout_seconds=max(1, int(remaining)),
                    _request_timeout=remaining + 5,
                ):
                    pod = event["object"]
                    if event["type"] == "ERROR" or getattr(pod, "metadata", None) is None:
                        break
                    version = pod.metadata.resource_version
                    if pod.metadata.name != name:
                        continue
                    if event["type"] == "DELETED":
                        yield None
                        return
                    yield pod
                    if time.monotonic() >= deadline:
                        return
            except ApiException as exc:
                if exc.status != 410:  # Gone: our resourceVersion is too old; list again
                    raise
                break
            except Exception as exc:  # a read timeout: the deadline decides
                if time.monotonic() >= deadline:
                    return
                logger.debug("watch of pod %s interrupted (%s); watching again", name, exc)
            finally:
                watcher.stop()
        else:
            return


# ---------------------------------------------------------------------- the records


@dataclass(frozen=True, slots=True)
class PodRecord:
    name: str
    labels: dict[str, str]
    created_at: float
    expires_at: float | None
    running: bool


def owner_selector(owner: str) -> str:
    return f"{LABEL_MANAGED}={MANAGED_BY},{LABEL_OWNER}={owner}"


def pod_record(pod: Any) -> PodRecord:
    labels = dict(pod.metadata.labels or {})
    created = pod.metadata.creation_timestamp
    return PodRecord(
        name=pod.metadata.name,
        labels=labels,
        created_at=created.timestamp() if isinstance(created, datetime) else 0.0,
        expires_at=label_expiry(labels, LABEL_EXPIRES, logger),
        running=is_ready(pod),
    )


def caller_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels a caller gave (`CreateOptions.labels`), without the ones we keep."""
    ours = {LABEL_MANAGED, LABEL_COMPONENT, LABEL_OWNER, LABEL_SANDBOX, LABEL_EXPIRES}
    return {key: value for key, value in labels.items() if key not in ours and not key.startswith("io.sandboxes.pool")}
