"""Two replicas of the service over one real Docker engine (`ReplicaScenarios`): a container's
labels and name are the whole record of its sandbox, which every replica reads."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from replica_scenarios import ReplicaScenarios
from support import SESSION_OWNER

CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}


class TestReplicasOverDocker(ReplicaScenarios):
    @pytest.fixture(scope="module")
    @classmethod
    def template(cls, runtime_image: str) -> dict[str, Any]:
        return {"backend": "docker", "image": runtime_image, "cpus": 0.5, "memory": "256m", "labels": CLEANUP}

    @pytest.fixture(scope="module")
    @classmethod
    def owner(cls) -> str:
        return f"{SESSION_OWNER}-replicas-{uuid.uuid4().hex[:6]}"

    @pytest.fixture(scope="module")
    @classmethod
    def docker_client_for_service(cls, docker_client: Any) -> Any:
        return docker_client

    @pytest.fixture(scope="module")
    @classmethod
    def recorded(cls, docker_client: Any, owner: str) -> Callable[[], dict[str, dict[str, str]]]:
        def containers() -> dict[str, dict[str, str]]:
            listed = docker_client.containers.list(all=True, filters={"label": f"io.sandboxes.owner={owner}"})
            return {
                c.labels["io.sandboxes.service-id"]: c.labels for c in listed if "io.sandboxes.service-id" in c.labels
            }

        return containers
