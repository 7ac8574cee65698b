"""A streamed command outlives a ``kill -9`` of the service (Docker): it runs on in the sandbox
meanwhile, and the restarted service re-streams the rest of its output, exactly once, and its
exit from the sandbox's record of it (`sandboxes.server.recorded`), through the HTTP route and
through the client's `RemoteSandbox.attach_stream`, and kills one by its record. So too when the
service lives on but lost its connection to the sandbox's exec helper under the command. A local
jail dies with the service that holds it: there the re-attach says it is gone."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import (
    KEYS,
    ServiceProcess,
    create,
    error_of,
    execute,
    running,
    settings_for,
    subprocess_config,
)
from support import SESSION_OWNER

from sandboxes import protocol as p
from sandboxes.client import SandboxClient
from sandboxes.docker import DockerTemplate

CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}
GO = "/tmp/go-on"
COMMAND = f"echo one; echo err >&2; until [ -e {GO} ]; do sleep 0.05; done; echo two; exit 7"
"""Prints, waits for the test (after the restart) to let it go on, prints again."""
ENDLESS = "echo forever; sleep 120"
"""Runs until killed."""


def _events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    assert response.status_code == 200, response.read()
    for line in response.iter_lines():
        if line:
            yield json.loads(line)


def _pieces(events: list[dict[str, Any]]) -> list[tuple[str | None, str, int]]:
    """The output events as ``(stream, text, offset after it)``, runs of one stream joined."""
    pieces: list[tuple[str | None, str, int]] = []
    for event in events:
        if event["type"] != "output" or not event.get("data"):
            continue
        if pieces and pieces[-1][0] == event.get("stream"):
            pieces[-1] = (event.get("stream"), pieces[-1][1] + event["data"], event["offset"])
        else:
            pieces.append((event.get("stream"), event["data"], event["offset"]))
    return pieces


def _start(
    client: httpx.Client, sandbox_id: str, command: str, printed: str
) -> tuple[str, int, str, list[dict[str, Any]]]:
    """Start ``command`` streamed; (its id, the offset after it ``printed``, what it printed,
    the events), read off the stream, which stays open (the service is killed under it)."""
    seen, offset, command_id, events = "", 0, None, []
    with client.stream("POST", f"/v1/sandboxes/{sandbox_id}/execute/stream", json={"command": command}) as response:
        for event in _events(response):
            events.append(event)
            command_id = event.get("id", command_id)
            seen += event.get("data") or ""
            offset = event.get("offset", offset)
            if sorted(seen.splitlines()) == sorted(printed.splitlines()):
                break
    assert command_id is not None
    return command_id, offset, seen, events


@contextlib.contextmanager
def _restarted(
    tmp_path: Path, template: dict[str, Any]
) -> Iterator[tuple[ServiceProcess, dict[str, Any], str, int, str, list[dict[str, Any]]]]:
    """A service that ran `COMMAND` and `ENDLESS`, streamed, and was killed (``kill -9``) then
    restarted meanwhile: (it, the sandbox, `COMMAND`'s id and last offset seen, `ENDLESS`'s id,
    `COMMAND`'s events before the kill)."""
    owner = f"{SESSION_OWNER}-rs-{uuid.uuid4().hex[:6]}"
    config = subprocess_config(tmp_path / "data", owner=owner, templates={"default": template}, stream_keepalive=0.5)
    service = ServiceProcess(config, tmp_path)
    service.start()
    try:
        with service.client("alice") as alice:
            sandbox = create(alice, ttl=300)
            command_id, offset, seen, live = _start(alice, sandbox["id"], COMMAND, "one\nerr\n")
            endless = _start(alice, sandbox["id"], ENDLESS, "forever\n")[0]
        assert sorted(seen.splitlines()) == ["err", "one"]
        assert {(stream, text) for stream, text, _ in _pieces(live)} == {(None, "one\n"), ("stderr", "err\n")}
        service.kill()
        service.start()
        yield service, sandbox, command_id, offset, endless, live
    finally:
        service.stop()


@pytest.fixture
def docker_template(docker_client: Any, runtime_image: str) -> dict[str, Any]:
    return {"backend": "docker", "image": runtime_image, "cpus": 0.5, "memory": "256m", "labels": CLEANUP}


def test_a_streamed_command_is_re_streamed_after_a_kill_9_of_the_service(
    tmp_path: Path, docker_template: dict[str, Any]
) -> None:
    # The command waits for a file made after the restart: "two" proves it ran on meanwhile.
    with _restarted(tmp_path, docker_template) as (service, sandbox, command_id, offset, endless, live):
        sandbox_id = sandbox["id"]
        url = f"/v1/sandboxes/{sandbox_id}/execute/{command_id}/stream"
        with service.client("alice") as alice:
            assert execute(alice, sandbox_id, f"touch {GO}")["exit_code"] == 0
            with alice.stream("GET", url, params={"offset": offset}) as response:
                events = list(_events(response))
            assert events[0] == {"type": "output", "data": "", "id": command_id, "offset": offset}
            assert "".join(event.get("data") or "" for event in events) == "two\n"  # the rest, exactly once
            assert {event.get("stream") for event in events if event.get("data")} == {None}  # stdout, as live
            # From the start, and from the middle: each stream's text as the live stream sent it, once.
            whole = _pieces([*live, {"type": "output", "data": "two\n", "offset": offset + 4}])
            with alice.stream("GET", url, params={"offset": 0}) as response:
                assert _pieces(list(_events(response))) == whole
            middle = _pieces(live)[0][2]
            with alice.stream("GET", url, params={"offset": middle}) as response:
                assert _pieces(list(_events(response))) == whole[1:]
            assert events[-1]["type"] == "exit"
            result = events[-1]["result"]
            assert result["exit_code"] == 7, result
            assert sorted(result["output"].splitlines()) == ["err", "one", "two"]
            # Read again from the start, through the client.
            with SandboxClient(service.url, KEYS["alice"]) as client:
                stream = client.attach(sandbox_id).attach_stream(command_id, 0)
                items = list(stream)
            final = items[-1]
            assert isinstance(final, p.ExecuteResponse)
            assert final.exit_code == 7
            assert sorted("".join(str(item) for item in items[:-1]).splitlines()) == ["err", "one", "two"]
            missing = alice.get(f"/v1/sandboxes/{sandbox_id}/execute/{'0' * 32}/stream")
            assert (missing.status_code, error_of(missing)) == (404, "not_found")
            # A command the restarted service never held is killed by its record's marker.
            killed = alice.delete(f"/v1/sandboxes/{sandbox_id}/execute/{endless}")
            assert killed.status_code == 200, killed.text
            assert (killed.json()["output"], killed.json()["exit_code"]) == ("forever\n", 137)
            assert alice.delete(f"/v1/sandboxes/{sandbox_id}/execute/{endless}").json() == killed.json()
            assert alice.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204


def test_a_local_jails_streamed_command_dies_with_the_service(tmp_path: Path) -> None:
    """The jail is the service's child (``bwrap --die-with-parent``): nothing ran on to re-attach to."""
    with _restarted(tmp_path, {"default_timeout": 30}) as (service, sandbox, command_id, offset, _, _):
        url = f"/v1/sandboxes/{sandbox['id']}/execute/{command_id}/stream"
        with service.client("alice") as alice:
            gone = alice.get(url, params={"offset": offset})
            assert (gone.status_code, error_of(gone)) == (404, "not_found")
            assert alice.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204


def test_a_streamed_command_whose_helper_connection_broke_is_followed_from_its_record(
    tmp_path: Path, docker_client: Any, runtime_image: str
) -> None:
    template = DockerTemplate(backend="docker", image=runtime_image, cpus=0.5, memory="256m", labels=CLEANUP)
    settings = settings_for(tmp_path, owner=SESSION_OWNER, templates={"default": template}, stream_keepalive=0.5)
    with running(settings, docker_client=docker_client) as svc, svc.client("alice") as alice:
        sandbox_id = create(alice)["id"]
        try:
            endless = _start(alice, sandbox_id, ENDLESS, "forever\n")[0]
            url = f"/v1/sandboxes/{sandbox_id}/execute/stream"
            with alice.stream("POST", url, json={"command": COMMAND}) as response:
                events = _events(response)
                command_id, offset = next(events)["id"], 0
                for event in events:
                    offset = event.get("offset", offset)
                    if event.get("data") and offset >= len("one\nerr\n"):
                        break
                helper = svc.registry._entries[sandbox_id].sandbox.running_helper()
                assert helper is not None
                helper.close("the test broke the connection")  # the helper lives on
                last = list(events)[-1]
            assert last["result"]["error"] == "connection_lost", last
            assert execute(alice, sandbox_id, f"touch {GO}")["exit_code"] == 0
            attached = f"/v1/sandboxes/{sandbox_id}/execute/{command_id}/stream"
            with alice.stream("GET", attached, params={"offset": offset}) as response:
                rest = list(_events(response))
            assert "".join(event.get("data") or "" for event in rest) == "two\n"
            assert {event.get("stream") for event in rest if event.get("data")} == {None}
            assert rest[-1]["result"]["exit_code"] == 7, rest[-1]
            killed = alice.delete(f"/v1/sandboxes/{sandbox_id}/execute/{endless}")
            assert (killed.status_code, killed.json()["exit_code"]) == (200, 137), killed.text
        finally:
            alice.delete(f"/v1/sandboxes/{sandbox_id}")
