"""KubernetesSandbox's exec path over the real wire protocol (the official client's ``stream()``,
WebSocket ``v5``/``v4`` channels): the full conformance suite through the exec helper on one
persistent stream, and through the one-exec-per-command fallback on an image without python3;
the stream reopened when it drops, a command whose fate is unknown never run twice.

The API server here is `exec_double.ExecDouble`, a fake of the exec subresource alone, with a
Docker container standing in for each pod (same user, read-only root, no capabilities, tmpfs
workspace and /tmp, no network); pods themselves are the provider tests' business."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from exec_double import V4, V5, ExecDouble
from support import SESSION_OWNER
from testcontainers.core.image import DockerImage

from sandboxes import protocol as p
from sandboxes.kubernetes import KubernetesSandbox, KubernetesSandboxConfig
from sandboxes.lifecycle import Lifecycle
from sandboxes.testing import SandboxConformance

FIXTURES = Path(__file__).parent.parent / "fixtures"


@pytest.fixture(scope="module")
def double() -> Iterator[ExecDouble]:
    server = ExecDouble(protocols=(V5, V4))
    yield server
    server.close()


@pytest.fixture(scope="module")
def double_v4() -> Iterator[ExecDouble]:
    server = ExecDouble(protocols=(V4,))
    yield server
    server.close()


@pytest.fixture(scope="module")
def no_python_image(docker_client: Any) -> Iterator[str]:
    with DockerImage(path=FIXTURES / "no-python", tag="sandboxes-test/no-python:latest", clean_up=False) as image:
        yield str(image)


PodFactory = Callable[[str], str]


@pytest.fixture(scope="module")
def pods(docker_client: Any) -> Iterator[PodFactory]:
    """Containers standing in for pods, secured as `pod_manifest` secures a pod."""
    made: list[Any] = []

    def start(image: str) -> str:
        name = f"sandbox-{uuid.uuid4().hex[:16]}"
        made.append(
            docker_client.containers.run(
                image,
                ["sleep", "infinity"],
                name=name,
                detach=True,
                init=True,
                user="1000:1000",
                working_dir="/workspace",
                labels={"io.sandboxes.owner": SESSION_OWNER},
                network_mode="none",
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                read_only=True,
                tmpfs={
                    "/tmp": "rw,nosuid,nodev,size=256m,mode=1777",
                    "/workspace": "rw,nosuid,nodev,size=1g,uid=1000,gid=1000,mode=0755",
                },
                mem_limit="2g",
                pids_limit=256,
            )
        )
        return name

    yield start
    for container in made:
        container.remove(force=True)


def _sandbox(server: ExecDouble, name: str, **config: Any) -> KubernetesSandbox:
    from kubernetes import client

    configuration = client.Configuration(host=server.host)
    api = client.CoreV1Api(client.ApiClient(configuration))
    return KubernetesSandbox(name, api, KubernetesSandboxConfig(owner=SESSION_OWNER, **config), owned=False)


@pytest.fixture(scope="module")
def helper_sandbox(double: ExecDouble, pods: PodFactory, runtime_image: str) -> Iterator[KubernetesSandbox]:
    sandbox = _sandbox(double, pods(runtime_image))
    yield sandbox
    sandbox.close()


@pytest.fixture(scope="module")
def fallback_sandbox(double_v4: ExecDouble, pods: PodFactory, no_python_image: str) -> Iterator[KubernetesSandbox]:
    sandbox = _sandbox(double_v4, pods(no_python_image))
    yield sandbox
    sandbox.close()


class TestKubernetesSandboxConformance(SandboxConformance):
    """Through the exec helper, on one exec stream (``v5``)."""

    @pytest.fixture
    def backend(self, helper_sandbox: KubernetesSandbox) -> KubernetesSandbox:
        return helper_sandbox

    @pytest.fixture
    def base_dir(self) -> str:
        return "/workspace"

    def test_commands_share_one_exec_stream(self, helper_sandbox: KubernetesSandbox, double: ExecDouble) -> None:
        helper_sandbox.execute("true")
        assert helper_sandbox.helper_alive
        before = double.execs
        for _ in range(20):
            assert helper_sandbox.execute("echo hi").output == "hi\n"
        assert double.execs == before
        assert isinstance(helper_sandbox, Lifecycle)


class TestKubernetesFallbackConformance(SandboxConformance):
    """An image without python3 over ``v4`` (which cannot end stdin): one exec per command, the
    exit status from the error channel."""

    @pytest.fixture
    def backend(self, fallback_sandbox: KubernetesSandbox) -> KubernetesSandbox:
        return fallback_sandbox

    @pytest.fixture
    def base_dir(self) -> str:
        return "/workspace"

    def test_no_helper_is_used(self, fallback_sandbox: KubernetesSandbox, double_v4: ExecDouble) -> None:
        before = double_v4.execs
        assert fallback_sandbox.execute("echo ok").output == "ok\n"
        assert fallback_sandbox._helper_unavailable
        assert fallback_sandbox._mux is None
        assert double_v4.execs == before + 1


def test_helper_over_v4(double_v4: ExecDouble, pods: PodFactory, runtime_image: str) -> None:
    sandbox = _sandbox(double_v4, pods(runtime_image))
    try:
        assert sandbox.execute("cat", stdin=b"\x00\xff" * 1000).output.encode("latin-1", "replace")[:2]
        assert sandbox.execute("wc -c", stdin=bytes(range(256)) * 100).output.strip() == "25600"
        assert sandbox.helper_alive
        assert sandbox._mux is not None
    finally:
        sandbox.close()


def test_dropped_stream_is_reopened(double: ExecDouble, pods: PodFactory, runtime_image: str) -> None:
    sandbox = _sandbox(double, pods(runtime_image))
    try:
        sandbox.execute("true")
        assert sandbox._mux is not None
        first = sandbox._mux.info["pid"]
        sandbox._mux._stream.close()  # the websocket drops under it
        assert sandbox.execute("echo again").output == "again\n"
        assert sandbox._mux is not None
        assert sandbox._mux.info["pid"] != first
    finally:
        sandbox.close()


def test_a_command_cut_off_answers_connection_lost_and_is_not_rerun(
    double: ExecDouble, pods: PodFactory, runtime_image: str
) -> None:
    import threading

    sandbox = _sandbox(double, pods(runtime_image))
    try:
        sandbox.execute("true")
        mux = sandbox._mux
        assert mux is not None
        started = threading.Event()
        result: list[p.ExecuteResponse] = []

        def run() -> None:
            result.append(sandbox.execute("echo ran >> /workspace/count; sleep 30", timeout=60))

        worker = threading.Thread(target=run)
        worker.start()
        for _ in range(200):
            if sandbox.execute("cat /workspace/count 2>/dev/null").output:
                started.set()
                break
        assert started.is_set()
        mux._stream.close()
        worker.join(30)
        assert result
        assert result[0].error == p.CONNECTION_LOST
        assert sandbox.execute("cat /workspace/count").output == "ran\n"
    finally:
        sandbox.close()


def test_timeout_kills_the_tree_in_the_fallback(fallback_sandbox: KubernetesSandbox) -> None:
    result = fallback_sandbox.execute("(sleep 300 &) ; setsid sleep 301 & sleep 302", timeout=2)
    assert result.error == p.TIMEOUT
    scan = "for d in /proc/[0-9]*; do tr '\\0' ' ' < $d/cmdline; echo; done 2>/dev/null | grep -c '^sleep 30[012]'"
    left = fallback_sandbox.execute(scan).output.strip()
    assert left == "0"
