"""Two replicas of the service over one real Docker engine (`ReplicaScenarios`): a container's
labels and name are the whole record of its sandbox, which every replica reads."""

from __future__ import annotations

import concurrent.futures
import json
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
from sandboxes.server.backends import (
    LABEL_SERVICE_CREATED,
    LABEL_SERVICE_EXPIRES,
    LABEL_SERVICE_ID,
    LABEL_TEMPLATE,
    LABEL_TENANT,
    make_backends,
    new_sandbox_id,
)
from sandboxes.server.settings import ServiceSettings
from sandboxes.server.store import SandboxState, StateStore

CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}


def _fetch(url: str, body: bytes | None = None) -> tuple[int, bytes]:
    """The status and body of a plain request to a signed URL (no header of the SDK's)."""
    headers = {"Content-Type": "application/octet-stream"} if body is not None else {}
    response = httpx.request("POST" if body is not None else "GET", url, content=body, headers=headers, timeout=30)
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
        signature finds it among the backend's records and adopts it; bogus signatures share one
        read of the records per interval, not one each."""
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
                backend = b.registry.backends["default"]
                reads: list[dict[str, str]] = []
                select = backend.select

                def counted(**labels: str) -> Any:
                    if not labels:
                        reads.append(labels)
                    return select(**labels)

                backend.select = counted  # type: ignore[method-assign]
                bogus = on_b.replace("signature=v1_", "signature=v1_A")
                try:
                    with concurrent.futures.ThreadPoolExecutor(8) as pool:
                        answers = list(pool.map(lambda _: _fetch(bogus), range(24)))
                finally:
                    del backend.select
                assert {(status, json.loads(body)["message"]) for status, body in answers} == {
                    (401, "invalid signature")
                }
                assert len(reads) <= 2, reads  # one read per interval at most (the burst may straddle two)
            finally:
                sandbox.kill()
