"""`KubernetesSandboxConfig`: what a sandbox pod is made from, how to reach the cluster, and the
labels that record ownership and expiry on the pod itself (the cluster is the record).

Kept apart from the sandbox and the provider, which both need it, so neither imports the other."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sandboxes._output import DEFAULT_OUTPUT_LIMIT
from sandboxes.lifecycle import Mount

__all__ = [
    "ANNOTATION_EXPIRES",
    "ANNOTATION_NETWORK",
    "COMPONENT",
    "LABEL_COMPONENT",
    "LABEL_EXPIRES",
    "LABEL_MANAGED",
    "LABEL_OWNER",
    "LABEL_POOL",
    "LABEL_SANDBOX",
    "MANAGED_BY",
    "KubernetesSandboxConfig",
    "Toleration",
    "is_label_value",
    "parse_quantity",
]

LABEL_MANAGED = "app.kubernetes.io/managed-by"
MANAGED_BY = "sandboxes"
LABEL_COMPONENT = "app.kubernetes.io/component"
COMPONENT = "sandbox"
"""With `LABEL_MANAGED`, what the Helm chart's NetworkPolicy selects sandbox pods by (no ingress,
no egress): every pod carries both, whatever the template's labels say."""
LABEL_OWNER = "io.sandboxes.owner"
LABEL_SANDBOX = "io.sandboxes.sandbox-id"
LABEL_EXPIRES = "io.sandboxes.expires-at"
"""Unix seconds, as a label so a sweep can read it from a list (label values are strings of at
most 63 characters: an integer fits)."""
ANNOTATION_EXPIRES = "io.sandboxes.expires-at"
"""The same instant in RFC 3339, for people reading ``kubectl describe``."""
ANNOTATION_NETWORK = "io.sandboxes.network"
"""What `KubernetesProvider.set_network` recorded (its caller's text: the service's JSON of the
sandbox's network), read back with the pod's record (`sandboxes.lifecycle.SandboxRecord.network`)."""
LABEL_POOL = "io.sandboxes.pool"
"""Id of the provider whose warm pool made the pod; removed when the pod is handed out."""

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def is_label_value(value: str) -> bool:
    """Whether ``value`` may be a label's value (63 characters at most, ``[A-Za-z0-9._-]``,
    starting and ending alphanumeric, or empty)."""
    return _LABEL_VALUE.match(value) is not None


def parse_quantity(value: str) -> float:
    """A Kubernetes quantity (``512Mi``, ``1``, ``250m``) as a number; ValueError otherwise.
    The client's own parser, behind a stricter shape check (it accepts exponents we never use)."""
    from kubernetes.utils.quantity import parse_quantity as parse

    if not _QUANTITY.match(value):
        raise ValueError(f"not a Kubernetes quantity: {value!r} (e.g. 512Mi, 1Gi, 500m)")
    return float(parse(value))  # type: ignore[no-untyped-call]


class Toleration(BaseModel):
    """One pod toleration, as the API spells it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None

    def to_api(self) -> dict[str, Any]:
        body = {
            "key": self.key,
            "operator": self.operator,
            "value": self.value,
            "effect": self.effect,
            "tolerationSeconds": self.toleration_seconds,
        }
        return {name: value for name, value in body.items() if value is not None}


class KubernetesSandboxConfig(BaseModel):
    """A sandbox template. The defaults are the secure ones; loosen them deliberately."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # ------------------------------------------------------------------ the cluster
    namespace: str = "sandboxes"
    kubeconfig: str | None = None
    """Path of a kubeconfig; ``None``: ``$KUBECONFIG`` or ``~/.kube/config``."""
    context: str | None = None
    in_cluster: bool | None = None
    """Use the pod's service account (``load_incluster_config``). ``None``: when running in a
    pod (``KUBERNETES_SERVICE_HOST`` is set) and no ``kubeconfig`` is given."""

    # ------------------------------------------------------------------ the pod
    image: str = "sandboxes/runtime:latest"
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    command: tuple[str, ...] = ("sleep", "infinity")
    """What the pod's container runs: anything that stays up. Commands arrive over exec."""
    cpu_request: str | None = "100m"
    cpu_limit: str | None = "1"
    memory_request: str | None = "128Mi"
    memory_limit: str | None = "512Mi"
    """For the sandbox's processes. A memory-backed workspace and ``/tmp`` are charged to the
    container too, so the container's limit is this plus their sizes (see `sandboxes.kubernetes._pods`)."""
    runtime_class_name: str | None = None
    """``gvisor``, ``kata`` where the cluster has them: a kernel between the sandbox and the node."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    workdir: str = "/workspace"
    workspace_size: str = "1Gi"
    """``sizeLimit`` of the workspace ``emptyDir``."""
    tmp_size: str = "256Mi"
    """``sizeLimit`` of the ``/tmp`` ``emptyDir``."""
    storage_class: str | None = None
    """The ``storageClassName`` of volumes' claims (`sandboxes.kubernetes._volumes`); ``None``:
    the cluster's default. It must offer ``ReadWriteMany`` for two pods to share a volume."""
    mounts: tuple[Mount, ...] = ()
    """Volumes' claims (`Mount.volume`: a claim's name) mounted in the pod."""
    memory_backed: bool = True
    """Workspace and ``/tmp`` as tmpfs (``medium: Memory``): a write past the size fails with
    ENOSPC (``no_space``), as in the Docker backend. On disk, the kubelet would instead evict
    the whole pod once the limit is passed."""
    uid: int = Field(default=1000, gt=0)
    gid: int = Field(default=1000, gt=0)
    termination_grace_seconds: int = Field(default=1, ge=0)

    # ------------------------------------------------------------------ lifetime and ownership
    ttl: float | None = Field(default=3600.0, gt=0)
    """Seconds until a sweep may reap the pod; also its ``activeDeadlineSeconds``, so the
    cluster kills an expired pod even when no provider is alive. ``None``: never."""
    owner: str = "sandboxes"
    """Label value telling who created the pod, so sweeps only reap their own."""

    # ------------------------------------------------------------------ commands
    default_timeout: float = Field(default=120.0, ge=0)
    output_limit: int = Field(default=DEFAULT_OUTPUT_LIMIT, gt=0)
    startup_timeout: float = Field(default=120.0, gt=0)
    """Seconds `create` waits for the pod to be Running and Ready before deleting it."""
    use_exec_helper: bool = True

    @field_validator("cpu_request", "cpu_limit", "memory_request", "memory_limit", "workspace_size", "tmp_size")
    @classmethod
    def _quantity_parses(cls, value: str | None) -> str | None:
        if value is not None:
            parse_quantity(value)
        return value

    @field_validator("owner")
    @classmethod
    def _owner_is_a_label_value(cls, value: str) -> str:
        if not value or not _LABEL_VALUE.match(value):
            raise ValueError(f"owner {value!r} is not a valid label value (63 alphanumerics, '-', '_', '.')")
        return value

    @field_validator("workdir")
    @classmethod
    def _workdir_is_absolute(cls, value: str) -> str:
        if not value.startswith("/") or value.rstrip("/") in ("", "/tmp"):
            raise ValueError(f"workdir {value!r} must be an absolute path other than / and /tmp")
        return value.rstrip("/")
