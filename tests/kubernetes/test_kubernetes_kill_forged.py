"""`tests/test_kill_forged.py` on a Kubernetes pod (the fake API server's), through the exec helper:
a timeout kills what cleared its environment or forged a job's marker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fake_apiserver import FakeKubernetes
from support import SESSION_OWNER
from test_kill_forged import DISGUISES, SHAPES, assert_the_timeout_kills_it

from sandboxes.kubernetes import KubernetesSandbox, KubernetesSandboxConfig


@pytest.fixture(scope="module")
def sandbox(fake_kubernetes: FakeKubernetes, runtime_image: str) -> Iterator[KubernetesSandbox]:
    from kubernetes import client

    api_client: Any = client.ApiClient(client.Configuration(host=fake_kubernetes.url))
    template = KubernetesSandboxConfig(image=runtime_image, owner=SESSION_OWNER)
    with KubernetesSandbox.create(template, api_client=api_client) as sb:
        yield sb


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("disguise", DISGUISES)
def test_a_timeout_kills_what_cleared_or_forged_its_environment(
    sandbox: KubernetesSandbox, disguise: str, shape: str
) -> None:
    assert_the_timeout_kills_it(sandbox, disguise, shape)
