"""A sandbox's network set through one replica, served by another with a data directory of its
own (the Helm chart's: an ``emptyDir`` per replica), over the FAKE Kubernetes API server
(`fake_apiserver`): the network is an annotation of the sandbox's pod (`sandboxes.server.
networks`), written before the API answers and read back with the pod by every replica, and by
a replica started afresh. A network too big for the annotation is refused, and nothing changes."""

from __future__ import annotations

import contextlib
import json
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b import Sandbox

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
from e2b_harness import opts
from fake_cluster import fake_template
from service_harness import Running, create, error_of, running, settings_for
from support import SESSION_OWNER

from sandboxes.lifecycle import NETWORK_RECORD_LIMIT
from sandboxes.server.network_record import merged, network_record, read_network_record
from sandboxes.server.store import Network, SandboxState

PREVIEW = "/ports/8000"
"""A port of the sandbox nothing listens on: a request let in answers 502, one kept out 401."""
TEMPLATE_ALLOW = ["allowed.example"]
CHANGED = ["changed.example:443"]
ANNOTATION = "io.sandboxes.network"

Replica = Callable[..., contextlib.AbstractContextManager[Running]]


@pytest.fixture(scope="module")
def replica(fake_kubeconfig: Path, runtime_image: str, tmp_path_factory: pytest.TempPathFactory) -> Replica:
    """``replica()``: one more replica over the fake's pods, with a data directory of its own,
    reading a held sandbox's record again at every request (``confirm_interval`` 0)."""
    owner = f"{SESSION_OWNER}-net-{uuid.uuid4().hex[:6]}"
    template = fake_template(
        fake_kubeconfig, runtime_image, default_timeout=30, egress=True, egress_allow=TEMPLATE_ALLOW
    )

    def start(**overrides: Any) -> contextlib.AbstractContextManager[Running]:
        data_dir = tmp_path_factory.mktemp("replica")
        options: dict[str, Any] = {"owner": owner, "templates": {"default": template}, "confirm_interval": 0}
        return running(settings_for(data_dir, **{**options, **overrides}))

    return start


@pytest.fixture(scope="module")
def pair(replica: Replica) -> Iterator[tuple[Running, Running]]:
    with replica() as a, replica() as b:
        assert a.app.state.service.settings.data_dir != b.app.state.service.settings.data_dir
        yield a, b


def _annotation(core_v1: Any, sandbox_id: str) -> dict[str, Any]:
    """The network annotation of the sandbox's pod, parsed."""
    pods = core_v1.list_namespaced_pod("sandboxes", label_selector=f"io.sandboxes.service-id={sandbox_id}").items
    assert len(pods) == 1, pods
    found: dict[str, Any] = json.loads((pods[0].metadata.annotations or {})[ANNOTATION])
    return found


def test_a_network_set_through_one_replica_applies_on_another_with_its_own_data_directory(
    pair: tuple[Running, Running], core_v1: Any
) -> None:
    """B holds the sandbox (and serves its egress); A changes its allow-list and makes a port
    public; B serves both at its next request, having read the pod again; A makes the port
    private again, and B keeps the stranger out."""
    a, b = pair
    with b.client() as on_b, a.client() as on_a, b.client(None) as stranger:
        made = create(on_b, ttl=300)["id"]
        try:
            assert on_b.get(f"/v1/sandboxes/{made}/egress").json() == {"allow": TEMPLATE_ALLOW}
            assert stranger.get(f"/v1/sandboxes/{made}{PREVIEW}/").status_code == 401
            assert on_a.put(f"/v1/sandboxes/{made}/egress", json={"allow": CHANGED}).status_code == 200
            assert on_a.put(f"/v1/sandboxes/{made}{PREVIEW}", json={"public": True}).status_code == 200
            assert on_b.get(f"/v1/sandboxes/{made}/egress").json() == {"allow": CHANGED}
            assert b.app.state.egress.allow_list(made) == CHANGED  # what B's proxy serves its next connection
            recorded = _annotation(core_v1, made)
            assert recorded["allow"] == CHANGED
            assert recorded["ports"] == [8000]
            assert stranger.get(f"/v1/sandboxes/{made}{PREVIEW}/").status_code == 502  # let in
            assert on_a.put(f"/v1/sandboxes/{made}{PREVIEW}", json={"public": False}).status_code == 200
            assert stranger.get(f"/v1/sandboxes/{made}{PREVIEW}/").status_code == 401
        finally:
            on_a.delete(f"/v1/sandboxes/{made}")


def test_e2b_public_traffic_set_through_one_replica_lets_a_stranger_in_on_another(
    pair: tuple[Running, Running],
) -> None:
    """A creates an E2B sandbox with ``allow_public_traffic``; B, which never held it and has
    no file of it, lets a keyless request for its port in (from the pod's record)."""
    a, b = pair
    opened = Sandbox.create(network={"allow_public_traffic": True}, timeout=300, **opts(a))
    try:
        with b.client(None) as stranger:
            e2b = {"E2b-Sandbox-Id": opened.sandbox_id, "E2b-Sandbox-Port": "8000"}
            assert stranger.get("/e2b/envd/", headers=e2b).status_code == 502  # no traffic token needed
    finally:
        opened.kill()


def test_a_network_too_big_for_its_record_is_refused_and_nothing_changes(
    pair: tuple[Running, Running], core_v1: Any
) -> None:
    a, b = pair
    too_many = [f"host-{index:04d}.example.com" for index in range(NETWORK_RECORD_LIMIT // 20)]
    with a.client() as on_a, b.client() as on_b:
        made = create(on_a, ttl=300)["id"]
        try:
            assert on_a.put(f"/v1/sandboxes/{made}/egress", json={"allow": CHANGED}).status_code == 200
            refused = on_a.put(f"/v1/sandboxes/{made}/egress", json={"allow": too_many})
            assert refused.status_code == 422, refused.text[:300]
            assert error_of(refused) == "invalid_request"
            assert str(NETWORK_RECORD_LIMIT) in refused.json()["message"]
            assert on_a.get(f"/v1/sandboxes/{made}/egress").json() == {"allow": CHANGED}  # undone here too
            assert on_b.get(f"/v1/sandboxes/{made}/egress").json() == {"allow": CHANGED}
            assert _annotation(core_v1, made)["allow"] == CHANGED
        finally:
            on_a.delete(f"/v1/sandboxes/{made}")


def test_a_change_through_a_replica_that_did_not_see_another_keeps_both(replica: Replica, core_v1: Any) -> None:
    """B holds the sandbox and trusts what it holds for a long while (``confirm_interval``); A
    changes its allow-list; B, not having read it again, makes a port public: the pod records
    both (B's change merged with the record, not written over it), and B serves both."""
    with replica() as a, replica(confirm_interval=300) as b, a.client() as on_a, b.client() as on_b:
        made = create(on_b, ttl=300)["id"]
        try:
            assert on_a.put(f"/v1/sandboxes/{made}/egress", json={"allow": CHANGED}).status_code == 200
            assert on_b.put(f"/v1/sandboxes/{made}{PREVIEW}", json={"public": True}).status_code == 200
            recorded = _annotation(core_v1, made)
            assert recorded["allow"] == CHANGED
            assert recorded["ports"] == [8000]
            assert b.app.state.egress.allow_list(made) == CHANGED
        finally:
            on_a.delete(f"/v1/sandboxes/{made}")


def test_a_replica_started_afresh_serves_the_network_set_before(replica: Replica) -> None:
    """A sets the network and stops; a new replica, its data directory empty (an ``emptyDir``
    after a restart), serves it."""
    with replica() as a, a.client() as on_a:
        made = create(on_a, ttl=300)["id"]
        assert on_a.put(f"/v1/sandboxes/{made}/egress", json={"allow": CHANGED}).status_code == 200
        assert on_a.put(f"/v1/sandboxes/{made}{PREVIEW}", json={"public": True}).status_code == 200
    with replica() as fresh, fresh.client() as on_fresh, fresh.client(None) as stranger:
        try:
            assert stranger.get(f"/v1/sandboxes/{made}{PREVIEW}/").status_code == 502  # let in, not held yet
            assert on_fresh.get(f"/v1/sandboxes/{made}/egress").json() == {"allow": CHANGED}
        finally:
            on_fresh.delete(f"/v1/sandboxes/{made}")


def test_a_sandbox_made_again_from_hibernation_has_its_network_on_its_new_pod(
    pair: tuple[Running, Running], core_v1: Any
) -> None:
    """A hibernate releases the pod (its annotation with it); the resume through A makes a new
    pod, on which A records the network again, and B serves it from there."""
    a, b = pair
    with a.client() as on_a, b.client() as on_b, b.client(None) as stranger:
        made = create(on_a, ttl=300)["id"]
        try:
            assert on_a.put(f"/v1/sandboxes/{made}{PREVIEW}", json={"public": True}).status_code == 200
            paused = on_a.post(f"/v1/sandboxes/{made}/pause", json={"mode": "hibernate", "ttl": "keep"})
            assert paused.status_code == 200, paused.text
            resumed = on_a.post(f"/v1/sandboxes/{made}/resume")
            assert resumed.status_code == 200, resumed.text
            assert _annotation(core_v1, made)["ports"] == [8000]
            assert stranger.get(f"/v1/sandboxes/{made}{PREVIEW}/").status_code == 502  # let in on B
            assert on_b.get(f"/v1/sandboxes/{made}").status_code == 200
        finally:
            on_a.delete(f"/v1/sandboxes/{made}")


def _state() -> SandboxState:
    return SandboxState("s1", "alice", "default", "kubernetes", 0.0, 9e9, 1.0, 1, "pod", "/w")


@pytest.mark.parametrize(
    "text",
    [
        "x" * (NETWORK_RECORD_LIMIT + 1),
        "{not json",
        "[]",
        json.dumps({"allow": "*", "headers": {"h": {"k": 1}}, "public": "yes", "ports": [0, "80"]}),
        json.dumps({"allow": ["*"], "public": True, "ports": [80]}) + " " * NETWORK_RECORD_LIMIT,
    ],
)
def test_a_record_that_cannot_be_read_is_the_closed_network(text: str) -> None:
    state = _state()
    read_network_record(state, text)
    assert (state.egress_allow, state.egress_headers, state.public_ports, state.preview_public) == ([], {}, None, [])
    assert state.network_set
    assert state.network_on_record


def test_a_change_merged_with_the_record_keeps_what_it_did_not_change() -> None:
    """Ports port by port, the other parts whole: what this change changed wins."""
    before = Network(None, (), None, None, (80,))
    after = Network(None, (), True, None, (80, 8000))  # public traffic on, 8000 made public
    current = Network(("a.example",), (), None, "m", (443,))  # another replica: list, mask, 80 closed, 443
    assert merged(current, before, after) == Network(("a.example",), (), True, "m", (443, 8000))
    assert merged(before, before, after) == after


def test_a_record_reads_back_as_written() -> None:
    state = _state()
    state.egress_allow, state.egress_headers = ["a.example"], {"a.example": {"X-Key": "v"}}
    state.public_ports, state.mask_request_host, state.preview_public = True, "${PORT}.in", [80, 8000]
    again = _state()
    read_network_record(again, network_record(state))
    assert again.network() == state.network()
