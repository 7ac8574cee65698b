"""The Kubernetes backend: `KubernetesSandbox` (one pod), `KubernetesProvider` (create, attach,
list, destroy, label sweeps, a warm pool) and their config.

Imports run one way inside the package: `config` < `_pods` (the manifest with the secure
defaults, watches, deletion) < `_exec` (the exec websocket as a byte stream) < `sandbox` <
`provider`. The official ``kubernetes`` client is imported only when used (extra
``sandboxes[kubernetes]``)."""

from sandboxes.kubernetes._pods import PodStartError, pod_manifest, start_failure
from sandboxes.kubernetes.config import (
    ANNOTATION_EXPIRES,
    LABEL_EXPIRES,
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_POOL,
    LABEL_SANDBOX,
    MANAGED_BY,
    KubernetesSandboxConfig,
    Toleration,
)
from sandboxes.kubernetes.provider import KubernetesProvider, KubernetesProviderConfig
from sandboxes.kubernetes.sandbox import KubernetesSandbox
from sandboxes.kubernetes.template import KubernetesTemplate

__all__ = [
    "ANNOTATION_EXPIRES",
    "LABEL_EXPIRES",
    "LABEL_MANAGED",
    "LABEL_OWNER",
    "LABEL_POOL",
    "LABEL_SANDBOX",
    "MANAGED_BY",
    "KubernetesProvider",
    "KubernetesProviderConfig",
    "KubernetesSandbox",
    "KubernetesSandboxConfig",
    "KubernetesTemplate",
    "PodStartError",
    "Toleration",
    "pod_manifest",
    "start_failure",
]
