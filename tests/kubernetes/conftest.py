"""Fixtures for tests against the FAKE Kubernetes API server (tests/kubernetes/fake_apiserver)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_apiserver import FakeKubernetes
from fake_cluster import running_fake
from support import needs

needs(
    importlib.util.find_spec("kubernetes") is not None,
    "the kubernetes extra is not installed (pip install -e '.[kubernetes]'; .ci/run does)",
)


@pytest.fixture(scope="session")
def fake_kubernetes(docker_client: Any) -> Iterator[FakeKubernetes]:
    """A running FAKE API server on 127.0.0.1 with namespaces ``default`` and ``sandboxes``; its
    pods' containers are removed when it stops, and swept by label after."""
    with running_fake(docker_client) as fake:
        yield fake


@pytest.fixture(scope="session")
def fake_kubernetes_v4(docker_client: Any) -> Iterator[FakeKubernetes]:
    """A second FAKE API server that serves exec over ``v4.channel.k8s.io`` only (as before
    Kubernetes 1.30): a client offering ``v5`` first must fall back."""
    with running_fake(docker_client, protocols=("v4.channel.k8s.io",)) as fake:
        yield fake


@pytest.fixture(scope="session")
def fake_kubeconfig(fake_kubernetes: FakeKubernetes, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig file naming the fake (context ``fake``, namespace ``sandboxes``), for
    ``kubernetes.config.load_kube_config(config_file=...)``."""
    return fake_kubernetes.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config", namespace="sandboxes")


@pytest.fixture
def kube_api_client(fake_kubeconfig: Path) -> Iterator[Any]:
    """A ``kubernetes.client.ApiClient`` loaded from the fake's kubeconfig."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(fake_kubeconfig), client_configuration=configuration)
    with client.ApiClient(configuration) as api_client:
        yield api_client


@pytest.fixture
def core_v1(kube_api_client: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(kube_api_client)
