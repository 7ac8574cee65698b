"""Two replicas of the service over one Kubernetes API server (the FAKE of `fake_apiserver`;
`ReplicaScenarios`): a pod's labels are the whole record of its sandbox, which every replica
reads, and a renewal is a patch of its expiry label."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
from fake_cluster import fake_template
from replica_idempotency import OneKeyAcrossReplicas
from replica_scenarios import ReplicaScenarios


class TestReplicasOverKubernetes(ReplicaScenarios, OneKeyAcrossReplicas):
    @pytest.fixture(scope="module")
    @classmethod
    def template(cls, fake_kubeconfig: Path, runtime_image: str) -> dict[str, Any]:
        return fake_template(fake_kubeconfig, runtime_image, default_timeout=30)

    @pytest.fixture(scope="module")
    @classmethod
    def owner(cls) -> str:
        return f"replicas-{uuid.uuid4().hex[:6]}"

    @pytest.fixture(scope="module")
    @classmethod
    def recorded(cls, fake_kubeconfig: Path, owner: str) -> Callable[[], dict[str, dict[str, str]]]:
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(config_file=str(fake_kubeconfig), client_configuration=configuration)
        core = client.CoreV1Api(client.ApiClient(configuration))

        def pods() -> dict[str, dict[str, str]]:
            listed = core.list_namespaced_pod("sandboxes", label_selector=f"io.sandboxes.owner={owner}").items
            return {
                pod.metadata.labels["io.sandboxes.service-id"]: pod.metadata.labels
                for pod in listed
                if "io.sandboxes.service-id" in pod.metadata.labels
            }

        return pods
