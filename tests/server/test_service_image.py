"""The service image, run as an operator runs it: started with testcontainers, the Docker
socket mounted, its port published on 127.0.0.1 only, managing sandboxes as sibling
containers that never see that socket; called through the Python client and the CLI."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import httpx
import pytest
from support import SESSION_OWNER, needs
from testcontainers.core.container import DockerContainer

from sandboxes.cli import main
from sandboxes.client import SandboxClient
from sandboxes.server.auth import generate_key, hash_key

REPO = Path(__file__).resolve().parents[2]
VERSION = (REPO / "images" / "VERSION").read_text().strip()
IMAGE = f"sandboxes/service:{VERSION}"
SOCKET = "/var/run/docker.sock"
CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}
"""On the service container and on every sandbox it makes: the session sweep removes leftovers."""
CLEANUP_LABEL = f"io.sandboxes.test-session={SESSION_OWNER}"


@pytest.fixture(scope="module")
def service_image(docker_client: Any, runtime_image: str) -> str:
    """The image of this tree: build.sh reuses every cached layer when nothing changed (CI has
    just built it: about a second), and rebuilds only the package layer after a code change."""
    started = time.monotonic()
    built = subprocess.run(
        ["bash", str(REPO / "images" / "build.sh"), "service"], capture_output=True, text=True, timeout=900
    )
    if built.returncode != 0:
        pytest.fail(f"images/build.sh service failed:\n{built.stdout[-3000:]}\n{built.stderr[-3000:]}")
    print(f"service image ready in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return IMAGE


@pytest.fixture(scope="module")
def socket_gid(docker_client: Any) -> int:
    try:
        mode = os.stat(SOCKET)
    except OSError:
        needs(False, f"the Docker engine is not at {SOCKET}: nothing to mount")
        raise
    assert stat.S_ISSOCK(mode.st_mode)
    return mode.st_gid


def _service_url(container: DockerContainer) -> str:
    wrapped = container.get_wrapped_container()
    wrapped.reload()
    bindings = wrapped.attrs["NetworkSettings"]["Ports"]["8080/tcp"]
    assert {binding["HostIp"] for binding in bindings} == {"127.0.0.1"}, bindings  # loopback only
    return f"http://127.0.0.1:{bindings[0]['HostPort']}"


def _wait_ready(container: DockerContainer, url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        wrapped = container.get_wrapped_container()
        wrapped.reload()
        if wrapped.status == "exited":
            pytest.fail(f"the service exited: {wrapped.logs().decode()[-3000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"the service was not ready in {timeout}s: {wrapped.logs().decode()[-3000:]}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def service(
    service_image: str, socket_gid: int, runtime_image: str, docker_client: Any
) -> Iterator[tuple[str, str, str]]:
    """``(url, api key, owner)`` of a running service container."""
    key = generate_key()
    owner = f"{SESSION_OWNER}-image-{uuid.uuid4().hex[:6]}"
    template = {"backend": "docker", "image": runtime_image, "cpus": 0.5, "memory": "256m", "labels": CLEANUP}
    container = (
        DockerContainer(service_image)
        .with_volume_mapping(SOCKET, SOCKET, "rw")
        .with_env("SANDBOXES_API_KEYS", json.dumps({hash_key(key): "alice"}))
        .with_env("SANDBOXES_OWNER", owner)
        .with_env("SANDBOXES_TEMPLATES", json.dumps({"default": template}))
        .with_kwargs(group_add=[str(socket_gid)], labels=CLEANUP, network="bridge")
    )
    # with_bind_ports takes no host address; docker-py's (address, None) is any port on it.
    container.ports["8080/tcp"] = ("127.0.0.1", None)  # type: ignore[assignment]
    with container:
        url = _service_url(container)
        _wait_ready(container, url)
        yield url, key, owner


def test_image_metadata(service_image: str, docker_client: Any) -> None:
    attrs = docker_client.images.get(service_image).attrs
    config = attrs["Config"]
    assert config["Labels"]["org.opencontainers.image.version"] == VERSION
    assert config["Labels"]["io.sandboxes.image"] == "service"
    assert config["User"] == "sandboxes"
    assert list(config["ExposedPorts"]) == ["8080/tcp"]
    assert list(config["Volumes"]) == ["/var/lib/sandboxes"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert json.loads(env["SANDBOXES_TEMPLATES"]) == {
        "default": {"backend": "docker", "image": f"sandboxes/runtime:{VERSION}"}
    }
    assert env["SANDBOXES_HOST"] == "0.0.0.0"  # inside the container; publish it on 127.0.0.1


def test_the_image_loads_the_charts_kubernetes_template(service_image: str, docker_client: Any) -> None:
    """The Helm chart runs this image with a ``kubernetes`` template; loading one needs the
    kubernetes client (a real cluster showed the service crash-looping without it)."""
    template = {"backend": "kubernetes", "namespace": "sandboxes", "image": f"sandboxes/runtime:{VERSION}"}
    script = (
        "import json, sys; from sandboxes.kubernetes import KubernetesTemplate; "
        "KubernetesTemplate.model_validate(json.loads(sys.argv[1])); print('loaded')"
    )
    container = docker_client.containers.run(
        service_image,
        entrypoint=["python", "-c", script, json.dumps(template)],
        detach=True,
        labels=CLEANUP,
        network_mode="none",
    )
    status, logs = _run_to_end(container)
    assert (status, logs.strip()) == (0, "loaded"), logs


def test_sibling_sandbox_lifecycle(service: tuple[str, str, str], docker_client: Any) -> None:
    url, key, owner = service
    with SandboxClient(url, key) as client:
        sandbox = client.create(env={"GREETING": "hello"})
        assert sandbox.info is not None
        assert sandbox.info.backend == "docker"
        siblings = docker_client.containers.list(filters={"label": f"io.sandboxes.service-id={sandbox.id}"})
        assert len(siblings) == 1  # on the host's engine, beside the service: not inside it
        sibling = siblings[0]
        assert sibling.labels["io.sandboxes.owner"] == owner

        result = sandbox.execute('id -u; pwd; echo "$GREETING"; test -e /var/run/docker.sock || echo no-socket')
        assert (result.exit_code, result.output) == (0, "1000\n/workspace\nhello\nno-socket\n")
        sandbox.write("/workspace/notes.txt", "written through the image\n")
        assert sandbox.read("/workspace/notes.txt").file_data is not None

        mounts = sibling.attrs["Mounts"]
        assert [(m["Type"], m["Destination"]) for m in mounts] == [("volume", "/workspace")]
        assert not any("docker.sock" in (m.get("Source") or "") for m in mounts)
        assert sibling.attrs["HostConfig"]["NetworkMode"] == "none"
        assert SOCKET not in json.dumps(sibling.attrs["Config"])

        sandbox.destroy()
        with pytest.raises(docker.errors.NotFound):
            docker_client.containers.get(sibling.id)
        assert not docker_client.volumes.list(filters={"label": f"io.sandboxes.service-id={sandbox.id}"})


def test_cli_against_the_image(service: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    url, key, _ = service
    monkeypatch.setenv("SANDBOXES_URL", url)
    monkeypatch.setenv("SANDBOXES_API_KEY", key)

    def run(*argv: str) -> str:
        stdout = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
        monkeypatch.setattr(sys, "stdout", stdout)
        assert main(list(argv)) == 0, argv
        stdout.flush()
        return stdout.buffer.getvalue().decode()  # type: ignore[attr-defined]

    sandbox_id = run("create").strip()
    try:
        assert run("exec", "--sandbox", sandbox_id, "echo from the cli > f.txt; cat f.txt") == "from the cli\n"
        assert run("ls", "--sandbox", sandbox_id) == "/workspace/f.txt\n"
        assert sandbox_id in run("ls").split()
    finally:
        assert run("rm", sandbox_id) == ""


def _container_of(docker_client: Any, url: str) -> Any:
    port = url.rsplit(":", 1)[1]
    (container,) = [
        c
        for c in docker_client.containers.list(filters={"label": CLEANUP_LABEL})
        if any(b.get("HostPort") == port for b in (c.ports.get("8080/tcp") or []))
    ]
    return container


def test_service_runs_unprivileged(service: tuple[str, str, str], docker_client: Any) -> None:
    container = _container_of(docker_client, service[0])
    code, output = container.exec_run(["sh", "-c", "id -u; cat /proc/1/status | grep -E '^(Uid|CapEff)'"])
    assert code == 0
    lines = output.decode().split("\n")
    assert lines[0] == "10001"
    assert lines[1].split()[1:] == ["10001"] * 4  # pid 1 (the service): uid 10001, real to filesystem
    assert lines[2].split()[1] == "0000000000000000"  # no capabilities


def test_service_serves_with_httptools_and_uvloop(service: tuple[str, str, str], docker_client: Any) -> None:
    """The ``server`` extra's fast HTTP stack is in the image, and the service uses it."""
    logs = _container_of(docker_client, service[0]).logs().decode()
    stacks = [
        (line["http"], line["loop"])
        for line in (json.loads(text) for text in logs.splitlines() if text.startswith("{"))
        if "http" in line and "loop" in line
    ]
    assert stacks == [("httptools", "uvloop")], logs[-3000:]


def test_without_group_add_the_entry_point_says_why(service_image: str, socket_gid: int, docker_client: Any) -> None:
    needs(os.stat(SOCKET).st_mode & 0o006 != 0o006, "the socket is world-writable: any uid may use it")
    container = docker_client.containers.run(
        service_image,
        detach=True,
        labels=CLEANUP,
        volumes={SOCKET: {"bind": SOCKET, "mode": "rw"}},
        environment={"SANDBOXES_API_KEYS": json.dumps({hash_key("k" * 20): "alice"})},
        network_mode="none",
    )
    status, logs = _run_to_end(container)
    assert status == 2, logs
    assert f"run the container with --group-add {socket_gid}" in logs


def _run_to_end(container: Any) -> tuple[int, str]:
    """(exit status, logs) of a container started detached, removed after, whatever happens."""
    try:
        status = container.wait(timeout=60)
        return int(status["StatusCode"]), container.logs().decode()
    finally:
        container.remove(force=True, v=True)
