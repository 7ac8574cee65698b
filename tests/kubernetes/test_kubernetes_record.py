"""KubernetesSandbox (the FAKE API server): the exec'd helper is killed when its connection goes
(as a cluster may do), so a command it recorded cannot be run on by it: a new handle reads the
record as ``lost`` (``connection_lost``), with the output recorded until then, not as running."""

from __future__ import annotations

import pytest
from fake_apiserver import FakeKubernetes
from recording import recorded_until_closed
from support import SESSION_OWNER

from sandboxes import protocol as p
from sandboxes.base import BaseSandbox
from sandboxes.jobs import JobRunner
from sandboxes.kubernetes import KubernetesSandbox, KubernetesSandboxConfig


@pytest.fixture
def api_client(fake_kubernetes: FakeKubernetes) -> object:
    from kubernetes import client

    return client.ApiClient(client.Configuration(host=fake_kubernetes.url))


def test_a_recorded_command_whose_helper_was_killed_reads_lost(api_client: object, runtime_image: str) -> None:
    config = KubernetesSandboxConfig(image=runtime_image, owner=SESSION_OWNER)
    first = KubernetesSandbox.create(config, api_client=api_client)
    held: list[BaseSandbox] = [first]

    def reattach() -> BaseSandbox:
        held[-1].close()
        held.append(KubernetesSandbox.attach(first.name, config=config, api_client=api_client))
        return held[-1]

    try:
        again, record_id = recorded_until_closed(first, reattach)
        job = JobRunner(again).read_record(record_id)
        assert (job.state.status, job.output) == ("lost", b"one\n"), job
        assert job.response().error == p.CONNECTION_LOST
    finally:
        held[-1].destroy()
