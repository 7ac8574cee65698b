"""Over real HTTP: what one tenant's commands may hold of the service. Its running commands are
capped (a 429 past the cap), so it cannot take the threads that wait on every tenant's
commands; background processes' output lives in their sandbox, capped per process."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from service_harness import (
    Running,
    create,
    error_of,
    execute,
    heartbeat,
    heartbeat_stopped,
    running,
    settings_for,
)
from support import SESSION_OWNER

from sandboxes.docker import DockerTemplate
from sandboxes.server.settings import TenantPolicy

CAP = 3
THREADS = 6


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    settings = settings_for(
        tmp_path_factory.mktemp("quotas"),
        tenants={
            "alice": TenantPolicy(max_commands=CAP),
            "bob": TenantPolicy(max_commands=CAP),
            "tiny": TenantPolicy(),
        },
        worker_threads=THREADS,
        command_threads=THREADS,
        command_slot_wait=0.5,  # past the cap a command waits this long, then is refused
        max_output_bytes=512 << 10,
    )
    with running(settings) as svc:
        yield svc


def _wait_for(condition: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_one_tenant_cannot_stall_another(service: Running) -> None:
    """Alice asks for twice as many long commands as there are threads; Bob's execute must not
    wait for any of them, and Alice is told 429 for those past her cap."""
    with service.client("alice") as alice, service.client("bob") as bob:
        mine, theirs = create(alice), create(bob)
        url = f"/v1/sandboxes/{mine['id']}/execute"
        release = f"{mine['workdir']}/release"
        command = f"while [ ! -e {release} ]; do sleep 0.05; done"  # runs until the test ends it
        try:
            with ThreadPoolExecutor(2 * THREADS) as pool:
                answers = [pool.submit(alice.post, url, json={"command": command}) for _ in range(2 * THREADS)]
                _wait_for(lambda: sum(a.done() for a in answers) >= 2 * THREADS - CAP)
                refused = [a.result() for a in answers if a.done()]
                assert {(r.status_code, error_of(r)) for r in refused} == {(429, "rate_limited")}
                assert "already runs 3 commands" in refused[0].json()["message"]
                assert refused[0].headers["retry-after"] == "1"
                started = time.monotonic()
                with httpx.Client(base_url=service.url, headers=bob.headers, timeout=5) as quick:
                    answer = quick.post(f"/v1/sandboxes/{theirs['id']}/execute", json={"command": "echo fine"})
                assert answer.json()["output"] == "fine\n"
                assert time.monotonic() - started < 3
                # background processes count too
                refused_bg = alice.post(f"/v1/sandboxes/{mine['id']}/processes", json={"command": "true"})
                assert (refused_bg.status_code, error_of(refused_bg)) == (429, "rate_limited")
                alice.post(
                    f"/v1/sandboxes/{mine['id']}/files/write", json={"file_path": release, "content": ""}
                ).raise_for_status()
                assert [a.result().json()["exit_code"] for a in answers if a.result().status_code == 200] == [0] * CAP
            # the slots are back once the commands ended
            _wait_for(lambda: service.app.state.service.commands.running("alice") == 0)
            assert execute(alice, mine["id"], "echo again")["output"] == "again\n"
        finally:
            alice.post(f"/v1/sandboxes/{mine['id']}/files/write", json={"file_path": release, "content": ""})
            alice.delete(f"/v1/sandboxes/{mine['id']}")
            bob.delete(f"/v1/sandboxes/{theirs['id']}")


def test_streamed_and_background_commands_release_their_slots(service: Running) -> None:
    with service.client("alice") as alice:
        sandbox = create(alice)
        try:
            for _ in range(2 * CAP):
                with alice.stream(
                    "POST", f"/v1/sandboxes/{sandbox['id']}/execute/stream", json={"command": "echo s"}
                ) as stream:
                    assert stream.status_code == 200
                    assert b'"exit"' in stream.read()
                started = alice.post(f"/v1/sandboxes/{sandbox['id']}/processes", json={"command": "echo b"})
                assert started.status_code == 202, started.text
                poll = f"/v1/sandboxes/{sandbox['id']}/processes/{started.json()['id']}"
                _wait_for(lambda url=poll: alice.get(url).json()["status"] == "exited")
            _wait_for(lambda: service.app.state.service.commands.running("alice") == 0)
        finally:
            alice.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_background_output_lives_in_the_sandbox_not_in_a_service_budget(service: Running) -> None:
    """Five finished processes of 400 KB each, 2 MB together: each keeps its whole output, in the
    sandbox, however many ran before it."""
    size = 400_000
    with service.client("tiny") as tiny:
        sandbox = create(tiny)
        try:
            polls = [_run_to_end(tiny, sandbox["id"], f"head -c {size} /dev/zero | tr '\\0' a") for _ in range(5)]
            infos = [tiny.get(poll).json() for poll in polls]
            assert [(info["status"], info["result"]["exit_code"]) for info in infos] == [("exited", 0)] * 5
            assert all(info["output"] == "a" * size and not info["result"]["truncated"] for info in infos)
        finally:
            tiny.delete(f"/v1/sandboxes/{sandbox['id']}")


def _run_to_end(client: httpx.Client, sandbox_id: str, command: str, **body: Any) -> str:
    started = client.post(f"/v1/sandboxes/{sandbox_id}/processes", json={"command": command, **body})
    assert started.status_code == 202, started.text
    poll = f"/v1/sandboxes/{sandbox_id}/processes/{started.json()['id']}"
    _wait_for(lambda: client.get(poll).json()["status"] != "running")
    return poll


def test_background_output_is_capped_per_process_and_the_process_runs_on(service: Running) -> None:
    """A process printing 2 MB with an output limit of 100 KB keeps running past the limit (no
    SIGPIPE): it finishes with its own exit code, its head and its tail kept, the middle dropped
    and counted."""
    command = "head -c 2000000 /dev/zero | tr '\\0' m; echo; echo tail-line; exit 7"
    with service.client("alice") as alice:
        sandbox = create(alice)
        try:
            info = alice.get(_run_to_end(alice, sandbox["id"], command, output_limit=100_000)).json()
            assert (info["status"], info["result"]["exit_code"], info["result"]["truncated"]) == ("exited", 7, True)
            output = info["output"]
            assert output.startswith("m" * 50_000)
            assert output.endswith("m\ntail-line\n")
            dropped = int(re.search(r"\[(\d+) bytes of output truncated\]", output).group(1))  # type: ignore[union-attr]
            kept = len(output.encode()) - len(re.search(r"\n\.\.\. \[.*\] \.\.\.\n", output).group(0))  # type: ignore[union-attr]
            assert kept + dropped == 2_000_000 + len("\ntail-line\n")
            assert kept <= 100_000
        finally:
            alice.delete(f"/v1/sandboxes/{sandbox['id']}")


@pytest.fixture(scope="module")
def docker_service(
    docker_client: Any, runtime_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    template = DockerTemplate(
        backend="docker",
        image=runtime_image,
        cpus=0.5,
        memory="256m",
        labels={"io.sandboxes.test-session": SESSION_OWNER},
    )
    settings = settings_for(
        tmp_path_factory.mktemp("quotas-docker"),
        owner=SESSION_OWNER,
        templates={"default": template},
        tenants={"alice": TenantPolicy(max_commands=4 * THREADS)},
        command_threads=2,
    )
    with running(settings, docker_client=docker_client) as svc:
        yield svc


def test_running_docker_commands_hold_no_thread(docker_service: Running) -> None:
    """Three times as many long commands as command threads, within the tenant's cap: they are
    awaited, not waited on by threads, so another tenant's command still runs at once."""
    with docker_service.client("alice") as alice, docker_service.client("bob") as bob:
        mine, theirs = create(alice), create(bob)
        release = "/workspace/release"
        try:
            execute(alice, mine["id"], "true")  # the exec helpers are up
            execute(bob, theirs["id"], "true")
            url = f"/v1/sandboxes/{mine['id']}/execute"
            command = f"echo started >> /workspace/log; while [ ! -e {release} ]; do sleep 0.05; done; echo done"
            with ThreadPoolExecutor(3 * 2) as pool:
                answers = [pool.submit(alice.post, url, json={"command": command}) for _ in range(3 * 2)]
                _wait_for(lambda: execute(bob, theirs["id"], "true")["exit_code"] == 0)
                _wait_for(lambda: execute(alice, mine["id"], "cat log 2>/dev/null | wc -l")["output"].strip() == "6")
                started = time.monotonic()
                with httpx.Client(base_url=docker_service.url, headers=bob.headers, timeout=5) as quick:
                    answer = quick.post(f"/v1/sandboxes/{theirs['id']}/execute", json={"command": "echo fine"})
                assert answer.json()["output"] == "fine\n"
                assert time.monotonic() - started < 3
                assert not any(a.done() for a in answers)
                execute(alice, mine["id"], f"touch {release}")
                assert [a.result().json()["output"] for a in answers] == ["done\n"] * 6
            _wait_for(lambda: docker_service.app.state.service.commands.running("alice") == 0)
        finally:
            execute(alice, mine["id"], f"touch {release}")
            alice.delete(f"/v1/sandboxes/{mine['id']}")
            bob.delete(f"/v1/sandboxes/{theirs['id']}")


def test_awaited_docker_commands_keep_their_semantics(docker_service: Running) -> None:
    """Timeouts kill, big stdin arrives whole, the tree carries its marker, streams stream, and
    a client that leaves has its command killed: on the awaited path as on the thread path."""
    with docker_service.client("alice") as alice:
        sandbox = create(alice)
        sandbox_id = sandbox["id"]
        try:
            execute(alice, sandbox_id, "true")  # the helper is up: what follows is awaited
            timed = execute(alice, sandbox_id, "echo before; sleep 30", timeout=1)
            assert (timed["error"], timed["output"]) == ("timeout", "before\n")
            assert timed["duration_ms"] < 10_000
            survivors = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done | grep -cx 'sleep 30 '"
            assert execute(alice, sandbox_id, survivors)["output"] == "0\n"
            stdin = bytes(range(256)) * 4096  # 1 MiB, sent from a thread
            counted = execute(
                alice,
                sandbox_id,
                'wc -c; echo "$SANDBOXES_EXEC_ID"',
                stdin_b64=base64.b64encode(stdin).decode(),
            )
            size, marker = counted["output"].split()
            assert size == str(len(stdin))
            assert re.fullmatch("[0-9a-f]{32}", marker)  # the service's token, not the helper's own marker
            with alice.stream(
                "POST", f"/v1/sandboxes/{sandbox_id}/execute/stream", json={"command": "echo one; sleep 0.3; echo two"}
            ) as stream:
                lines = [json.loads(line) for line in stream.iter_lines() if line]
            assert "".join(e["data"] for e in lines if e["type"] == "output") == "one\ntwo\n"
            assert lines[-1]["type"] == "exit"
            beat = heartbeat("/workspace/beat")
            impatient = httpx.Client(
                base_url=docker_service.url, headers=alice.headers, timeout=httpx.Timeout(30, read=1.5)
            )
            with impatient, pytest.raises(httpx.ReadTimeout):
                impatient.post(f"/v1/sandboxes/{sandbox_id}/execute", json={"command": beat, "timeout": 120})

            _wait_for(lambda: heartbeat_stopped(alice, sandbox_id, "/workspace/beat"))
            _wait_for(lambda: docker_service.app.state.service.commands.running("alice") == 0)
        finally:
            alice.delete(f"/v1/sandboxes/{sandbox_id}")
