"""A port inside a Kubernetes pod (the FAKE API server's, a container without a network),
reached through the exec helper's stream (`sandboxes.ports`), as on the other backends
(tests/test_ports.py): an HTTP server started in the pod answers through the relay."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fake_apiserver import FakeKubernetes
from support import SESSION_OWNER
from test_ports import check_a_server_answers_through_the_relay

from sandboxes.kubernetes import KubernetesSandbox, KubernetesSandboxConfig


@pytest.fixture
def pod(fake_kubernetes: FakeKubernetes, runtime_image: str) -> Iterator[KubernetesSandbox]:
    from kubernetes import client

    api_client = client.ApiClient(client.Configuration(host=fake_kubernetes.url))
    template = KubernetesSandboxConfig(image=runtime_image, owner=SESSION_OWNER)
    with KubernetesSandbox.create(template, api_client=api_client) as sandbox:
        yield sandbox


def test_a_server_in_a_pod_answers_through_the_relay(pod: KubernetesSandbox) -> None:
    check_a_server_answers_through_the_relay(pod, pod.workdir)
