"""Over real HTTP with the Docker backend: sandboxes as containers, what they can (not) see,
archives through the Docker API, and a ``kill -9`` of the service followed by a restart that
adopts its containers from their labels and reaps the expired and the orphaned."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shlex
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import httpx
import pytest
from processes_apart import assert_background_streams_apart
from service_harness import (
    KEYS,
    UNTHROTTLED,
    Running,
    ServiceProcess,
    alice_fixtures,
    assert_a_left_warm_command_is_killed,
    assert_commands_run_warm_with_the_services_markers,
    create,
    execute,
    heartbeat,
    heartbeat_processes,
    heartbeat_stopped,
    running,
    settings_for,
    start_process,
    subprocess_config,
    wait_beating,
    wait_until_expired,
)
from support import RETAKE_PIDS, SESSION_OWNER

from sandboxes import protocol as p
from sandboxes.client import RemoteSandbox, SandboxClient
from sandboxes.docker import DockerSandbox, DockerSandboxConfig, DockerTemplate
from sandboxes.testing import SandboxConformance

CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}
"""On every container and volume the service makes, so the session sweep removes leftovers."""


def _template(image: str) -> DockerTemplate:
    return DockerTemplate(backend="docker", image=image, cpus=0.5, memory="256m", labels=CLEANUP)


@pytest.fixture(scope="module")
def service(docker_client: Any, runtime_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    owner = f"{SESSION_OWNER}-svc-{uuid.uuid4().hex[:6]}"
    settings = settings_for(
        tmp_path_factory.mktemp("docker"),
        owner=owner,
        templates={"default": _template(runtime_image)},
        tenants=UNTHROTTLED,  # the conformance suite below runs through this service
    )
    with running(settings, docker_client=docker_client) as svc:
        yield svc


client, sandbox = alice_fixtures()


def _container(docker_client: Any, service: Running, sandbox_id: str) -> Any:
    return service.registry._entries[sandbox_id].sandbox.container


def test_create_execute_delete(service: Running, client: httpx.Client, docker_client: Any) -> None:
    sandbox = create(client, env={"GREETING": "hello"})
    assert (sandbox["backend"], sandbox["workdir"]) == ("docker", "/workspace")
    container_id = _container(docker_client, service, sandbox["id"]).id
    result = execute(client, sandbox["id"], 'id -u; pwd; echo "$GREETING"')
    assert result["output"] == "1000\n/workspace\nhello\n"
    assert client.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(container_id)
    assert not docker_client.volumes.list(filters={"label": f"io.sandboxes.service-id={sandbox['id']}"})
    assert client.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 404


def test_container_sees_no_socket_no_credentials_no_network(
    service: Running, client: httpx.Client, sandbox: dict[str, Any], docker_client: Any
) -> None:
    container = _container(docker_client, service, sandbox["id"])
    container.reload()
    mounts = container.attrs["Mounts"]
    assert [(m["Type"], m["Destination"]) for m in mounts] == [("volume", "/workspace")]
    volume = f"sandboxes-ws-{container.labels['io.sandboxes.sandbox-id']}"
    assert container.attrs["HostConfig"]["Binds"] == [f"{volume}:/workspace:rw"]  # a volume
    assert container.attrs["HostConfig"]["NetworkMode"] == "none"
    assert container.attrs["HostConfig"]["CapDrop"] == ["ALL"]
    labels = container.labels
    assert labels["io.sandboxes.tenant"] == "alice"
    assert labels["io.sandboxes.owner"] == service.app.state.service.settings.owner
    env = execute(client, sandbox["id"], "env; ls -la /var/run/docker.sock /run/docker.sock 2>&1")["output"]
    assert "docker.sock" in env  # the error message names it ...
    assert "No such file" in env  # ... because it is not there
    for tenant_key in KEYS.values():
        assert tenant_key not in env
    assert "api_keys" not in env
    assert execute(client, sandbox["id"], "getent hosts example.com || echo offline")["output"] == "offline\n"


def test_streamed_output_in_order(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    events = []
    command = "for i in $(seq 1 50); do echo $i; sleep 0.02; done"
    with client.stream("POST", f"/v1/sandboxes/{sandbox['id']}/execute/stream", json={"command": command}) as r:
        for line in r.iter_lines():
            if line:
                events.append((time.monotonic(), json.loads(line)))
    assert events[-1][1]["type"] == "exit"
    assert events[-1][1]["result"]["exit_code"] == 0
    outputs = [(at, e) for at, e in events if e["type"] == "output"]
    assert len(outputs) >= 5
    assert "".join(e["data"] for _, e in outputs) == "".join(f"{i}\n" for i in range(1, 51))
    assert events[-1][0] - outputs[0][0] > 0.5


def test_files_and_archive_round_trip(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    base = f"/v1/sandboxes/{sandbox['id']}"
    client.post(f"{base}/files/write", json={"file_path": "/workspace/t/a.txt", "content": "alpha\n"})
    assert client.post(f"{base}/files/read", json={"file_path": "/workspace/t/a.txt"}).json()["file_data"] == {
        "content": "alpha\n",
        "encoding": "utf-8",
        "created_at": None,
        "modified_at": None,
    }
    grep = client.post(f"{base}/files/grep", json={"pattern": "alp", "path": "/workspace"}).json()
    assert [m["path"] for m in grep["matches"]] == ["/workspace/t/a.txt"]
    archive = client.get(f"{base}/archive", params={"path": "/workspace/t"})
    assert archive.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
        assert sorted(tar.getnames()) == ["t", "t/a.txt"]
    put = client.put(f"{base}/archive", params={"path": "/workspace/copy"}, content=archive.content)
    assert put.status_code == 204, put.text
    assert execute(client, sandbox["id"], "cat copy/t/a.txt && stat -c %u copy/t/a.txt")["output"] == "alpha\n1000\n"
    missing = client.get(f"{base}/archive", params={"path": "/workspace/missing"})
    assert missing.status_code == 404


def test_commands_run_in_shells_started_ahead_with_the_services_own_markers(
    client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    assert_commands_run_warm_with_the_services_markers(client, sandbox["id"])


def test_a_client_leaving_a_command_in_a_shell_started_ahead_has_it_killed(
    service: Running, client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    assert_a_left_warm_command_is_killed(service, client, sandbox["id"], "/workspace/beat-left")


def test_background_kill_takes_down_the_tree(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    base = f"/v1/sandboxes/{sandbox['id']}/processes"
    loop = heartbeat("/workspace/beat")
    process = start_process(client, sandbox["id"], f"(setsid sh -c {shlex.quote(loop)} &); sleep 100")
    wait_beating(client, sandbox["id"], "/workspace/beat", process=process)
    assert heartbeat_processes(client, sandbox["id"], "/workspace/beat"), "the check for a live loop does not see one"
    killed = client.delete(f"{base}/{process['id']}").json()
    assert killed["status"] == "killed"
    assert heartbeat_stopped(client, sandbox["id"], "/workspace/beat")


def test_background_kill_takes_down_what_dropped_every_marker(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    """``DELETE /processes/{id}`` of a command whose loop dropped both markers (the service's and
    the exec helper's) and left its session: the loop must stop too (it used to fill the pids
    limit, since nothing could find it)."""
    base = f"/v1/sandboxes/{sandbox['id']}/processes"
    loop = heartbeat("/workspace/unmarked-beat")
    escape = f"env -u SANDBOXES_EXEC_ID setsid sh -c {shlex.quote(loop)} &"
    process = start_process(client, sandbox["id"], f"{escape} sleep 100")
    wait_beating(client, sandbox["id"], "/workspace/unmarked-beat", process=process)
    killed = client.delete(f"{base}/{process['id']}").json()
    assert killed["status"] == "killed"
    assert heartbeat_stopped(client, sandbox["id"], "/workspace/unmarked-beat")
    assert "sh -c while" not in execute(client, sandbox["id"], "ps -eo args=")["output"]


def test_a_background_process_that_took_every_pid_is_still_killed(
    client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    """A fork bomb in the background: polls answer 503 saying the sandbox cannot start
    processes (not an opaque failure), and ``DELETE`` still kills it (the exec helper kills by
    marker without starting a process), after which the sandbox works again."""
    base = f"/v1/sandboxes/{sandbox['id']}/processes"
    command = f"echo filling; exec python3 -c {shlex.quote(RETAKE_PIDS)}"
    process = client.post(base, json={"command": command, "timeout": 600}).json()
    deadline = time.monotonic() + 30
    while (polled := client.get(f"{base}/{process['id']}")).status_code != 503:
        assert polled.status_code == 200, polled.text
        assert time.monotonic() < deadline, "the process did not fill the sandbox's pids"
        time.sleep(0.05)
    assert "cannot start processes" in polled.json()["message"]
    killed = client.delete(f"{base}/{process['id']}")
    assert killed.status_code == 200, killed.text
    assert (killed.json()["status"], killed.json()["output"]) == ("killed", "filling\n")
    assert execute(client, sandbox["id"], "echo works")["output"] == "works\n"


_WIPE_ENVIRON = r"""
import time
fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
start, end = int(fields[47]), int(fields[48])  # env_start, env_end (fields 50 and 51)
with open("/proc/self/mem", "r+b", buffering=0) as mem:
    mem.seek(start)
    mem.write(b"\0" * (end - start))
with open("/workspace/wiped", "wb") as out:
    out.write(open("/proc/self/environ", "rb").read())
while True:
    time.sleep(0.1)
"""
"""Overwrites its own environment in memory, which is what /proc/<pid>/environ shows."""


def test_background_kill_finds_a_command_that_wiped_its_environment(
    client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    """The leader overwrites its environment, so the service's marker is nowhere in /proc; the
    kill must still find it, by what the command was started with."""
    base = f"/v1/sandboxes/{sandbox['id']}/processes"
    process = client.post(base, json={"command": "exec python3 -c " + shlex.quote(_WIPE_ENVIRON)}).json()
    deadline = time.monotonic() + 10
    while not execute(client, sandbox["id"], "cat /workspace/wiped 2>/dev/null")["output"]:
        assert time.monotonic() < deadline, "the command never wiped its environment"
    wiped = execute(client, sandbox["id"], "tr -d '\\0' < /workspace/wiped | wc -c")["output"]
    assert wiped.strip() == "0"  # nothing left to find it by
    started = time.monotonic()
    killed = client.delete(f"{base}/{process['id']}").json()
    assert killed["status"] == "killed"
    assert time.monotonic() - started < 5
    assert not [
        line
        for line in execute(client, sandbox["id"], "ps -eo args=")["output"].splitlines()
        if line.startswith("python3 -c")
    ]


# ---------------------------------------------------------------------- kill -9 and reconcile


def service_container(docker_client: Any, owner: str, sandbox_id: str) -> str:
    [container] = docker_client.containers.list(
        all=True, filters={"label": [f"io.sandboxes.owner={owner}", f"io.sandboxes.service-id={sandbox_id}"]}
    )
    return str(container.id)


def test_kill_9_then_restart_adopts_containers_and_reaps_the_rest(
    tmp_path: Path, docker_client: Any, runtime_image: str
) -> None:
    owner = f"{SESSION_OWNER}-k9-{uuid.uuid4().hex[:6]}"
    data_dir = tmp_path / "data"
    template = {"backend": "docker", "image": runtime_image, "cpus": 0.5, "memory": "256m", "labels": CLEANUP}
    templates = {"default": template, "persistent": {**template, "disk": None}}
    service = ServiceProcess(subprocess_config(data_dir, owner=owner, templates=templates), tmp_path)
    stranger = DockerSandbox.create(
        DockerSandboxConfig(image=runtime_image, owner=owner, labels=CLEANUP), client=docker_client
    )
    neighbour = DockerSandbox.create(
        DockerSandboxConfig(image=runtime_image, owner=SESSION_OWNER), client=docker_client
    )
    service.start()
    try:
        with service.client("alice") as alice:
            kept = create(alice, ttl=300, labels={"role": "kept"})
            execute(alice, kept["id"], "echo persisted > /workspace/file.txt")
            renewed = alice.post(f"/v1/sandboxes/{kept['id']}/renew", json={"ttl": 900}).json()
            stateless = create(alice, ttl=300, labels={"role": "stateless"})
            doomed = create(alice, ttl=2)
            # Stopped while the service is down (an engine restart): a workspace in memory is
            # gone with its container, so that sandbox must be reaped, never adopted empty; a
            # persistent volume survives and its sandbox is restarted.
            in_memory = create(alice, ttl=300)
            persistent = create(alice, template="persistent", ttl=300)
            for stopped in (in_memory, persistent):
                execute(alice, stopped["id"], "echo kept > /workspace/file.txt")
        # The container is the whole record of a Docker sandbox: nothing of it on the disk.
        assert not list((data_dir / "state").glob("*.json"))
        service.kill()
        for stopped in (in_memory, persistent):
            docker_client.containers.get(service_container(docker_client, owner, stopped["id"])).stop(timeout=1)
        wait_until_expired(doomed)  # while nobody runs
        service.start()
        with service.client("alice") as alice:
            listed = {s["id"]: s for s in alice.get("/v1/sandboxes").json()["sandboxes"]}
            assert set(listed) == {kept["id"], stateless["id"], persistent["id"]}
            assert execute(alice, persistent["id"], "cat /workspace/file.txt")["output"] == "kept\n"
            assert alice.get(f"/v1/sandboxes/{in_memory['id']}").status_code == 404
            assert listed[kept["id"]]["expires_at"] == pytest.approx(renewed["expires_at"])  # not the label's
            assert listed[stateless["id"]]["labels"] == {"role": "stateless"}  # from the container's labels
            assert execute(alice, kept["id"], "cat /workspace/file.txt")["output"] == "persisted\n"
            assert alice.get(f"/v1/sandboxes/{doomed['id']}").status_code == 404
        remaining = docker_client.containers.list(all=True, filters={"label": f"io.sandboxes.owner={owner}"})
        expected = sorted([kept["id"], stateless["id"], persistent["id"]])
        assert sorted(c.labels["io.sandboxes.service-id"] for c in remaining) == expected
        with pytest.raises(docker.errors.NotFound):
            docker_client.containers.get(stranger.id)  # our owner, no tenant: orphaned, reaped
        docker_client.containers.get(neighbour.id)  # another owner's: untouched
        with service.client("alice") as alice:
            for sandbox_id in (kept["id"], stateless["id"], persistent["id"]):
                assert alice.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204
        assert not docker_client.containers.list(all=True, filters={"label": f"io.sandboxes.owner={owner}"})
    finally:
        service.stop()
        neighbour.destroy()
        stranger.destroy()


# ---------------------------------------------------------------------- RemoteSandbox over Docker


@pytest.fixture(scope="module")
def remote(service: Running) -> Iterator[RemoteSandbox]:
    with SandboxClient(service.url, KEYS["alice"]) as sandbox_client, sandbox_client.create("default") as sb:
        yield sb


class TestRemoteSandboxOverDocker(SandboxConformance):
    """The client's protocol over a Docker-backed service: the paths a direct `DockerSandbox`
    takes (exec helper, workspace volume, tmpfs ``/tmp``) must all answer the same over HTTP."""

    @pytest.fixture
    def backend(self, remote: RemoteSandbox) -> RemoteSandbox:
        return remote

    @pytest.fixture
    def base_dir(self) -> str:
        return "/workspace"


@pytest.mark.parametrize("where", ["/tmp", "/workspace"])
def test_big_uploads_work_wherever_small_ones_do(service: Running, remote: RemoteSandbox, where: str) -> None:
    """Over 8 MiB the client sends a tar to ``PUT /archive``; the engine's archive API cannot
    write ``/tmp`` (a tmpfs on a read-only root), so the service extracts it inside the sandbox."""
    blob = os.urandom(9 << 20) + bytes(range(256))
    path = f"{where}/big-{uuid.uuid4().hex[:6]}/data.bin"
    assert remote.upload_files([(path, blob)]) == [p.FileUploadResponse(path)]
    assert remote.download_files([path])[0].content == blob
    assert remote.execute(f"stat -c '%s %U %a' {shlex.quote(path)}").output.split() == [
        str(len(blob)),
        "sandbox",
        "644",
    ]

    async def round_trip() -> bytes | None:
        again = blob[::-1]
        assert await remote.aupload_files([(path, again)]) == [p.FileUploadResponse(path)]
        return (await remote.adownload_files([path]))[0].content

    assert asyncio.run(round_trip()) == blob[::-1]
    leftovers = remote.execute(f"ls -A {shlex.quote(path.rpartition('/')[0])}").output.split()
    assert leftovers == ["data.bin"]  # no staged chunks left behind


def test_big_upload_into_the_read_only_root_names_its_cause(remote: RemoteSandbox) -> None:
    blob = os.urandom(9 << 20)
    [response] = remote.upload_files([("/opt/big.bin", blob)])
    assert response.error == p.PERMISSION_DENIED
    assert remote.download_files(["/opt/big.bin"])[0].error == p.FILE_NOT_FOUND


def test_a_background_process_keeps_stdout_and_stderr_apart(
    service: Running, client: httpx.Client, sandbox: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert_background_streams_apart(service, client, sandbox["id"], capsys)
