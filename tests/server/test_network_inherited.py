"""A fork, and a sandbox made from a snapshot, start with the network their sandbox had: a fork
its parent's at the fork (an allow-list narrowed by ``PUT .../egress`` or ``update_network``
after its create, the headers its egress proxy adds, E2B's ``allowPublicTraffic`` and
``maskRequestHost``), a restore what its snapshot recorded when it was taken, save what its create
names of its own; enforced by the egress proxy and the ports' proxy, not only reported. On a local
jail (and, through the service's own API, Docker) whose template allows both targets, servers this
test starts on 127.0.0.2 and 127.0.0.3."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import ALL_TRAFFIC, Sandbox
from e2b_harness import CLEANUP, opts
from egress_targets import Target, targets_fixture
from service_harness import Running, create, running, settings_for
from support import HAS_BWRAP, SESSION_OWNER, needs
from test_e2b_network import APP_PORT, TOKEN, _reached, _serve_in

from sandboxes.docker import DockerTemplate
from sandboxes.local import LocalTemplate

BOTH = ["127.0.0.2", "127.0.0.3"]
"""The template's allow-list: wider than any of the sandboxes' below."""


targets = targets_fixture()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    needs(HAS_BWRAP, "bubblewrap is not installed")
    template = LocalTemplate(default_timeout=60, egress=True, egress_allow=BOTH, egress_open_ranges=["127.0.0.0/8"])
    with running(settings_for(tmp_path_factory.mktemp("inherited"), templates={"default": template})) as svc:
        yield svc


@pytest.fixture(scope="module", params=["local", "docker"])
def native(
    request: pytest.FixtureRequest, service: Running, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    """The service over the local jail, then over Docker (whose containers' labels record a
    create's allow-list, and whose replica keeps a state file beside them for the rest)."""
    if request.param == "local":
        yield service
        return
    image = request.getfixturevalue("runtime_image")
    egress: dict[str, Any] = {"egress": True, "egress_allow": BOTH, "egress_open_ranges": ["127.0.0.0/8"]}
    template = DockerTemplate(backend="docker", image=image, memory="512m", labels=CLEANUP, **egress)
    owner = f"{SESSION_OWNER}-inherited-{uuid.uuid4().hex[:6]}"
    settings = settings_for(tmp_path_factory.mktemp("inherited-docker"), owner=owner, templates={"default": template})
    with running(settings, docker_client=request.getfixturevalue("docker_client")) as svc:
        yield svc


def _refused(sandbox_id: str, service: Running, target: Target) -> None:
    """``target`` refused to the sandbox by its egress proxy, and never connected to."""
    before = len(target.seen)
    assert _reached(Sandbox.connect(sandbox_id, **opts(service)), target.url).startswith("403 egress refused")
    assert len(target.seen) == before


def test_a_fork_starts_with_the_allow_list_its_parent_was_narrowed_to(
    native: Running, targets: tuple[Target, Target]
) -> None:
    service = native
    two, three = targets
    with service.client() as client:
        parent = create(client)["id"]
        assert client.put(f"/v1/sandboxes/{parent}/egress", json={"allow": ["127.0.0.3"]}).status_code == 200
        forked = client.post(f"/v1/sandboxes/{parent}/fork", json={"count": 1})
        assert forked.status_code == 201, forked.text
        child = forked.json()["sandboxes"][0]["id"]
        assert client.get(f"/v1/sandboxes/{child}/egress").json() == {"allow": ["127.0.0.3"]}
        _refused(child, service, two)  # the template's list would reach it
        assert _reached(Sandbox.connect(child, **opts(service)), three.url) == "hello from 127.0.0.3"


def test_a_restore_takes_its_snapshots_list_unless_its_create_names_its_own(
    native: Running, targets: tuple[Target, Target]
) -> None:
    service = native
    two, three = targets
    with service.client() as client:
        parent = create(client, egress_allow=["127.0.0.2"])["id"]
        taken = client.post(f"/v1/sandboxes/{parent}/snapshots", json={})
        assert taken.status_code == 201, taken.text
        snapshot = taken.json()["id"]
        assert client.put(f"/v1/sandboxes/{parent}/egress", json={"allow": ["127.0.0.3"]}).status_code == 200
        restored = create(client, snapshot=snapshot)["id"]
        assert client.get(f"/v1/sandboxes/{restored}/egress").json() == {"allow": ["127.0.0.2"]}  # at its taking
        _refused(restored, service, three)
        assert _reached(Sandbox.connect(restored, **opts(service)), two.url) == "hello from 127.0.0.2"
        own = create(client, snapshot=snapshot, egress_allow=["127.0.0.3"])["id"]
        assert client.get(f"/v1/sandboxes/{own}/egress").json() == {"allow": ["127.0.0.3"]}


def _public(service: Running, sandbox_id: str) -> httpx.Response:
    """A request to the sandbox's app port through the E2B ports' proxy, without its token."""
    url = f"{service.url}/e2b/envd/headers"
    return httpx.get(url, headers={"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(APP_PORT)})


def test_an_e2b_fork_has_its_parents_network_as_updated_enforced(
    service: Running, targets: tuple[Target, Target]
) -> None:
    two, three = targets
    rules: Any = {"127.0.0.3": [{"transform": {"headers": {"Authorization": f"Bearer {TOKEN}"}}}]}
    ports: Any = {"allow_public_traffic": True, "mask_request_host": "forked.example.com:${PORT}"}
    parent = Sandbox.create(network=ports, timeout=60, **opts(service))
    made: list[Sandbox] = []
    try:
        parent.update_network({"allow_out": ["127.0.0.3"], "deny_out": [ALL_TRAFFIC], "rules": rules})
        made = [fork for fork in parent.fork(count=1, timeout=60) if isinstance(fork, Sandbox)]
        assert len(made) == 1
        child = made[0]
        wanted = {"allow_out": ["127.0.0.3"], "deny_out": [ALL_TRAFFIC], "rules": rules, **ports}
        assert parent.get_info().network == wanted
        assert child.get_info().network == wanted
        _refused(child.sandbox_id, service, two)
        assert _reached(child, three.url) == "hello from 127.0.0.3"
        assert three.seen[-1]["authorization"] == f"Bearer {TOKEN}"
        _serve_in(child)
        answer = _public(service, child.sandbox_id)
        assert answer.status_code == 200, answer.text  # public without its token, as its parent
        assert {key.lower(): value for key, value in answer.json().items()}["host"] == f"forked.example.com:{APP_PORT}"
    finally:
        for sandbox in [parent, *made]:
            sandbox.kill()


def test_an_e2b_restore_keeps_what_its_create_does_not_name(service: Running, targets: tuple[Target, Target]) -> None:
    two = targets[0]
    network: Any = {"allow_out": ["127.0.0.3"], "deny_out": [ALL_TRAFFIC], "allow_public_traffic": True}
    parent = Sandbox.create(network=network, timeout=60, **opts(service))
    made: list[Sandbox] = []
    try:
        snapshot = parent.create_snapshot()
        made.append(Sandbox.create(snapshot.snapshot_id, timeout=60, **opts(service)))
        made.append(Sandbox.create(snapshot.snapshot_id, network={"allow_public_traffic": False}, **opts(service)))
        assert made[0].get_info().network == network
        assert made[1].get_info().network == {**network, "allow_public_traffic": False}
        _refused(made[1].sandbox_id, service, two)
        _serve_in(made[1])
        assert _public(service, made[1].sandbox_id).status_code == 403  # its own: its token needed
    finally:
        for sandbox in [parent, *made]:
            sandbox.kill()
