"""Two replicas of the service over one real Docker engine (`ReplicaScenarios`): a container's
labels and name are the whole record of its sandbox, which every replica reads."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from e2b import Sandbox
from e2b_harness import opts
from replica_idempotency import OneKeyAcrossReplicas
from replica_scenarios import ReplicaScenarios
from service_harness import ManualClock, Running, running
from support import SESSION_OWNER

from sandboxes.lifecycle import CreateOptions
from sandboxes.server import census
from sandboxes.server.backends import (
    LABEL_SERVICE_CREATED,
    LABEL_SERVICE_EXPIRES,
    LABEL_SERVICE_ID,
    LABEL_TEMPLATE,
    LABEL_TENANT,
    make_backends,
    new_sandbox_id,
)
from sandboxes.server.e2b import common, signed
from sandboxes.server.e2b.recorded import INTERVAL
from sandboxes.server.settings import ServiceSettings
from sandboxes.server.store import SandboxState, StateStore

CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}


def _fetch(url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """The status and body of a plain request to a signed URL (no header of the SDK's)."""
    sent = {**({"Content-Type": "application/octet-stream"} if body is not None else {}), **(headers or {})}
    response = httpx.request("POST" if body is not None else "GET", url, content=body, headers=sent, timeout=30)
    return response.status_code, response.content


class TestReplicasOverDocker(ReplicaScenarios, OneKeyAcrossReplicas):
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

    @pytest.fixture(autouse=True)
    def _engine(self, docker_client: Any) -> None:
        self._docker = docker_client

    def history(self, sandbox_id: str, since: float) -> str:
        """The engine's events for the sandbox's container: its renames (the renewals) and its
        destruction, with times."""
        events = self._docker.events(
            since=int(since), until=int(time.time()) + 1, decode=True,
            filters={"type": "container", "label": f"{LABEL_SERVICE_ID}={sandbox_id}"},
        )  # fmt: skip
        lines = []
        for event in events:
            name = event.get("Actor", {}).get("Attributes", {}).get("name")
            lines.append(f"{event.get('timeNano', 0) / 1e9:.3f} {event.get('Action')} {name}")
        return "\n".join(lines)

    @pytest.fixture(scope="module")
    @classmethod
    def recorded(cls, docker_client: Any, owner: str) -> Callable[[], dict[str, dict[str, str]]]:
        def containers() -> dict[str, dict[str, str]]:
            listed = docker_client.containers.list(
                all=True, filters={"label": f"io.sandboxes.owner={owner}"}, ignore_removed=True
            )  # a sweep may remove one between the listing and its inspection
            return {
                c.labels["io.sandboxes.service-id"]: c.labels for c in listed if "io.sandboxes.service-id" in c.labels
            }

        return containers

    def test_a_sandbox_renewed_before_the_upgrade_keeps_its_renewal(
        self,
        settings: Callable[..., ServiceSettings],
        docker_client: Any,
        recorded: Callable[[], dict[str, dict[str, str]]],
        pair: tuple[Running, Running],
    ) -> None:
        """A container made by a single service of before replicas has its expiry only in the
        ``service-expires-at`` label it was created with; a renewal lived in the state file. The
        first replica to start adopts it and drops the state file (a shared backend's sandbox is
        its own record): the renewal must go onto the container, or every replica reaps the
        sandbox at its stale label."""
        config = settings()
        backend = make_backends(config, docker_client)["default"]
        created = time.time()
        sandbox_id, label_expiry, renewed = new_sandbox_id(), int(created) + 60, float(int(created) + 3600)
        labels = {
            LABEL_TENANT: "alice",
            LABEL_TEMPLATE: "default",
            LABEL_SERVICE_ID: sandbox_id,
            LABEL_SERVICE_EXPIRES: str(label_expiry),
            LABEL_SERVICE_CREATED: f"{created:.6f}",
        }
        container = backend.provider.create(CreateOptions(labels=labels))  # as the service made it then
        state = SandboxState(
            sandbox_id, "alice", "default", "docker", created, renewed, 0.5, 256 << 20, container.id, ""
        )
        StateStore(config.data_dir / "state").save(state)
        clock = ManualClock()
        with running(config, docker_client=docker_client, clock=clock) as upgraded:
            clock.advance(600)  # past the label's expiry, long before the renewal's
            upgraded.sweep()
            assert sandbox_id in recorded()
            assert not list((config.data_dir / "state").glob("*.json"))
        with pair[1].client("alice") as other:  # another replica reads the renewal on the container
            assert other.get(f"/v1/sandboxes/{sandbox_id}").json()["expires_at"] == renewed
            assert other.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204

    def test_a_signed_url_is_served_by_a_replica_that_does_not_hold_the_sandbox(
        self, replica: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """E2B's signed file URLs name no sandbox: a replica that holds none whose token makes the
        signature finds it among the backend's records and adopts it."""
        monkeypatch.setenv("SANDBOXES_E2B_TOKEN_SECRET", uuid.uuid4().hex)  # the replicas share it
        with replica(sweep_interval=3600) as a, replica(sweep_interval=3600) as b:
            sandbox = Sandbox.create(secure=True, timeout=120, **opts(a))
            try:
                sandbox.files.write("signed.txt", "from A")
                assert not b.registry.holds(sandbox.sandbox_id)
                on_b = sandbox.download_url("signed.txt", "user").replace(a.url, b.url)
                assert _fetch(on_b) == (200, b"from A")
                assert b.registry.holds(sandbox.sandbox_id)
                uploaded = sandbox.upload_url("up.txt", "user", 120).replace(a.url, b.url)
                assert _fetch(uploaded, b"through B")[0] == 200
                assert sandbox.files.read("up.txt") == "through B"
                expired = sandbox.download_url("signed.txt", "user", use_signature_expiration=-120)
                status, body = _fetch(expired.replace(a.url, b.url))
                assert (status, json.loads(body)["message"]) == (401, "signature is already expired")
            finally:
                sandbox.kill()

    def test_a_signed_url_of_a_sandbox_made_after_the_last_read_is_served_not_refused(
        self, replica: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """B reads the records (a bogus URL asks it to); A makes a sandbox after that read listed
        the engine; the sandbox's URL reaches B before the read lands. The URL is served, by a
        read of the records B starts after it arrived, not refused until some later request
        makes B read them again."""
        monkeypatch.setenv("SANDBOXES_E2B_TOKEN_SECRET", uuid.uuid4().hex)  # the replicas share it
        with replica(sweep_interval=3600) as a, replica(sweep_interval=3600) as b:
            listed, release, arrived = threading.Event(), threading.Event(), threading.Event()
            state_of = common.e2b_state  # as signed imported it

            def held_back(count: int) -> None:
                if count == 1:  # listed before A makes the sandbox, landing after its URL reached B
                    listed.set()
                    release.wait(60)

            def watched(request: Any) -> Any:
                if request.query_params.get("path") == "fresh.txt":
                    arrived.set()  # then on B's loop, with nothing awaited, up to the records it asks for
                return state_of(request)

            reads = _spy_reads(monkeypatch, b, held_back)
            monkeypatch.setattr(signed, "e2b_state", watched)
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                try:
                    primed = pool.submit(_fetch, f"{b.url}/files?path=prime.txt&username=user&signature=v1_bogus")
                    assert listed.wait(30), "B did not read the records"
                    sandbox = Sandbox.create(secure=True, timeout=120, **opts(a))
                    try:
                        sandbox.files.write("fresh.txt", "made on A")
                        url = sandbox.download_url("fresh.txt", "user").replace(a.url, b.url)
                        fetched = pool.submit(_fetch, url)
                        assert arrived.wait(30), "the URL did not reach B"
                        release.set()
                        assert fetched.result(60) == (200, b"made on A")
                        assert b.registry.holds(sandbox.sandbox_id)
                    finally:
                        sandbox.kill()
                finally:
                    release.set()
                status, body = primed.result(60)
                assert (status, json.loads(body)["message"]) == (401, "invalid signature")
            assert len(reads) == 2, reads  # the primed one, and one started after the URL arrived

    def test_a_burst_of_signed_urls_for_unknown_sandboxes_reads_the_records_once_per_interval(
        self, replica: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Every URL of the burst misses (a bogus signature; half of them name, in
        ``E2b-Sandbox-Id``, a sandbox no replica has) and waits for a read of the records started
        after it arrived: those reads are shared and start `INTERVAL` apart at least, so the
        engine is read at most once per interval over the burst, plus one, not once a URL."""
        with replica(sweep_interval=3600) as b:
            reads = _spy_reads(monkeypatch, b, lambda count: None)
            url = f"{b.url}/files?path=secret.txt&username=user&signature=v1_"

            def bogus(n: int) -> tuple[int, bytes]:
                named = {"E2b-Sandbox-Id": new_sandbox_id()} if n % 2 else {}
                return _fetch(f"{url}{uuid.uuid4().hex}", headers=named)

            started = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                answers = list(pool.map(bogus, range(48)))
            elapsed = time.monotonic() - started
            assert {(status, json.loads(body)["message"]) for status, body in answers} == {(401, "invalid signature")}
            assert 1 <= len(reads) <= 1 + elapsed / INTERVAL, (len(reads), elapsed)


def _spy_reads(monkeypatch: pytest.MonkeyPatch, service: Running, then: Callable[[int], object]) -> list[float]:
    """When ``service`` read every tenant's records (`census.all_states`, wrapped: the real
    read, then ``then`` with the count so far, in the reading thread)."""
    reads: list[float] = []
    all_states = census.all_states

    def spied(backends: dict[str, Any]) -> list[SandboxState]:
        found = all_states(backends)
        if backends is service.registry.backends:
            reads.append(time.monotonic())
            then(len(reads))
        return found

    monkeypatch.setattr(census, "all_states", spied)
    return reads
