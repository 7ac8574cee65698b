"""Tenants' volumes on Kubernetes (`sandboxes.lifecycle.VolumeProvider`): one
PersistentVolumeClaim each (``ReadWriteMany``, the size asked, the template's storage class
when it names one), labelled as the provider's pods are (managed-by, owner), mounted into pods
by claim name (`sandboxes.kubernetes._pods.pod_manifest`), where the pod's ``fsGroup`` gives
the sandbox's group the files. A claim a pod of this owner still mounts is not deleted
(`VolumeInUse`): the cluster itself would only defer the deletion."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from sandboxes.kubernetes.config import LABEL_MANAGED, LABEL_OWNER, MANAGED_BY, KubernetesSandboxConfig, is_label_value
from sandboxes.lifecycle import VolumeInUse

__all__ = ["CLAIM_PREFIX", "claim_name", "create_claim", "delete_claim"]

CLAIM_PREFIX = "sandboxes-vol-"


def claim_name(name: str) -> str:
    """A claim's name for a volume's (a DNS label: lowercase, digits, ``-``; 63 at most)."""
    return CLAIM_PREFIX + hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]


def create_claim(api: Any, config: KubernetesSandboxConfig, name: str, labels: Mapping[str, str], size: int) -> str:
    """The claim of volume ``name``, made if missing; its name."""
    from kubernetes.client.exceptions import ApiException

    claim = claim_name(name)
    mine = {key: value for key, value in labels.items() if is_label_value(value)}
    mine.update({LABEL_MANAGED: MANAGED_BY, LABEL_OWNER: config.owner})
    spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": str(size)}}}
    if config.storage_class is not None:
        spec["storageClassName"] = config.storage_class
    body: Any = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim, "labels": mine}}
    body["spec"] = spec
    try:
        api.create_namespaced_persistent_volume_claim(config.namespace, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        existing: Any = api.read_namespaced_persistent_volume_claim(claim, config.namespace)
        if (existing.metadata.labels or {}).get(LABEL_OWNER) != config.owner:
            raise RuntimeError(f"claim {claim!r} exists and is not this owner's") from exc
    return claim


def delete_claim(api: Any, config: KubernetesSandboxConfig, claim: str) -> None:
    """Delete this owner's claim; gone is fine; `VolumeInUse` while a pod of this owner mounts it."""
    from kubernetes.client.exceptions import ApiException

    selector = f"{LABEL_MANAGED}={MANAGED_BY},{LABEL_OWNER}={config.owner}"
    pods: Any = api.list_namespaced_pod(config.namespace, label_selector=selector)
    for pod in pods.items:
        claims = [v.persistent_volume_claim.claim_name for v in pod.spec.volumes or [] if v.persistent_volume_claim]
        if claim in claims and (pod.status.phase or "") not in ("Succeeded", "Failed"):
            raise VolumeInUse(f"claim {claim!r} is mounted by pod {pod.metadata.name}")
    try:
        existing: Any = api.read_namespaced_persistent_volume_claim(claim, config.namespace)
    except ApiException as exc:
        if exc.status == 404:
            return
        raise
    if (existing.metadata.labels or {}).get(LABEL_OWNER) != config.owner:
        raise LookupError(f"claim {claim!r} is not this owner's")
    try:
        api.delete_namespaced_persistent_volume_claim(claim, config.namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise
