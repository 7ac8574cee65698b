"""A sandbox's state on the ``kubernetes`` backend (pods of the fake API server, a FAKE:
`fake_apiserver`): a pause answers ``unavailable`` (the pod API has no freezer) and leaves the
pod running; a snapshot of a pod's workspace restores, verified, into a new pod."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
from fake_cluster import fake_template
from service_harness import UNTHROTTLED, Running, create, execute, running, settings_for
from test_service_snapshot_helper import counting_restore

from sandboxes.kubernetes import KubernetesTemplate


@pytest.fixture(scope="module")
def service(fake_kubeconfig: Path, runtime_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    template = KubernetesTemplate.model_validate(fake_template(fake_kubeconfig, runtime_image, default_timeout=30))
    settings = settings_for(tmp_path_factory.mktemp("k8s-state"), templates={"default": template}, tenants=UNTHROTTLED)
    with running(settings) as svc:
        yield svc


def test_a_pod_cannot_be_paused_and_says_so(service: Running) -> None:
    with service.client("alice") as client:
        sid = create(client)["id"]
        try:
            refused = client.post(f"/v1/sandboxes/{sid}/pause", json={})
            assert refused.status_code == 501, refused.text
            assert refused.json()["error"] == "unavailable"
            assert "kubernetes backend cannot pause" in refused.json()["message"]
            assert execute(client, sid, "echo still")["output"] == "still\n"
        finally:
            client.delete(f"/v1/sandboxes/{sid}")


def test_a_pods_snapshot_restores_into_a_new_pod(service: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the pod's exec helper, in one command (`sandboxes.server.untar`)."""
    counts = counting_restore(monkeypatch)
    with service.client("alice") as client:
        source = create(client)["id"]
        made = execute(client, source, "mkdir d && printf 'pod\\n' > d/f && chmod 640 d/f && ln -s d/f link && echo ok")
        assert made["output"] == "ok\n", made
        taken = client.post(f"/v1/sandboxes/{source}/snapshots", json={})
        assert taken.status_code == 201, taken.text
        restored = create(client, snapshot=taken.json()["id"])["id"]
        try:
            assert counts == [1]
            assert execute(client, restored, "cat link; stat -c %a d/f")["output"] == "pod\n640\n"
        finally:
            for sid in (source, restored):
                client.delete(f"/v1/sandboxes/{sid}")
