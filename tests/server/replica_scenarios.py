"""Several replicas of the service over ONE shared backend (Docker, Kubernetes): whatever one
replica does to a sandbox, the others see, because the record is on the sandbox and not in a
replica's memory or disk. A backend's test module subclasses `ReplicaScenarios` and says how to
make its template (each replica gets its own empty data directory)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import (
    POLICIES,
    ManualClock,
    Running,
    ServiceProcess,
    create,
    error_of,
    execute,
    running,
    settings_for,
)
from service_harness import subprocess_config as base_config

from sandboxes.server.settings import ServiceSettings, TenantPolicy

Replica = Callable[..., contextlib.AbstractContextManager[Running]]
"""``replica(**settings)``: one more replica of the service over the shared backend."""


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.05)


def _poll_until_done(client: httpx.Client, url: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        response = client.get(url)
        assert response.status_code == 200, response.text
        info: dict[str, Any] = response.json()
        if info["status"] != "running":
            return info
        assert time.monotonic() < deadline, f"still running: {info}"
        time.sleep(0.05)


def _service_log(caplog: pytest.LogCaptureFixture, sandbox_id: str) -> str:
    """What the replicas logged of one sandbox (its requests, expiry, adoption, reaping), with
    times: the evidence a rare failure needs, for which replica did what, and when."""
    lines = []
    for record in caplog.records:
        text = record.getMessage()
        if sandbox_id in text or getattr(record, "sandbox", None) == sandbox_id:
            lines.append(f"{record.created:.3f} {record.name}: {text}")
    return "\n".join(lines) or "(nothing logged of it)"


class ReplicaScenarios:
    """Two replicas, A and B, answering for the same sandboxes."""

    def history(self, sandbox_id: str, since: float) -> str:
        """What the backend itself tells of ``sandbox_id`` since ``since`` (for a failure's
        message); the Docker engine's events, for one."""
        return ""

    @pytest.fixture(scope="module")
    @classmethod
    def template(cls) -> dict[str, Any]:
        """The template, as a config file writes it (the subprocess replica reads it so)."""
        raise NotImplementedError

    @pytest.fixture(scope="module")
    @classmethod
    def owner(cls) -> str:
        raise NotImplementedError

    @pytest.fixture(scope="module")
    @classmethod
    def docker_client_for_service(cls) -> Any:
        """The engine client a Docker template's replica uses (``None``: its own)."""
        return None

    @pytest.fixture(scope="module")
    @classmethod
    def recorded(cls) -> Callable[[], dict[str, dict[str, str]]]:
        """Service id -> labels of every sandbox the backend holds for ``owner``."""
        raise NotImplementedError

    @pytest.fixture(scope="module")
    @classmethod
    def settings(
        cls, template: dict[str, Any], owner: str, tmp_path_factory: pytest.TempPathFactory
    ) -> Callable[..., ServiceSettings]:
        def make(**overrides: Any) -> ServiceSettings:
            options: dict[str, Any] = {"owner": owner, "templates": {"default": template}, "confirm_interval": 0}
            return settings_for(tmp_path_factory.mktemp("replica"), **{**options, **overrides})

        return make

    @pytest.fixture(scope="module")
    @classmethod
    def replica(cls, settings: Callable[..., ServiceSettings], docker_client_for_service: Any) -> Replica:
        def start(**overrides: Any) -> contextlib.AbstractContextManager[Running]:
            return running(settings(**overrides), docker_client=docker_client_for_service)

        return start

    @pytest.fixture(scope="module")
    @classmethod
    def pair(cls, replica: Replica) -> Iterator[tuple[Running, Running]]:
        with replica() as a, replica() as b:
            yield a, b

    @pytest.fixture
    def a(self, pair: tuple[Running, Running]) -> Iterator[httpx.Client]:
        with pair[0].client("alice") as client:
            yield client

    @pytest.fixture
    def b(self, pair: tuple[Running, Running]) -> Iterator[httpx.Client]:
        with pair[1].client("alice") as client:
            yield client

    # ------------------------------------------------------------------ every replica answers

    def test_made_on_one_replica_served_by_the_other(self, a: httpx.Client, b: httpx.Client) -> None:
        sandbox = create(a, ttl=300, labels={"role": "shared"}, env={"FROM_CREATE": "yes"})
        sandbox_id = sandbox["id"]
        assert b.get(f"/v1/sandboxes/{sandbox_id}").json() == sandbox  # the same record, read from the backend
        assert execute(b, sandbox_id, 'echo "$FROM_CREATE" > made-on-b; id -u')["output"] == "1000\n"
        read = a.post(f"/v1/sandboxes/{sandbox_id}/files/read", json={"file_path": f"{sandbox['workdir']}/made-on-b"})
        assert read.json()["file_data"]["content"] == "yes\n"
        assert [s["id"] for s in b.get("/v1/sandboxes").json()["sandboxes"]] == [sandbox_id]
        # A background process started on A is polled, and killed, on B: it lives in the sandbox.
        base = f"/v1/sandboxes/{sandbox_id}/processes"
        done = a.post(base, json={"command": "echo one; sleep 0.3; echo two; exit 3"}).json()
        finished = _poll_until_done(b, f"{base}/{done['id']}")
        assert (finished["status"], finished["output"], finished["result"]["exit_code"]) == (
            "exited",
            "one\ntwo\n",
            3,
        ), finished
        endless = a.post(base, json={"command": "echo up; sleep 100"}).json()
        _wait_for(lambda: b.get(f"{base}/{endless['id']}").json()["output"] == "up\n", "the process started")
        assert b.delete(f"{base}/{endless['id']}").json()["status"] == "killed"
        assert a.get(f"{base}/{endless['id']}").json()["status"] == "killed"
        assert b.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204

    def test_another_tenants_sandbox_is_a_404_on_every_replica(
        self, pair: tuple[Running, Running], a: httpx.Client
    ) -> None:
        sandbox = create(a, ttl=300)
        with pair[1].client("bob") as bob:
            assert bob.get(f"/v1/sandboxes/{sandbox['id']}").status_code == 404
            assert bob.post(f"/v1/sandboxes/{sandbox['id']}/execute", json={"command": "true"}).status_code == 404
            assert bob.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 404
            assert bob.get("/v1/sandboxes").json()["sandboxes"] == []
        assert execute(a, sandbox["id"], "echo still")["output"] == "still\n"
        assert a.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204

    def test_an_unknown_id_costs_one_lookup_and_only_after_the_rate_check(self, pair: tuple[Running, Running]) -> None:
        """Finding a sandbox this replica does not hold is a backend call: a tenant over its
        rate must not cost one, and a 404 must cost one, not one per route tried."""
        backend = pair[0].registry.backends["default"]
        lookups: list[dict[str, str]] = []
        select = backend.select

        def counted(**labels: str) -> Any:
            if "sandbox_id" in labels:
                lookups.append(labels)
            return select(**labels)

        backend.select = counted
        try:
            with pair[0].client("slow") as slow:  # 2 requests/s, a burst of 3
                url = "/v1/sandboxes/0123456789abcdef/execute"
                answers = [slow.post(url, json={"command": "true"}).status_code for _ in range(8)]
        finally:
            del backend.select
        assert set(answers) == {404, 429}, answers
        assert len(lookups) == answers.count(404)

    @pytest.mark.parametrize("hostile", ["x!", "a b", "a,io.sandboxes.tenant", "x" * 64, "\u00e9t\u00e9"])
    def test_an_id_that_no_sandbox_can_have_is_a_404_without_a_lookup(
        self, pair: tuple[Running, Running], a: httpx.Client, hostile: str
    ) -> None:
        """A sandbox's id is selected by label: one that is no label value (a Kubernetes
        selector refuses it with a 400) must not reach the backend, and is simply not found."""
        backend = pair[0].registry.backends["default"]
        lookups: list[dict[str, str]] = []
        select = backend.select

        def counted(**labels: str) -> Any:
            if "sandbox_id" in labels:  # not the replica's own sweeps
                lookups.append(labels)
            return select(**labels)

        backend.select = counted
        try:
            answers = [
                a.get(f"/v1/sandboxes/{hostile}"),
                a.post(f"/v1/sandboxes/{hostile}/execute", json={"command": "true"}),
                a.post(f"/v1/sandboxes/{hostile}/renew", json={"ttl": 60}),
                a.delete(f"/v1/sandboxes/{hostile}"),
            ]
        finally:
            del backend.select
        assert [(r.status_code, error_of(r)) for r in answers] == [(404, "not_found")] * 4, [r.text for r in answers]
        assert lookups == []

    def test_a_failed_adoption_is_a_503_and_the_next_request_adopts(
        self, pair: tuple[Running, Running], a: httpx.Client, b: httpx.Client
    ) -> None:
        """Attaching to a sandbox another replica made fails once (the backend errs): that
        request answers 503 ``backend_unavailable``, a listing leaves it out, the next adopts."""
        sandbox = create(a, ttl=300)
        backend = pair[1].registry.backends["default"]

        def fails(*args: Any) -> Any:
            raise RuntimeError("the backend failed (injected)")

        backend.attach = fails
        try:
            refused = b.get(f"/v1/sandboxes/{sandbox['id']}")
            listed = b.get("/v1/sandboxes")
        finally:
            del backend.attach
        assert (refused.status_code, error_of(refused)) == (503, "backend_unavailable"), refused.text
        assert listed.status_code == 200, listed.text
        assert b.get(f"/v1/sandboxes/{sandbox['id']}").json() == sandbox
        assert b.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204

    # ------------------------------------------------------------------ deletion and expiry

    def test_deleted_on_one_replica_is_a_404_on_the_other(
        self, a: httpx.Client, b: httpx.Client, recorded: Callable[[], dict[str, dict[str, str]]]
    ) -> None:
        sandbox = create(a, ttl=300)
        assert execute(a, sandbox["id"], "true")["exit_code"] == 0  # A holds a handle on it
        assert b.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
        assert sandbox["id"] not in recorded()
        assert a.get(f"/v1/sandboxes/{sandbox['id']}").status_code == 404
        refused = a.post(f"/v1/sandboxes/{sandbox['id']}/execute", json={"command": "true"})
        assert (refused.status_code, error_of(refused)) == (404, "not_found")
        assert a.get("/v1/sandboxes").json()["sandboxes"] == []
        assert a.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 404

    def test_a_deletion_whose_destroy_failed_is_not_undone_by_a_lookup(
        self, pair: tuple[Running, Running], a: httpx.Client, recorded: Callable[[], dict[str, dict[str, str]]]
    ) -> None:
        """The destroy fails (the engine or API server errs once): the deletion is answered, and
        the sweep retries it. Meanwhile the sandbox is still on the backend, where a lookup by
        id must not find and adopt it again: the tenant deleted it."""
        sandbox = create(a, ttl=300)
        backend = pair[0].registry.backends["default"]
        destroy = backend.destroy

        def fails_once(*args: Any) -> None:
            del backend.destroy
            raise RuntimeError("the backend failed (injected)")

        backend.destroy = fails_once
        assert a.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
        assert sandbox["id"] in recorded()  # not destroyed yet
        assert a.get(f"/v1/sandboxes/{sandbox['id']}").status_code == 404
        assert a.post(f"/v1/sandboxes/{sandbox['id']}/execute", json={"command": "true"}).status_code == 404
        assert sandbox["id"] not in [s["id"] for s in a.get("/v1/sandboxes").json()["sandboxes"]]
        assert backend.destroy == destroy
        _wait_for(lambda: sandbox["id"] not in recorded(), "the sweep destroyed it")

    def test_a_deletion_whose_destroy_fails_frees_its_quota_at_once(
        self, pair: tuple[Running, Running], recorded: Callable[[], dict[str, dict[str, str]]]
    ) -> None:
        """The tenant was told its sandbox is deleted: while the service still retries its
        destroy (the engine erring), the sandbox no longer counts against the tenant's quota
        (a create is not refused for it, nor told to wait for its expiry)."""
        with pair[0].client("tiny") as a:
            first = create(a, ttl=300)
            with _destroys_failing(pair[0].registry.backends["default"]):
                assert a.delete(f"/v1/sandboxes/{first['id']}").status_code == 204
                assert first["id"] in recorded()  # not destroyed: its destroy is retried
                second = a.post("/v1/sandboxes", json={"ttl": 300})
                assert second.status_code == 201, second.text
            assert a.delete(f"/v1/sandboxes/{second.json()['id']}").status_code == 204
        _wait_for(lambda: first["id"] not in recorded(), "the sweep destroyed it")

    def test_a_deletion_whose_destroy_fails_is_one_for_every_replica(
        self, pair: tuple[Running, Running], recorded: Callable[[], dict[str, dict[str, str]]]
    ) -> None:
        """A deletes, its destroy keeps failing (the sweep retries it, from A's memory): B, which
        held the sandbox or not, neither lists it, finds it, runs a command in it nor counts it
        against the quota (the deletion is on the record every replica reads, not in A's memory)."""
        with pair[0].client("tiny") as on_a, pair[1].client("tiny") as on_b:
            sandbox = create(on_a, ttl=300)
            assert execute(on_b, sandbox["id"], "true")["exit_code"] == 0  # B holds a handle on it
            with _destroys_failing(pair[0].registry.backends["default"]):
                assert on_a.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
                assert sandbox["id"] not in [s["id"] for s in on_b.get("/v1/sandboxes").json()["sandboxes"]]
                assert on_b.get(f"/v1/sandboxes/{sandbox['id']}").status_code == 404
                refused = on_b.post(f"/v1/sandboxes/{sandbox['id']}/execute", json={"command": "true"})
                assert (refused.status_code, error_of(refused)) == (404, "not_found")
                second = on_b.post("/v1/sandboxes", json={"ttl": 300})
                assert second.status_code == 201, second.text
                assert on_b.delete(f"/v1/sandboxes/{second.json()['id']}").status_code == 204
        _wait_for(lambda: sandbox["id"] not in recorded(), "a sweep destroyed it")

    def test_a_held_sandbox_deleted_elsewhere_is_dropped_by_the_sweep(self, replica: Replica, b: httpx.Client) -> None:
        """A replica that trusts what it holds for long (``confirm_interval``) still learns of
        a deletion elsewhere at its next sweep."""
        with replica(confirm_interval=3600) as trusting, trusting.client("alice") as client:
            sandbox = create(client, ttl=300)
            assert b.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
            _wait_for(lambda: sandbox["id"] not in trusting.registry._entries, "the sweep dropped it")
            assert client.get(f"/v1/sandboxes/{sandbox['id']}").status_code == 404

    def test_requests_finding_a_held_sandbox_unconfirmed_together_share_one_read(self, replica: Replica) -> None:
        """Once a held sandbox's ``confirm_interval`` passes, every request that comes before
        its record is read again waits for that one read, instead of each listing the backend
        (5-9 lists a second with 20 clients of one sandbox, at a confirm interval of 1 s)."""
        clients = 6
        with replica(confirm_interval=3600, sweep_interval=3600) as one, one.client("alice") as client:
            sandbox = create(client, ttl=300)
            registry, backend = one.registry, one.registry.backends["default"]
            lookups: list[dict[str, str]] = []
            all_waiting, release = threading.Event(), threading.Event()
            select, find, finding = backend.select, registry.find, []

            def held_back(**labels: str) -> Any:
                if labels.get("sandbox_id") == sandbox["id"]:
                    lookups.append(labels)
                    release.wait(30)
                return select(**labels)

            async def counted(tenant: Any, sandbox_id: str) -> Any:
                finding.append(sandbox_id)  # on the loop: it then reaches its confirmation at once
                if len(finding) == clients:
                    all_waiting.set()
                return await find(tenant, sandbox_id)

            backend.select, registry.find = held_back, counted
            registry._entries[sandbox["id"]].confirmed = time.monotonic() - 7200  # its trust lapsed
            try:
                with one.client("alice") as other, concurrent.futures.ThreadPoolExecutor(clients) as pool:
                    url = f"/v1/sandboxes/{sandbox['id']}/execute"
                    answers = [pool.submit(other.post, url, json={"command": "echo ok"}) for _ in range(clients)]
                    assert all_waiting.wait(30), f"{len(finding)} of {clients} requests reached the registry"
                    release.set()
                    results = [answer.result(timeout=60) for answer in answers]
            finally:
                release.set()
                del backend.select, registry.find
            assert [(r.status_code, r.json()["output"]) for r in results] == [(200, "ok\n")] * clients
            assert len(lookups) == 1, lookups
            assert client.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204

    def test_requests_going_round_held_sandboxes_unconfirmed_read_the_backend_twice(self, replica: Replica) -> None:
        """Requests that go round several held sandboxes, each found unconfirmed, read the
        backend twice in a ``confirm_interval`` (the second read lists them all and confirms
        every one), not once per sandbox: round-robin across 200 idle sandboxes paid one label-
        selected list of the engine per request (bench_density)."""
        with replica(confirm_interval=3600, sweep_interval=3600) as one, one.client("alice") as client:
            ids = [create(client, ttl=300)["id"] for _ in range(4)]
            registry, backend = one.registry, one.registry.backends["default"]
            reads: list[dict[str, str]] = []
            select = backend.select

            def counted(**labels: str) -> Any:
                reads.append(labels)
                return select(**labels)

            for sandbox_id in ids:
                registry._entries[sandbox_id].confirmed = time.monotonic() - 7200  # its trust lapsed
            backend.select = counted
            try:
                for _ in range(2):
                    for sandbox_id in ids:
                        assert client.get(f"/v1/sandboxes/{sandbox_id}").status_code == 200
            finally:
                del backend.select
            assert reads == [{"sandbox_id": ids[0]}, {}], reads
            for sandbox_id in ids:
                assert client.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204

    @pytest.mark.parametrize("sweep_interval", [0.2, 3600], ids=["sweeps", "timer-only"])
    def test_a_renewal_on_one_replica_is_honoured_by_the_others(
        self,
        replica: Replica,
        b: httpx.Client,
        recorded: Callable[[], dict[str, dict[str, str]]],
        sweep_interval: float,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """The creator's expiry timer, and its sweeps, re-read the record before reaping."""
        caplog.set_level(logging.INFO, logger="sandboxes.server")
        began = time.time()
        with replica(sweep_interval=sweep_interval) as creator, creator.client("alice") as a:
            sandbox = create(a, ttl=5)
            renewed = b.post(f"/v1/sandboxes/{sandbox['id']}/renew", json={"ttl": 120}).json()
            # The premise: renewed before it expired (a renewal racing the expiry is another
            # test's). With ttl=2 the creator reaped it once in a loaded CI run; when the renewal
            # landed was not recorded, so a late one now says so here.
            assert time.time() < sandbox["expires_at"], "the renewal came after the first expiry"
            assert renewed["expires_at"] >= sandbox["expires_at"] + 100
            # Past the first expiry (and, with sweeps, several of them after it): still there.
            _wait_for(lambda: time.time() > sandbox["expires_at"] + 1.5, "the first expiry passed", timeout=10)
            assert sandbox["id"] in recorded(), (
                f"reaped; created {sandbox['created_at']:.3f}, expiry {sandbox['expires_at']}, renewed to "
                f"{renewed['expires_at']}, now {time.time():.3f}\n{_service_log(caplog, sandbox['id'])}\n"
                f"{self.history(sandbox['id'], began)}"
            )
            assert a.get(f"/v1/sandboxes/{sandbox['id']}").json()["expires_at"] == renewed["expires_at"]
            assert execute(a, sandbox["id"], "echo alive")["output"] == "alive\n"
            assert a.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204

    def test_a_timer_a_little_early_reads_the_renewal_though_the_expiry_passes_meanwhile(
        self,
        settings: Callable[..., ServiceSettings],
        docker_client_for_service: Any,
        b: httpx.Client,
        recorded: Callable[[], dict[str, dict[str, str]]],
    ) -> None:
        """uvloop rounds a timer's delay to the millisecond: the creator's expiry timer fires up
        to about a millisecond before the expiry, and the expiry may pass while it runs. It must
        then read the record (renewed on B) before reaping, not take it as expired unread. The
        clock here moves a millisecond at every reading, from half a millisecond before it."""
        clock = _SteppingClock()
        with running(settings(sweep_interval=3600), docker_client=docker_client_for_service, clock=clock) as creator:
            with creator.client("alice") as a:
                sandbox = create(a, ttl=300)
            renewed = b.post(f"/v1/sandboxes/{sandbox['id']}/renew", json={"ttl": 3600}).json()
            registry = creator.registry
            assert registry._entries[sandbox["id"]].state.expires_at == sandbox["expires_at"]  # not read since
            clock.step_from(sandbox["expires_at"] - 0.0005, step=0.001)
            asyncio.run_coroutine_threadsafe(registry._expire(sandbox["id"]), registry._loop).result(30)
            assert sandbox["id"] in recorded(), "reaped on the expiry it held, its record unread"
            held = registry._entries[sandbox["id"]].state
            # The next check (at once: the expiry has passed now) reads the renewal.
            _wait_for(lambda: held.expires_at == renewed["expires_at"], "the creator read the renewal")
            assert sandbox["id"] in recorded()
        assert b.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204

    def test_a_renewal_acknowledged_during_a_sweep_elsewhere_is_not_reaped_by_it(
        self,
        settings: Callable[..., ServiceSettings],
        docker_client_for_service: Any,
        a: httpx.Client,
        recorded: Callable[[], dict[str, dict[str, str]]],
    ) -> None:
        """A sweep lists every record, then destroys what expired one by one (a pod's deletion
        takes seconds each): a renewal another replica acknowledged after the list must win."""
        clock = ManualClock()
        with running(settings(sweep_interval=3600), docker_client=docker_client_for_service, clock=clock) as late:
            sandbox = create(a, ttl=300)  # after the late replica's start: it does not hold it
            clock.advance(600)  # on the late replica's clock, it expired
            backend = late.registry.backends["default"]
            select, renewals = backend.select, []

            def renewed_right_after_the_list(**labels: str) -> Any:
                found = select(**labels)
                if not labels and not renewals:  # the sweep's list of every record
                    renewals.append(a.post(f"/v1/sandboxes/{sandbox['id']}/renew", json={"ttl": 3600}))
                return found

            backend.select = renewed_right_after_the_list
            try:
                late.sweep()
            finally:
                del backend.select
            assert renewals[0].status_code == 200, renewals[0].text
            assert sandbox["id"] in recorded()
        assert execute(a, sandbox["id"], "echo alive")["output"] == "alive\n"
        assert a.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204

    def test_a_renewal_acknowledged_while_a_replica_starts_is_not_reaped_by_it(
        self,
        settings: Callable[..., ServiceSettings],
        docker_client_for_service: Any,
        pair: tuple[Running, Running],
        a: httpx.Client,
        recorded: Callable[[], dict[str, dict[str, str]]],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """A starting replica lists every sandbox, then adopts or reaps each in turn: a renewal
        another replica acknowledged after that list must win there too."""
        sandbox = create(a, ttl=300)
        provider_class = type(pair[0].registry.backends["default"].provider)
        listed, renewals = provider_class.list, []

        def renewed_right_after_the_list(provider: Any) -> Any:
            found = listed(provider)
            if not renewals:
                renewals.append(a.post(f"/v1/sandboxes/{sandbox['id']}/renew", json={"ttl": 3600}))
            return found

        monkeypatch.setattr(provider_class, "list", renewed_right_after_the_list)
        clock = ManualClock()
        clock.advance(600)  # on the new replica's clock, the sandbox expired
        with running(settings(sweep_interval=3600), docker_client=docker_client_for_service, clock=clock) as late:
            monkeypatch.undo()
            assert renewals[0].status_code == 200, renewals[0].text
            assert sandbox["id"] in recorded()
            with late.client("alice") as client:
                assert (
                    client.get(f"/v1/sandboxes/{sandbox['id']}").json()["expires_at"]
                    == renewals[0].json()["expires_at"]
                )
        assert a.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204

    def test_a_sweep_listed_before_a_renewal_does_not_undo_it(self, replica: Replica) -> None:
        """A replica renews a sandbox while its own sweep is between its list and its use of it:
        the list's older expiry must not replace the renewal it answered."""
        with replica(confirm_interval=3600, sweep_interval=3600) as one, one.client("alice") as client:
            sandbox = create(client, ttl=300)
            backend = one.registry.backends["default"]
            select, renewals = backend.select, []

            def renewed_right_after_the_list(**labels: str) -> Any:
                found = select(**labels)
                if not labels and not renewals:
                    renewals.append(client.post(f"/v1/sandboxes/{sandbox['id']}/renew", json={"ttl": 3600}))
                return found

            backend.select = renewed_right_after_the_list
            try:
                one.sweep()
            finally:
                del backend.select
            renewed = renewals[0].json()["expires_at"]
            assert renewed > sandbox["expires_at"]
            assert client.get(f"/v1/sandboxes/{sandbox['id']}").json()["expires_at"] == renewed
            assert one.registry._entries[sandbox["id"]].state.expires_at == renewed
            assert client.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204

    def test_a_replica_reaps_what_expired_wherever_it_was_made(
        self, replica: Replica, pair: tuple[Running, Running], recorded: Callable[[], dict[str, dict[str, str]]]
    ) -> None:
        """Made by a replica that is gone since: the others' sweeps reap it at its expiry."""
        with replica() as gone, gone.client("alice") as client:
            sandbox = create(client, ttl=2)
            gone.registry._timers[sandbox["id"]].cancel()  # gone before its own timer fires
            gone.registry._sweeper.cancel()
        assert sandbox["id"] in recorded()
        _wait_for(lambda: sandbox["id"] not in recorded(), "a surviving replica reaped it")

    # ------------------------------------------------------------------ quotas

    def test_quota_is_counted_across_replicas(self, pair: tuple[Running, Running]) -> None:
        with pair[0].client("tiny") as a, pair[1].client("tiny") as b:
            first = create(a)
            refused = b.post("/v1/sandboxes", json={})
            assert (refused.status_code, error_of(refused)) == (429, "quota_exceeded")
            assert a.delete(f"/v1/sandboxes/{first['id']}").status_code == 204
            second = create(b)
            assert a.post("/v1/sandboxes", json={}).status_code == 429
            assert b.delete(f"/v1/sandboxes/{second['id']}").status_code == 204

    def test_quota_costs_each_sandbox_by_its_own_template(self, replica: Replica, template: dict[str, Any]) -> None:
        """Two templates of one backend list the same sandboxes; each costs its own cpus."""
        templates = {"default": template, "big": {**template, "cpus": 1.0}}
        tenants = {**POLICIES, "tiny": TenantPolicy(max_sandboxes=5, max_cpus=1.5, max_memory="4g")}
        with (
            replica(templates=templates, tenants=tenants) as one,
            replica(templates=templates, tenants=tenants) as two,
            one.client("tiny") as a,
            two.client("tiny") as b,
        ):
            made = [create(a, template="big")["id"], create(b)["id"]]  # 1.0 + 0.5 cpus
            refused = b.post("/v1/sandboxes", json={})
            assert (refused.status_code, error_of(refused)) == (429, "quota_exceeded")
            assert "1.5 cpus in use" in refused.json()["message"]
            for sandbox_id in made:
                assert a.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204

    def test_racing_creations_never_exceed_the_quota(
        self, pair: tuple[Running, Running], recorded: Callable[[], dict[str, dict[str, str]]]
    ) -> None:
        """``tiny`` may have one sandbox; A and B are asked for one each at the same instant.
        Both may be refused (each saw the other's), never both kept."""
        for _ in range(3):
            barrier = threading.Barrier(2)
            answers: list[httpx.Response] = []
            threads = [threading.Thread(target=_ask, args=(replica, barrier, answers)) for replica in pair]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120)
            made = [r.json()["id"] for r in answers if r.status_code == 201]
            assert all(r.status_code in (201, 429) for r in answers), [r.text for r in answers]
            assert len(made) <= 1, answers
            tinys = [sid for sid, labels in recorded().items() if labels.get("io.sandboxes.tenant") == "tiny"]
            assert tinys == made  # the refused newcomer was destroyed again
            with pair[0].client("tiny") as client:
                for sandbox_id in made:
                    assert client.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204

    # ------------------------------------------------------------------ restarts

    def test_a_new_replica_adopts_what_exists(
        self, replica: Replica, pair: tuple[Running, Running], a: httpx.Client
    ) -> None:
        sandbox = create(a, ttl=300, labels={"k": "v"})
        assert execute(a, sandbox["id"], "echo kept > note")["exit_code"] == 0
        state_files = pair[0].app.state.service.settings.data_dir / "state"
        assert not list(state_files.glob("*.json"))  # the sandbox is its own record
        with replica() as fresh, fresh.client("alice") as client:  # an empty data directory
            assert [s["id"] for s in client.get("/v1/sandboxes").json()["sandboxes"]] == [sandbox["id"]]
            assert client.get(f"/v1/sandboxes/{sandbox['id']}").json() == sandbox
            assert execute(client, sandbox["id"], "cat note")["output"] == "kept\n"
        assert a.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204

    def test_a_replica_killed_mid_request_loses_nothing(
        self, template: dict[str, Any], owner: str, tmp_path: Path, b: httpx.Client
    ) -> None:
        """``kill -9`` of a replica while a command runs through it: its sandbox and its
        background process live on, and another replica answers for both."""
        service = ServiceProcess(
            base_config(tmp_path / "data", owner=owner, templates={"default": template}, confirm_interval=0),
            tmp_path,
        )
        service.start()
        try:
            with service.client("alice") as client:
                sandbox = create(client, ttl=300)
                base = f"/v1/sandboxes/{sandbox['id']}/processes"
                process = client.post(base, json={"command": "echo one; sleep 1; echo two"}).json()
                # The request the kill interrupts, on a client of its own.
                threading.Thread(target=_interrupted, args=(service, sandbox["id"]), daemon=True).start()
                _wait_for(lambda: "sleep 30" in execute(b, sandbox["id"], "ps -eo args")["output"], "it runs")
            service.kill()
            finished = _poll_until_done(b, f"{base}/{process['id']}")
            assert (finished["status"], finished["output"]) == ("exited", "one\ntwo\n")
            assert execute(b, sandbox["id"], "echo on")["output"] == "on\n"
            assert b.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
        finally:
            service.stop()


class _SteppingClock(ManualClock):
    """A FAKE clock (`ManualClock`) that, once told to (`step_from`), moves ``step`` seconds
    forward at every reading: time passing while the registry runs, between two readings."""

    def __init__(self) -> None:
        super().__init__()
        self._step = 0.0

    def now(self) -> float:
        with self._lock:
            now = self._now
            self._now += self._step
            return now

    def step_from(self, when: float, step: float) -> None:
        with self._lock:
            assert when >= self._now, "a clock does not go back"
            self._now, self._step = when, step


@contextlib.contextmanager
def _destroys_failing(backend: Any) -> Iterator[None]:
    """Every destroy of ``backend`` fails while in it (the backend erring, injected): what is
    deleted meanwhile is left to the sweep's retries, which succeed once out of it."""

    def fails(*args: Any) -> None:
        raise RuntimeError("the backend failed (injected)")

    backend.destroy = fails
    try:
        yield
    finally:
        del backend.destroy


def _ask(replica: Running, barrier: threading.Barrier, answers: list[httpx.Response]) -> None:
    with replica.client("tiny") as client:
        barrier.wait()
        answers.append(client.post("/v1/sandboxes", json={}))


def _interrupted(service: ServiceProcess, sandbox_id: str) -> None:
    with service.client("alice") as client, contextlib.suppress(httpx.HTTPError):
        client.post(f"/v1/sandboxes/{sandbox_id}/execute", json={"command": "sleep 30"})


__all__ = ["ReplicaScenarios"]
