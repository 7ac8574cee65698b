"""Over real HTTP: sandbox lifecycle, TTLs (timers and the sweep), renewals, restarts that
lose nothing (in-process, and ``kill -9`` of a service subprocess), graceful draining, and the
operability surface (readiness, metrics, JSON logs).

TTLs are tested on a FAKE clock (`ManualClock`) the test moves, then a sweep: no sleeping until a TTL
passes. Two tests keep real short TTLs, so the real paths stay proven: the per-sandbox timer
(`test_ttl_expiry_by_timer`) and expiry while a killed service is down (`kill -9`)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import (
    ManualClock,
    Running,
    ServiceProcess,
    create,
    error_of,
    execute,
    running,
    settings_for,
    subprocess_config,
    wait_until_expired,
)

from sandboxes.local import _disk


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with running(settings_for(tmp_path_factory.mktemp("lifecycle"), max_ttl=600)) as svc:
        yield svc


@pytest.fixture
def client(service: Running) -> Iterator[httpx.Client]:
    with service.client("alice") as client:
        yield client


@pytest.fixture(scope="module")
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(scope="module")
def timed(tmp_path_factory: pytest.TempPathFactory, clock: ManualClock) -> Iterator[Running]:
    """A service whose TTLs run on ``clock``: time passes when a test advances it."""
    with running(settings_for(tmp_path_factory.mktemp("timed"), max_ttl=3600), clock=clock) as svc:
        yield svc


@pytest.fixture
def timed_client(timed: Running) -> Iterator[httpx.Client]:
    with timed.client("alice") as client:
        yield client


def _wait_gone(client: httpx.Client, sandbox_id: str, timeout: float = 10) -> float:
    started = time.monotonic()
    while client.get(f"/v1/sandboxes/{sandbox_id}").status_code != 404:
        assert time.monotonic() - started < timeout, f"{sandbox_id} still there after {timeout}s"
        time.sleep(0.05)
    return time.monotonic() - started


def _wait_removed(path: Path, timeout: float = 5) -> None:
    """An expired sandbox leaves the registry first (requests for it are 404 from then on),
    then its files are removed in a worker thread: they may outlive the first 404 briefly."""
    deadline = time.monotonic() + timeout
    while path.exists():
        assert time.monotonic() < deadline, f"{path} still there {timeout}s after its sandbox expired"
        time.sleep(0.05)


def _expired(client: httpx.Client) -> float:
    """The service's count of expired sandboxes, from its metrics."""
    (line,) = [line for line in client.get("/metrics").text.splitlines() if line.startswith("sandboxes_expired_total ")]
    return float(line.split()[1])


def test_create_list_get_renew_delete(client: httpx.Client) -> None:
    before = time.time()
    sandbox = create(client, ttl=120, labels={"purpose": "test"}, env={"FROM_CREATE": "yes"})
    assert sandbox["backend"] == "local"
    assert sandbox["template"] == "default"
    assert sandbox["labels"] == {"purpose": "test"}
    assert before <= sandbox["created_at"] <= time.time()
    assert sandbox["expires_at"] == pytest.approx(sandbox["created_at"] + 120, abs=2)
    assert Path(sandbox["workdir"]).is_dir()
    assert execute(client, sandbox["id"], 'echo "$FROM_CREATE"')["output"] == "yes\n"
    assert client.get(f"/v1/sandboxes/{sandbox['id']}").json() == sandbox
    assert sandbox in client.get("/v1/sandboxes").json()["sandboxes"]
    renewed = client.post(f"/v1/sandboxes/{sandbox['id']}/renew", json={"ttl": 300}).json()
    assert renewed["expires_at"] == pytest.approx(time.time() + 300, abs=2)
    capped = client.post(f"/v1/sandboxes/{sandbox['id']}/renew", json={"ttl": 10**6}).json()
    assert capped["expires_at"] == pytest.approx(time.time() + 600, abs=2)  # max_ttl
    assert client.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
    assert not Path(sandbox["workdir"]).exists()
    again = client.delete(f"/v1/sandboxes/{sandbox['id']}")
    assert (again.status_code, error_of(again)) == (404, "not_found")
    assert sandbox["id"] not in [s["id"] for s in client.get("/v1/sandboxes").json()["sandboxes"]]


def test_ttl_expiry_by_timer(client: httpx.Client, service: Running) -> None:
    sandbox = create(client, ttl=1)
    waited = _wait_gone(client, sandbox["id"])
    assert 0.5 < waited < 5
    _wait_removed(Path(sandbox["workdir"]))
    assert "sandboxes_expired_total" in client.get("/metrics").text


def test_the_periodic_sweep_runs_and_reaps_what_no_timer_will(
    timed_client: httpx.Client, timed: Running, clock: ManualClock
) -> None:
    """The sweep loop is running: nothing else removes this sandbox (its timer waits 300 real
    seconds; no test sweeps here), so its removal proves the loop ran."""
    sandbox = create(timed_client, ttl=300)
    clock.advance(301)  # a clock jump: expired, but its timer knows nothing of it
    _wait_gone(timed_client, sandbox["id"], timeout=5)  # sweeps every 0.2 s here
    _wait_removed(Path(sandbox["workdir"]))


def test_a_sweep_reaps_exactly_what_expired(timed_client: httpx.Client, timed: Running, clock: ManualClock) -> None:
    expired_before = _expired(timed_client)
    short = create(timed_client, ttl=100)
    long = create(timed_client, ttl=1000)
    assert short["expires_at"] == pytest.approx(clock.now() + 100)  # expiries are on the service's clock
    clock.advance(50)
    timed.sweep()
    assert timed_client.get(f"/v1/sandboxes/{short['id']}").status_code == 200  # not yet
    clock.advance(51)
    timed.sweep()
    assert timed_client.get(f"/v1/sandboxes/{short['id']}").status_code == 404
    assert not Path(short["workdir"]).exists()  # destroyed by the time the sweep returned
    assert execute(timed_client, long["id"], "echo alive")["output"] == "alive\n"
    assert _expired(timed_client) == expired_before + 1
    timed_client.delete(f"/v1/sandboxes/{long['id']}")


def test_a_sweep_returns_after_an_expiry_already_in_progress(timed_client: httpx.Client, timed: Running) -> None:
    """An expiry under way elsewhere (a timer's, the periodic sweep's: a pause at timeout moves
    the expiry before it pauses) is waited for, so the sweep a caller awaits has seen it done."""
    sandbox = create(timed_client, ttl=1000)
    registry, finished = timed.registry, threading.Event()
    entry = registry._entries[sandbox["id"]]

    async def expiring_elsewhere() -> None:
        async with entry.expiring:
            taken.set()
            await asyncio.sleep(0.3)
            finished.set()

    taken = threading.Event()
    elsewhere = asyncio.run_coroutine_threadsafe(expiring_elsewhere(), registry._loop)
    assert taken.wait(10)
    timed.sweep()
    assert finished.is_set()  # the sweep waited for it
    elsewhere.result(10)
    assert timed_client.get(f"/v1/sandboxes/{sandbox['id']}").status_code == 200  # not expired: kept
    timed_client.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_renew_keeps_a_sandbox_past_its_first_ttl(
    timed_client: httpx.Client, timed: Running, clock: ManualClock
) -> None:
    sandbox = create(timed_client, ttl=10)
    renewed = timed_client.post(f"/v1/sandboxes/{sandbox['id']}/renew", json={"ttl": 60}).json()
    assert renewed["expires_at"] == pytest.approx(clock.now() + 60)
    clock.advance(11)
    timed.sweep()
    assert timed_client.get(f"/v1/sandboxes/{sandbox['id']}").status_code == 200
    assert execute(timed_client, sandbox["id"], "echo alive")["output"] == "alive\n"
    clock.advance(50)
    timed.sweep()
    assert timed_client.get(f"/v1/sandboxes/{sandbox['id']}").status_code == 404  # the renewal's TTL, no more


def test_readiness_and_metrics(client: httpx.Client) -> None:
    sandbox = create(client)
    execute(client, sandbox["id"], "true")
    with client.stream("POST", f"/v1/sandboxes/{sandbox['id']}/execute/stream", json={"command": "true"}) as r:
        r.read()
    client.get("/v1/sandboxes/does-not-exist")
    metrics = client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert 'sandboxes_live{backend="local"} 1.0' in text
    assert 'sandboxes_create_seconds_count{backend="local"}' in text
    assert 'sandboxes_execute_seconds_count{backend="local",mode="sync"}' in text
    assert 'sandboxes_execute_seconds_count{backend="local",mode="stream"}' in text
    assert 'sandboxes_errors_total{code="not_found"}' in text
    client.delete(f"/v1/sandboxes/{sandbox['id']}")
    assert 'sandboxes_live{backend="local"} 0.0' in client.get("/metrics").text
    assert client.get("/readyz").json() == {"status": "ready"}


# ---------------------------------------------------------------------- restarts


def test_restart_adopts_live_sandboxes_and_reaps_expired_ones(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    clock = ManualClock()
    with running(settings, clock=clock) as first, first.client() as client:
        keep = create(client, ttl=300, labels={"k": "v"})
        short = create(client, ttl=100)
        client.post(
            f"/v1/sandboxes/{keep['id']}/files/write", json={"file_path": f"{keep['workdir']}/f", "content": "x"}
        )
        client.post(f"/v1/sandboxes/{keep['id']}/renew", json={"ttl": 200})
        renewed = client.get(f"/v1/sandboxes/{keep['id']}").json()
    clock.advance(101)  # `short` expires while no service runs
    with running(settings, clock=clock) as second, second.client() as client:
        listed = client.get("/v1/sandboxes").json()["sandboxes"]
        assert listed == [renewed]  # the renewal survived, the expired one did not
        read = client.post(f"/v1/sandboxes/{keep['id']}/files/read", json={"file_path": f"{keep['workdir']}/f"})
        assert read.json()["file_data"]["content"] == "x"
        assert not Path(short["workdir"]).exists()
        client.delete(f"/v1/sandboxes/{keep['id']}")


def test_kill_9_then_restart_loses_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    service = ServiceProcess(subprocess_config(data_dir), tmp_path)
    service.start()
    try:
        with service.client("alice") as alice, service.client("bob") as bob:
            kept = create(alice, ttl=300)
            execute(alice, kept["id"], "echo persisted > file.txt")
            bobs = create(bob, ttl=300)
            doomed = create(alice, ttl=2)
            deleted = create(alice, ttl=300)
            assert alice.delete(f"/v1/sandboxes/{deleted['id']}").status_code == 204
            request_id = alice.get("/v1/sandboxes").headers["x-request-id"]
        orphan = data_dir / "local" / "0123456789abcdef"  # a directory nobody remembers
        orphan.mkdir()
        deadline = time.monotonic() + 10  # the access line is written after the response is sent
        while not [line for line in service.log_lines() if line.get("request_id") == request_id]:
            assert time.monotonic() < deadline, "the access log never recorded the request"
            time.sleep(0.05)
        service.kill()
        access = [line for line in service.log_lines() if line.get("request_id") == request_id]
        assert access[0]["path"] == "/v1/sandboxes"
        assert access[0]["status"] == 200
        assert access[0]["tenant"] == "alice"
        wait_until_expired(doomed)  # while nobody runs
        service.start()
        with service.client("alice") as alice, service.client("bob") as bob:
            assert [s["id"] for s in alice.get("/v1/sandboxes").json()["sandboxes"]] == [kept["id"]]
            assert [s["id"] for s in bob.get("/v1/sandboxes").json()["sandboxes"]] == [bobs["id"]]
            assert execute(alice, kept["id"], "cat file.txt")["output"] == "persisted\n"
            assert alice.get(f"/v1/sandboxes/{doomed['id']}").status_code == 404
            assert bob.get(f"/v1/sandboxes/{kept['id']}").status_code == 404
        assert not Path(doomed["workdir"]).exists()
        assert not Path(deleted["workdir"]).exists()
        assert not orphan.exists()
        roots = sorted(Path(sandbox["workdir"]).name for sandbox in (kept, bobs))
        disks = [f"{root}{suffix}" for root in roots for suffix in (".sandbox-disk", ".sandbox-disk.d")]
        assert sorted(p.name for p in (data_dir / "local").iterdir()) == sorted(
            # each root and its record (and its disk image, where it has one), nothing else
            [*roots, *(f"{root}.json" for root in roots), *(disks if _disk.available() is None else [])]
        )
        assert sorted(p.stem for p in (data_dir / "state").glob("*.json")) == sorted([kept["id"], bobs["id"]])
    finally:
        service.stop()


# ---------------------------------------------------------------------- draining


def test_shutdown_drains_in_flight_requests(tmp_path: Path) -> None:
    outcome: dict[str, Any] = {}
    with running(settings_for(tmp_path), drain=20) as svc, svc.client() as client:
        sandbox = create(client)

        def slow_request() -> None:
            outcome["response"] = client.post(
                f"/v1/sandboxes/{sandbox['id']}/execute", json={"command": "sleep 1.5; echo finished"}
            )

        thread = threading.Thread(target=slow_request)
        thread.start()
        deadline = time.monotonic() + 10
        while svc.app.state.service.commands.running("alice") == 0:  # until the command runs
            assert time.monotonic() < deadline, "the request never started its command"
            time.sleep(0.01)
        svc.server.should_exit = True
        while True:  # until the listener is closed: no new connections while draining
            try:
                httpx.get(f"{svc.url}/healthz", timeout=2)
            except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
                break  # refused, or reset: taken into the backlog as the listener closed, never served
            assert time.monotonic() < deadline, "the service still accepts connections while draining"
            time.sleep(0.01)
        assert thread.is_alive(), "the command (1.5 s) ended before the drain was checked"
        thread.join(20)
    response = outcome["response"]
    assert response.status_code == 200
    assert response.json()["output"] == "finished\n"
