"""A FAKE Kubernetes API server, a test double only (no Kubernetes server can run here).

It speaks the wire protocol the official ``kubernetes`` Python client uses for core/v1 pods
(create, get, list, watch, patch, delete with label and field selectors and resourceVersions)
and the exec subresource over WebSocket (``v5.channel.k8s.io`` / ``v4.channel.k8s.io``), and
runs each pod as one Docker container with the pod's security settings mapped to Docker's."""

from .kubelet import LABEL, NodeConfig
from .server import FakeKubernetes, StartFault
from .store import ApiError

__all__ = ["LABEL", "ApiError", "FakeKubernetes", "NodeConfig", "StartFault"]
