"""Over real HTTP, on the local and Docker backends: a streamed execute keeps a quiet connection alive with
keep-alives (empty ``output`` events), and its command outlives a lost stream: re-attached from the last offset
it saw, a client gets the rest of the output, byte for byte, and the exit."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from service_harness import (
    Running,
    alice_fixtures,
    create,
    error_of,
    execute,
    heartbeat,
    heartbeat_processes,
    heartbeat_stopped,
    running,
    settings_for,
    wait_beating,
)
from support import SESSION_OWNER

from sandboxes.docker import DockerTemplate

KEEPALIVE = 0.5


@pytest.fixture(scope="module", params=["local", "docker"])
def service(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """Local (commands waited on by threads) and Docker (awaited on the event loop, the output
    hook called there)."""
    data_dir = tmp_path_factory.mktemp(f"reattach-{request.param}")
    if request.param == "local":
        with running(settings_for(data_dir, stream_keepalive=KEEPALIVE)) as svc:
            yield svc
        return
    docker_client = request.getfixturevalue("docker_client")
    template = DockerTemplate(
        backend="docker",
        image=request.getfixturevalue("runtime_image"),
        cpus=0.5,
        memory="256m",
        labels={"io.sandboxes.test-session": SESSION_OWNER},
    )
    settings = settings_for(data_dir, owner=SESSION_OWNER, templates={"default": template}, stream_keepalive=KEEPALIVE)
    with running(settings, docker_client=docker_client) as svc:
        yield svc


client, sandbox = alice_fixtures()


def _events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    assert response.status_code == 200, response.read()
    for line in response.iter_lines():
        if line:
            yield json.loads(line)


def _attach(client: httpx.Client, sandbox_id: str, command_id: str, offset: int) -> list[dict[str, Any]]:
    url = f"/v1/sandboxes/{sandbox_id}/execute/{command_id}/stream"
    with client.stream("GET", url, params={"offset": offset}) as response:
        return list(_events(response))


def _text(events: list[dict[str, Any]]) -> str:
    return "".join(event["data"] for event in events if event["type"] == "output")


def _kind(event: dict[str, Any]) -> str:
    """``first`` (the command's id), ``keepalive``, ``output`` or ``exit``."""
    if event["type"] == "output" and not event["data"]:
        return "first" if "id" in event else "keepalive"
    return str(event["type"])


def test_a_quiet_command_streams_keepalives(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    """Between two outputs 2 s apart, with a keep-alive interval of 0.5 s, the stream is not silent."""
    url = f"/v1/sandboxes/{sandbox['id']}/execute/stream"
    with client.stream("POST", url, json={"command": "echo before; sleep 2; echo after"}) as response:
        events = list(_events(response))
    kinds = [_kind(event) for event in events]
    assert kinds[0] == "first", kinds
    assert kinds[-1] == "exit", kinds
    assert _text(events) == "before\nafter\n"
    outputs = [i for i, kind in enumerate(kinds) if kind == "output"]
    between = kinds[outputs[0] + 1 : outputs[-1]]
    assert between.count("keepalive") >= 2, kinds
    assert {event["offset"] for event in events[outputs[0] + 1 : outputs[-1]]} == {len("before\n")}
    assert events[-1]["result"]["exit_code"] == 0


def test_a_dropped_stream_reattaches_with_no_byte_lost_or_twice(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    """The client walks away after the first output; the command runs to its end regardless,
    and the stream re-attached at the last offset seen carries exactly the rest."""
    sandbox_id = sandbox["id"]
    # Multi-byte characters cut across writes: offsets count bytes, events carry whole characters.
    command = "for i in $(seq 1 30); do printf 'l\\303'; sleep 0.02; printf '\\251-%s\\n' $i; done; exit 3"
    expected = "".join(f"lé-{i}\n" for i in range(1, 31))
    seen: list[dict[str, Any]] = []
    with client.stream("POST", f"/v1/sandboxes/{sandbox_id}/execute/stream", json={"command": command}) as response:
        for event in _events(response):
            seen.append(event)
            if _kind(event) == "output":
                break  # the connection is lost mid-command
    start, first = seen[0], seen[-1]
    assert _kind(start) == "first"
    assert start["offset"] == 0
    assert first["offset"] == len(first["data"].encode())
    rest = _attach(client, sandbox_id, start["id"], first["offset"])
    assert rest[0] == {"type": "output", "data": "", "id": start["id"], "offset": first["offset"]}
    assert first["data"] + _text(rest) == expected
    result = rest[-1]["result"]
    assert rest[-1]["type"] == "exit"
    assert result["exit_code"] == 3, result
    assert result["output"] == expected
    # Once it ended, it can still be read again, from any offset.
    assert _text(_attach(client, sandbox_id, start["id"], 0)) == expected
    assert _text(_attach(client, sandbox_id, start["id"], len(expected.encode()))) == ""


def test_a_streamed_command_outlives_its_client(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    """Not killed when its client leaves: it runs until its own timeout, then ends as timed out."""
    sandbox_id, workdir = sandbox["id"], sandbox["workdir"]
    beat = f"{workdir}/beat-reattach"
    body = {"command": f"echo started; {heartbeat(beat)}", "timeout": 5}
    with client.stream("POST", f"/v1/sandboxes/{sandbox_id}/execute/stream", json=body) as response:
        command_id = next(_events(response)).get("id")  # then leave
    wait_beating(client, sandbox_id, beat)  # it beats on after its client left
    assert heartbeat_processes(client, sandbox_id, beat), "the command died with its stream"
    assert command_id is not None
    events = _attach(client, sandbox_id, command_id, 0)
    assert _text(events) == "started\n"
    assert events[-1]["result"]["error"] == "timeout", events[-1]


def test_reattach_refuses_what_it_cannot_follow(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    sandbox_id = sandbox["id"]
    missing = client.get(f"/v1/sandboxes/{sandbox_id}/execute/{'0' * 32}/stream")
    assert missing.status_code == 404
    assert error_of(missing) == "not_found"
    with client.stream("POST", f"/v1/sandboxes/{sandbox_id}/execute/stream", json={"command": "printf abc"}) as r:
        command_id = next(_events(r))["id"]
    past = client.get(f"/v1/sandboxes/{sandbox_id}/execute/{command_id}/stream", params={"offset": 10**9})
    assert past.status_code == 422, past.text
    assert error_of(past) == "invalid_request"
    assert execute(client, sandbox_id, "true")["exit_code"] == 0
    elsewhere = create(client)
    try:
        other = client.get(f"/v1/sandboxes/{elsewhere['id']}/execute/{command_id}/stream")
        assert other.status_code == 404, "a command is found only in its own sandbox"
    finally:
        client.delete(f"/v1/sandboxes/{elsewhere['id']}")


def test_a_detached_streamed_command_is_killed_with_its_whole_tree(
    client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    """Its client left; ``DELETE .../execute/{id}`` kills it, a tree that left its session too,
    and answers its result; a second kill answers the same result, and kills nothing more."""
    sandbox_id, workdir = sandbox["id"], sandbox["workdir"]
    beat, escaped = f"{workdir}/beat-kill", f"{workdir}/beat-kill-setsid"
    command = f"echo started; (setsid sh -c {shlex.quote(heartbeat(escaped))} &); {heartbeat(beat)}"
    with client.stream("POST", f"/v1/sandboxes/{sandbox_id}/execute/stream", json={"command": command}) as response:
        command_id = next(_events(response))["id"]  # then leave
    wait_beating(client, sandbox_id, beat)
    wait_beating(client, sandbox_id, escaped)
    killed = client.delete(f"/v1/sandboxes/{sandbox_id}/execute/{command_id}")
    assert killed.status_code == 200, killed.text
    result = killed.json()
    assert result["output"] == "started\n"
    assert result["exit_code"] != 0 or result["error"] is not None, result
    deadline = time.monotonic() + 10
    while not (heartbeat_stopped(client, sandbox_id, beat) and heartbeat_stopped(client, sandbox_id, escaped)):
        assert time.monotonic() < deadline, "the killed command's tree kept running"
    again = client.delete(f"/v1/sandboxes/{sandbox_id}/execute/{command_id}")
    assert (again.status_code, again.json()) == (200, result)
    events = _attach(client, sandbox_id, command_id, 0)
    assert events[-1] == {"type": "exit", "result": result}


def test_a_kill_finds_only_the_sandboxs_own_streamed_commands(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    missing = client.delete(f"/v1/sandboxes/{sandbox['id']}/execute/{'0' * 32}")
    assert (missing.status_code, error_of(missing)) == (404, "not_found")
    with client.stream("POST", f"/v1/sandboxes/{sandbox['id']}/execute/stream", json={"command": "echo x"}) as r:
        command_id = next(_events(r))["id"]
    elsewhere = create(client)
    try:
        other = client.delete(f"/v1/sandboxes/{elsewhere['id']}/execute/{command_id}")
        assert (other.status_code, error_of(other)) == (404, "not_found")
    finally:
        client.delete(f"/v1/sandboxes/{elsewhere['id']}")
