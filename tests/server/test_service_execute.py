"""Over real HTTP: execute (sync and streamed), timeouts that kill process trees, and
background processes (start, poll, kill), on the local backend."""

from __future__ import annotations

import base64
import json
import shlex
import socket
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from processes_apart import assert_background_streams_apart
from service_harness import (
    Running,
    alice_fixtures,
    assert_a_left_warm_command_is_killed,
    assert_commands_run_warm_with_the_services_markers,
    error_of,
    execute,
    heartbeat,
    heartbeat_processes,
    heartbeat_stopped,
    running,
    settings_for,
    wait_beating,
)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with running(settings_for(tmp_path_factory.mktemp("execute"), max_processes=2, max_output_bytes=200_000)) as svc:
        yield svc


client, sandbox = alice_fixtures()


def _stream(client: httpx.Client, sandbox_id: str, command: str, **body: Any) -> list[tuple[float, dict[str, Any]]]:
    """Events with their arrival times."""
    events = []
    with client.stream("POST", f"/v1/sandboxes/{sandbox_id}/execute/stream", json={"command": command, **body}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        for line in r.iter_lines():
            if line:
                events.append((time.monotonic(), json.loads(line)))
    return events


# ---------------------------------------------------------------------- sync


def test_execute_output_exit_code_stdin_env_cwd(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    sandbox_id, workdir = sandbox["id"], sandbox["workdir"]
    result = execute(client, sandbox_id, "echo out; echo err >&2; exit 3")
    assert result["exit_code"] == 3
    assert "out\n" in result["output"]
    assert "err\n" in result["output"]
    assert result["error"] is None
    assert result["duration_ms"] > 0
    blob = bytes(range(256)) * 100
    counted = execute(client, sandbox_id, "wc -c", stdin_b64=base64.b64encode(blob).decode())
    assert counted["output"].strip() == str(len(blob))
    assert execute(client, sandbox_id, 'printf %s "$GREETING"', env={"GREETING": "héllo"})["output"] == "héllo"
    client.post(f"/v1/sandboxes/{sandbox_id}/files/write", json={"file_path": f"{workdir}/sub/f", "content": ""})
    assert execute(client, sandbox_id, "pwd", cwd=f"{workdir}/sub")["output"].strip() == f"{workdir}/sub"
    assert execute(client, sandbox_id, "pwd")["output"].strip() == workdir
    missing = execute(client, sandbox_id, "pwd", cwd=f"{workdir}/nope")
    assert missing["error"] == "file_not_found"
    assert missing["exit_code"] is None


def test_invalid_stdin_is_422(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    response = client.post(f"/v1/sandboxes/{sandbox['id']}/execute", json={"command": "cat", "stdin_b64": "!!"})
    assert response.status_code == 422
    assert error_of(response) == "invalid_request"


def test_output_is_capped_by_the_request_and_by_the_service(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    capped = execute(client, sandbox["id"], "head -c 50000 /dev/zero | tr '\\0' a", output_limit=1000)
    assert capped["truncated"]
    assert len(capped["output"]) < 1200
    ceiling = execute(client, sandbox["id"], "head -c 500000 /dev/zero | tr '\\0' a", output_limit=10_000_000)
    assert ceiling["truncated"]  # the service's max_output_bytes (200 000) wins
    assert len(ceiling["output"]) < 201_000


def test_timeout_kills_the_whole_process_tree(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    sandbox_id, workdir = sandbox["id"], sandbox["workdir"]
    beat = f"{workdir}/beat-sync"
    command = f"(setsid sh -c {shlex.quote(heartbeat(beat))} &) ; sleep 100"
    started = time.monotonic()
    result = execute(client, sandbox_id, command, timeout=1)
    assert time.monotonic() - started < 10
    assert result["error"] == "timeout"
    assert result["exit_code"] is None
    assert heartbeat_stopped(client, sandbox_id, beat)


# ---------------------------------------------------------------------- streamed


def test_streamed_output_arrives_in_order_while_the_command_runs(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    events = _stream(client, sandbox["id"], "for i in $(seq 1 50); do echo $i; sleep 0.02; done; exit 4")
    kinds = [event["type"] for _, event in events]
    assert events[0][1]["data"] == ""  # the first event carries the command's id, no output
    assert events[0][1]["id"]
    assert kinds[-1] == "exit"
    assert set(kinds[1:-1]) == {"output"}
    assert len(kinds) - 2 >= 5, "output should arrive in several events, not at the end"
    assert "".join(event["data"] for _, event in events[1:-1]) == "".join(f"{i}\n" for i in range(1, 51))
    first_output, exit_time = events[1][0], events[-1][0]
    assert exit_time - first_output > 0.5, "the first output must arrive long before the exit"
    result = events[-1][1]["result"]
    assert result["exit_code"] == 4
    assert result["output"] == "".join(f"{i}\n" for i in range(1, 51))


def test_streamed_multibyte_characters_survive_chunking(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    command = "for i in 1 2 3 4 5; do printf 'é'; printf '\\303'; sleep 0.05; printf '\\251\\n'; done"
    events = _stream(client, sandbox["id"], command)
    assert "".join(event["data"] for _, event in events[1:-1]) == "éé\n" * 5
    assert [event["offset"] for _, event in events[1:-1]][-1] == len(("éé\n" * 5).encode())


def test_streamed_timeout_ends_with_a_timeout_exit(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    events = _stream(client, sandbox["id"], "echo started; sleep 30", timeout=1)
    assert events[1][1] == {"type": "output", "data": "started\n", "offset": 8}
    exit_event = events[-1][1]
    assert exit_event["type"] == "exit"
    assert exit_event["result"]["error"] == "timeout"
    assert exit_event["result"]["exit_code"] is None


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "application/json; charset=utf-8"],
    ids=["hot-path", "fastapi"],  # the hot path hands any other content type to FastAPI's route
)
def test_a_client_leaving_a_plain_execute_kills_its_command(
    service: Running, client: httpx.Client, sandbox: dict[str, Any], content_type: str
) -> None:
    """Not left running until its (long) timeout: the service watches the connection."""
    sandbox_id, workdir = sandbox["id"], sandbox["workdir"]
    beat = f"{workdir}/beat-sync-{content_type.count(';')}"
    body = json.dumps({"command": heartbeat(beat), "timeout": 120}).encode()
    target = urlsplit(service.url)
    request = (
        f"POST /v1/sandboxes/{sandbox_id}/execute HTTP/1.1\r\nHost: {target.netloc}\r\n"
        f"Authorization: {client.headers['authorization']}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection((target.hostname, target.port)) as impatient:
        impatient.sendall(request)
        deadline = time.monotonic() + 30  # the client leaves once its command is seen running
        while execute(client, sandbox_id, f"test -s {shlex.quote(beat)}")["exit_code"] != 0:
            assert time.monotonic() < deadline, "the command never ran"
            time.sleep(0.05)
    deadline = time.monotonic() + 10
    while not heartbeat_stopped(client, sandbox_id, beat):
        assert time.monotonic() < deadline, "the abandoned command kept running"


def test_commands_run_in_shells_started_ahead_with_the_services_own_markers(
    client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    assert_commands_run_warm_with_the_services_markers(client, sandbox["id"])


def test_a_client_leaving_a_command_in_a_shell_started_ahead_has_it_killed(
    service: Running, client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    """Here the kill is a scan of the host's processes for the token: what finds the shell."""
    assert_a_left_warm_command_is_killed(service, client, sandbox["id"], f"{sandbox['workdir']}/beat-left")


# ---------------------------------------------------------------------- background processes


def _poll_until_done(client: httpx.Client, url: str, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        info: dict[str, Any] = client.get(url).json()
        if info["status"] != "running" or time.monotonic() > deadline:
            return info
        time.sleep(0.05)


def test_background_process_start_poll_exit(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    base = f"/v1/sandboxes/{sandbox['id']}/processes"
    started = client.post(base, json={"command": "echo one; sleep 0.5; echo two; exit 7"})
    assert started.status_code == 202
    process = started.json()
    assert process["status"] == "running"
    deadline = time.monotonic() + 10
    while not (partial := client.get(f"{base}/{process['id']}").json())["output"]:  # until "one" is out
        assert time.monotonic() < deadline, "no output from the running process"
        time.sleep(0.01)
    assert partial["status"] == "running"
    assert partial["output"] == "one\n"
    assert partial["result"] is None
    done = _poll_until_done(client, f"{base}/{process['id']}")
    assert done["status"] == "exited"
    assert done["result"]["exit_code"] == 7
    assert done["output"] == "one\ntwo\n"


def test_background_process_kill_takes_down_its_tree(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    sandbox_id, workdir = sandbox["id"], sandbox["workdir"]
    beat = f"{workdir}/beat-bg"
    base = f"/v1/sandboxes/{sandbox_id}/processes"
    command = f"(setsid sh -c {shlex.quote(heartbeat(beat))} &); echo up; sleep 100"
    process = client.post(base, json={"command": command}).json()
    wait_beating(client, sandbox_id, beat)
    assert heartbeat_processes(client, sandbox_id, beat), "the check for a live loop does not see one"
    killed = client.delete(f"{base}/{process['id']}")
    assert killed.status_code == 200
    assert killed.json()["status"] == "killed"
    assert killed.json()["result"] is not None
    assert heartbeat_stopped(client, sandbox_id, beat)
    assert client.get(f"{base}/{process['id']}").json()["status"] == "killed"


def test_background_process_timeout(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    base = f"/v1/sandboxes/{sandbox['id']}/processes"
    process = client.post(base, json={"command": "sleep 30", "timeout": 0.5}).json()
    done = _poll_until_done(client, f"{base}/{process['id']}")
    assert done["status"] == "timeout"
    assert done["result"]["error"] == "timeout"


def test_background_processes_are_limited_per_sandbox(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    base = f"/v1/sandboxes/{sandbox['id']}/processes"
    running_ids = [client.post(base, json={"command": "sleep 30"}).json()["id"] for _ in range(2)]
    try:
        refused = client.post(base, json={"command": "sleep 30"})
        assert refused.status_code == 403
        assert error_of(refused) == "quota_exceeded"
    finally:
        for process_id in running_ids:
            client.delete(f"{base}/{process_id}")
    assert client.post(base, json={"command": "true"}).status_code == 202


def test_unknown_process_is_404(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    response = client.get(f"/v1/sandboxes/{sandbox['id']}/processes/p999")
    assert response.status_code == 404
    assert error_of(response) == "not_found"


def test_a_background_process_with_an_invalid_environment_is_an_invalid_request(
    client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    """The job runner refuses these (the job's own marker, a NUL in a value): the tenant's
    mistake is a 422 ``invalid_request`` saying why, not a 503 blaming the backend."""
    base = f"/v1/sandboxes/{sandbox['id']}/processes"
    for env in ({"SANDBOXES_EXEC_ID": "mine"}, {"V": "a\x00b"}):
        refused = client.post(base, json={"command": "true", "env": env})
        assert (refused.status_code, error_of(refused)) == (422, "invalid_request"), refused.text
        assert "environment variable" in refused.json()["message"] or "marker" in refused.json()["message"]
    assert client.post(base, json={"command": "true"}).status_code == 202  # its slot was given back


def test_a_background_process_keeps_stdout_and_stderr_apart(
    service: Running, client: httpx.Client, sandbox: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert_background_streams_apart(service, client, sandbox["id"], capsys)
