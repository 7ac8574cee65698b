"""The service's warm pool on a ``kubernetes`` template (`sandboxes.server.pool`), as pods of the
fake API server (a FAKE, `fake_apiserver`): a create claims a started, tenant-less pod that is
then the tenant's alone, its first command runs, the pool refills, an ``Idempotency-Key``
replay finds the claimed pod, and a ``kill -9`` of the service adopts the claimed pod and makes
the pool again without leaking one."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
from service_harness import (
    UNTHROTTLED,
    Running,
    ServiceProcess,
    create,
    execute,
    running,
    settings_for,
    subprocess_config,
)
from test_kubernetes_service import _template as service_template
from test_service_pool import _ready, _wait

from sandboxes.kubernetes import KubernetesTemplate

SERVICE_ID = "io.sandboxes.service-id"
TENANT = "io.sandboxes.tenant"


def _template(kubeconfig: Path, image: str, **extra: Any) -> dict[str, Any]:
    return {**service_template(kubeconfig, image), **extra}


def _pods(core_v1: Any, owner: str) -> dict[str, dict[str, str]]:
    """The labels of the owner's live pods, by their service id."""
    pods = core_v1.list_namespaced_pod("sandboxes", label_selector=f"io.sandboxes.owner={owner}").items
    live = [pod for pod in pods if pod.metadata.deletion_timestamp is None]
    return {pod.metadata.labels[SERVICE_ID]: dict(pod.metadata.labels) for pod in live}


@pytest.fixture(scope="module")
def service(fake_kubeconfig: Path, runtime_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    owner = f"k8s-pool-{uuid.uuid4().hex[:6]}"
    templates = {
        "default": KubernetesTemplate.model_validate(_template(fake_kubeconfig, runtime_image)),
        "pooled": KubernetesTemplate.model_validate(_template(fake_kubeconfig, runtime_image, pool_size=2)),
    }
    settings = settings_for(tmp_path_factory.mktemp("k8s-pool"), owner=owner, templates=templates, tenants=UNTHROTTLED)
    with running(settings) as svc:
        yield svc


def _full(service: Running) -> set[str]:
    """The pool's members once it holds its two."""
    pools = service.registry.pools
    _wait("the pool holds 2 ready pods", lambda: pools.ready("pooled") == 2)
    return {member.state.id for member in pools._ready["pooled"]}


def test_a_create_claims_a_pooled_pod_that_is_the_tenants_and_the_pool_refills(service: Running, core_v1: Any) -> None:
    owner = str(service.app.state.service.settings.owner)
    members = _full(service)
    pods = _pods(core_v1, owner)
    assert members <= set(pods)
    assert not any(TENANT in pods[member] for member in members)  # nobody's yet
    with service.client("alice") as alice, service.client("bob") as bob:
        for member in members:
            assert alice.get(f"/v1/sandboxes/{member}").status_code == 404
        claimed = create(alice, template="pooled", ttl=120)
        assert claimed["id"] in members
        assert (claimed["template"], claimed["backend"]) == ("pooled", "kubernetes")
        assert execute(alice, claimed["id"], "id -u; pwd")["output"].split() == ["1000", "/workspace"]
        assert bob.get(f"/v1/sandboxes/{claimed['id']}").status_code == 404
        assert claimed["id"] not in {s["id"] for s in bob.get("/v1/sandboxes").json()["sandboxes"]}
        refilled = _full(service)
        assert claimed["id"] not in refilled
        assert len(refilled - members) == 1
        # Whose it is lives in the service's claim, not on the pod (whose labels a create fixed).
        claim = service.registry.pools.claims.get(claimed["id"])
        assert claim is not None
        assert claim.tenant == "alice"
        assert TENANT not in _pods(core_v1, owner)[claimed["id"]]
        assert alice.delete(f"/v1/sandboxes/{claimed['id']}").status_code == 204
        assert claimed["id"] not in service.registry.pools.claims.ids()
        _wait("the deleted pod is gone", lambda: claimed["id"] not in _pods(core_v1, owner))


def test_an_idempotency_key_replay_answers_the_claimed_pod(service: Running) -> None:
    _full(service)
    key = {"Idempotency-Key": uuid.uuid4().hex}
    with service.client("alice") as alice:
        first = alice.post("/v1/sandboxes", json={"template": "pooled"}, headers=key)
        assert first.status_code == 201, first.text
        replay = alice.post("/v1/sandboxes", json={"template": "pooled"}, headers=key)
        assert (replay.json()["id"], replay.headers.get("Idempotent-Replayed")) == (first.json()["id"], "true")
        assert alice.delete(f"/v1/sandboxes/{first.json()['id']}").status_code == 204


def test_kill_9_then_restart_adopts_the_claimed_pod_and_makes_the_pool_again(
    tmp_path: Path, fake_kubeconfig: Path, runtime_image: str, core_v1: Any
) -> None:
    owner = f"k8s-pool9-{uuid.uuid4().hex[:6]}"
    template = _template(fake_kubeconfig, runtime_image, pool_size=2)
    config = subprocess_config(tmp_path / "data", owner=owner, templates={"default": template})
    service = ServiceProcess(config, tmp_path)
    key = {"Idempotency-Key": uuid.uuid4().hex}
    service.start()
    try:
        with service.client("alice") as alice:
            _wait("the pool holds 2", lambda: _ready(alice) == 2)
            before = set(_pods(core_v1, owner))
            claimed = alice.post("/v1/sandboxes", json={"ttl": 300}, headers=key).json()
            assert claimed["id"] in before
            execute(alice, claimed["id"], "echo kept > /workspace/file.txt")
            _wait("the pool refilled", lambda: _ready(alice) == 2)
        left = before - {claimed["id"]}
        service.kill()
        service.start()
        with service.client("alice") as alice, service.client("bob") as bob:
            assert [s["id"] for s in alice.get("/v1/sandboxes").json()["sandboxes"]] == [claimed["id"]]
            assert not bob.get("/v1/sandboxes").json()["sandboxes"]
            assert execute(alice, claimed["id"], "cat /workspace/file.txt")["output"] == "kept\n"
            replay = alice.post("/v1/sandboxes", json={"ttl": 300}, headers=key)
            assert (replay.json()["id"], replay.headers.get("Idempotent-Replayed")) == (claimed["id"], "true")
            _wait("the pool was made again", lambda: _ready(alice) == 2)
            _wait("what was unclaimed at the kill is gone", lambda: not set(_pods(core_v1, owner)) & left)
            assert len(set(_pods(core_v1, owner))) == 3  # the claimed one and a new pool of two
        service.stop()  # a shutdown destroys the pool; the tenant's pod stays
        _wait("the pool's pods are gone", lambda: set(_pods(core_v1, owner)) == {claimed["id"]})
    finally:
        service.stop()
        for pod in core_v1.list_namespaced_pod("sandboxes", label_selector=f"io.sandboxes.owner={owner}").items:
            core_v1.delete_namespaced_pod(pod.metadata.name, "sandboxes")
