"""KubernetesSandbox's exec path over the real wire protocol (the official client's ``stream()``,
WebSocket ``v5``/``v4`` channels): the full conformance suite through the exec helper on one
persistent stream, and through the one-exec-per-command fallback on an image without python3;
the stream reopened when it drops, a command whose fate is unknown never run twice.

The API server here is the FAKE one of ``tests/kubernetes/fake_apiserver`` (fixtures
``fake_kubernetes`` and ``fake_kubernetes_v4``, which serves ``v4`` only), whose pods are Docker
containers with the pod's security mapped (user, read-only root, no capabilities, tmpfs
workspace and /tmp, no network)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fake_apiserver import FakeKubernetes
from mux_faults import assert_a_stopped_helper_cannot_hold_a_big_send
from native_listings import assert_ls_and_delete_go_native, assert_native_listings_match_the_scripts
from native_searches import assert_native_searches_match_the_scripts
from native_writes import assert_file_ops_go_native, assert_native_writes_match_the_scripts
from support import (
    SESSION_OWNER,
    assert_a_failed_helper_start_is_tried_again_later,
    assert_command_marker_never_waits_for_the_helper_lock,
)

from sandboxes import protocol as p
from sandboxes.kubernetes import KubernetesSandbox, KubernetesSandboxConfig
from sandboxes.lifecycle import Lifecycle
from sandboxes.testing import SandboxConformance

V4 = "v4.channel.k8s.io"
V5 = "v5.channel.k8s.io"


def _sandbox(server: FakeKubernetes, image: str, **config: Any) -> KubernetesSandbox:
    from kubernetes import client

    api_client = client.ApiClient(client.Configuration(host=server.url))
    template = KubernetesSandboxConfig(image=image, owner=SESSION_OWNER, **config)
    return KubernetesSandbox.create(template, api_client=api_client)


@pytest.fixture(scope="module")
def helper_sandbox(fake_kubernetes: FakeKubernetes, runtime_image: str) -> Iterator[KubernetesSandbox]:
    with _sandbox(fake_kubernetes, runtime_image) as sandbox:
        yield sandbox


@pytest.fixture(scope="module")
def fallback_sandbox(fake_kubernetes_v4: FakeKubernetes, no_python_image: str) -> Iterator[KubernetesSandbox]:
    with _sandbox(fake_kubernetes_v4, no_python_image) as sandbox:
        yield sandbox


class TestKubernetesSandboxConformance(SandboxConformance):
    """Through the exec helper, on one exec stream (``v5``)."""

    @pytest.fixture
    def backend(self, helper_sandbox: KubernetesSandbox) -> KubernetesSandbox:
        return helper_sandbox

    @pytest.fixture
    def base_dir(self) -> str:
        return "/workspace"

    def test_commands_share_one_exec_stream(
        self, helper_sandbox: KubernetesSandbox, fake_kubernetes: FakeKubernetes
    ) -> None:
        helper_sandbox.execute("true")
        assert helper_sandbox.helper_alive
        before = fake_kubernetes.requests["exec"]
        for _ in range(20):
            assert helper_sandbox.execute("echo hi").output == "hi\n"
        assert fake_kubernetes.requests["exec"] == before
        assert isinstance(helper_sandbox, Lifecycle)
        assert helper_sandbox.helper_driver.mux is not None
        assert helper_sandbox.helper_driver.mux._stream.protocol == V5  # type: ignore[attr-defined]


def test_file_ops_go_through_the_exec_helper_natively(helper_sandbox: KubernetesSandbox) -> None:
    assert_file_ops_go_native(helper_sandbox, "/workspace")


def test_native_file_ops_answer_what_the_scripts_answer(helper_sandbox: KubernetesSandbox) -> None:
    assert_native_writes_match_the_scripts(helper_sandbox, "/workspace")


def test_native_searches_answer_what_the_scripts_answer(helper_sandbox: KubernetesSandbox) -> None:
    assert_native_searches_match_the_scripts(helper_sandbox, "/workspace")


def test_native_listings_answer_what_the_scripts_answer(helper_sandbox: KubernetesSandbox) -> None:
    assert_native_listings_match_the_scripts(helper_sandbox, "/workspace")


def test_ls_and_delete_go_through_the_exec_helper_natively(helper_sandbox: KubernetesSandbox) -> None:
    assert_ls_and_delete_go_native(helper_sandbox, "/workspace")


def test_the_marker_for_a_command_never_waits_for_a_helper_start(helper_sandbox: KubernetesSandbox) -> None:
    assert_command_marker_never_waits_for_the_helper_lock(helper_sandbox)


def test_a_helper_that_failed_to_start_is_tried_again_later(
    fake_kubernetes: FakeKubernetes, runtime_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _sandbox(fake_kubernetes, runtime_image) as sandbox:
        sandbox.close()  # the helper a pod's readiness started
        assert_a_failed_helper_start_is_tried_again_later(sandbox, monkeypatch)


def test_a_failed_question_whether_python_is_there_gives_nothing_up(
    fake_kubernetes: FakeKubernetes, runtime_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _sandbox(fake_kubernetes, runtime_image) as sandbox:
        sandbox.close()
        assert_a_failed_helper_start_is_tried_again_later(sandbox, monkeypatch, question_fails=True)


class TestKubernetesFallbackConformance(SandboxConformance):
    """An image without python3 over ``v4`` (which cannot end stdin): one exec per command, the
    exit status from the error channel."""

    @pytest.fixture
    def backend(self, fallback_sandbox: KubernetesSandbox) -> KubernetesSandbox:
        return fallback_sandbox

    @pytest.fixture
    def base_dir(self) -> str:
        return "/workspace"

    def test_no_helper_is_used(self, fallback_sandbox: KubernetesSandbox, fake_kubernetes_v4: FakeKubernetes) -> None:
        fallback_sandbox.execute("true")  # the first command finds out that the image has no python3
        before = fake_kubernetes_v4.requests["exec"]
        assert fallback_sandbox.execute("echo ok").output == "ok\n"
        assert fallback_sandbox.helper_driver.starts.unavailable
        assert fallback_sandbox.helper_driver.mux is None
        assert fake_kubernetes_v4.requests["exec"] == before + 1


@pytest.mark.usefixtures("slow_header_parsing")
def test_the_fake_kubelet_loses_no_output_read_with_the_headers(fallback_sandbox: KubernetesSandbox) -> None:
    """The fake's exec bridge takes its container's output from docker-py, whose reader may have
    read the first of it with the upgrade's headers (a loaded machine): a double that dropped it
    would fail tests at random."""
    done = fallback_sandbox.execute("echo hello")
    assert (done.output, done.exit_code) == ("hello\n", 0)


def test_helper_over_v4(fake_kubernetes_v4: FakeKubernetes, runtime_image: str) -> None:
    sandbox = _sandbox(fake_kubernetes_v4, runtime_image)
    try:
        dumped = sandbox.execute("od -An -tx1 | head -n 1", stdin=b"\x00\xff\n" * 1000).output.split()
        assert dumped[:6] == ["00", "ff", "0a", "00", "ff", "0a"]
        assert sandbox.execute("wc -c", stdin=bytes(range(256)) * 100).output.strip() == "25600"
        assert sandbox.helper_alive
        assert sandbox.helper_driver.mux is not None
        assert sandbox.helper_driver.mux._stream.protocol == V4  # type: ignore[attr-defined]
    finally:
        sandbox.destroy()


def test_dropped_stream_is_reopened(fake_kubernetes: FakeKubernetes, runtime_image: str) -> None:
    sandbox = _sandbox(fake_kubernetes, runtime_image)
    try:
        sandbox.execute("true")
        assert sandbox.helper_driver.mux is not None
        first = sandbox.helper_driver.mux.info["pid"]
        sandbox.helper_driver.mux._stream.close()  # the websocket drops under it
        assert sandbox.execute("echo again").output == "again\n"
        assert sandbox.helper_driver.mux is not None
        assert sandbox.helper_driver.mux.info["pid"] != first
    finally:
        sandbox.destroy()


@pytest.mark.parametrize("side", ["client", "server"])
def test_a_command_cut_off_answers_connection_lost_and_is_not_rerun(
    fake_kubernetes: FakeKubernetes, runtime_image: str, side: str
) -> None:
    """The stream drops mid-command, on our side (the websocket closed under the mux) or on the
    server's (closed with no exit status, as a restarting API server does)."""
    import threading

    sandbox = _sandbox(fake_kubernetes, runtime_image)
    try:
        sandbox.execute("true")
        mux = sandbox.helper_driver.mux
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
        if side == "client":
            mux._stream.close()
        else:
            assert fake_kubernetes.drop_exec_streams("sandboxes", sandbox.id) == 1
        worker.join(30)
        assert result
        assert result[0].error == p.CONNECTION_LOST
        assert sandbox.execute("cat /workspace/count").output == "ran\n"
    finally:
        sandbox.destroy()


def test_timeout_kills_the_tree_in_the_fallback(fallback_sandbox: KubernetesSandbox) -> None:
    result = fallback_sandbox.execute("(sleep 300 &) ; setsid sleep 301 & sleep 302", timeout=2)
    assert result.error == p.TIMEOUT
    scan = "for d in /proc/[0-9]*; do tr '\\0' ' ' < $d/cmdline; echo; done 2>/dev/null | grep -c '^sleep 30[012]'"
    left = fallback_sandbox.execute(scan).output.strip()
    assert left == "0"


def test_what_the_fallback_kills_does_not_stay_a_zombie(fallback_sandbox: KubernetesSandbox) -> None:
    """Processes killed after their exec ended are orphans of the pod's PID 1: it must reap them
    (the pod shares its process namespace, so PID 1 is the pause container, not ``sleep``)."""
    fallback_sandbox.execute("(sleep 300 &) ; setsid sleep 301 & sleep 302", timeout=1)
    zombies = "grep -l '^[0-9]* ([^)]*) Z' /proc/[0-9]*/stat 2>/dev/null | wc -l"
    for _ in range(50):  # the kill and the reaping land within a few commands' time
        if fallback_sandbox.execute(zombies).output.strip() == "0":
            return
    pytest.fail("killed processes stay zombies: nothing in the pod reaps them")


def test_big_files_move_over_exec_streams_of_their_own(
    helper_sandbox: KubernetesSandbox, fake_kubernetes: FakeKubernetes
) -> None:
    big = bytes(range(256)) * 16384  # 4 MiB, over the bulk threshold
    helper_sandbox.execute("true")
    before = fake_kubernetes.requests["exec"]
    paths = ["/workspace/bulk/a.bin", "/tmp/bulk/b.bin"]
    assert [r.error for r in helper_sandbox.upload_files([(path, big) for path in paths])] == [None, None]
    assert fake_kubernetes.requests["exec"] == before + 1  # one tar for the whole batch
    downloaded = helper_sandbox.download_files([*paths, "/workspace/bulk", "/workspace/bulk/missing"])
    assert [d.content for d in downloaded[:2]] == [big, big]
    assert downloaded[2].error == p.IS_DIRECTORY or downloaded[2].error is not None
    assert downloaded[3].error == p.FILE_NOT_FOUND
    assert fake_kubernetes.requests["exec"] >= before + 3  # each big download its own cat
    left = helper_sandbox.execute("ls -a /workspace/bulk /tmp/bulk").output
    assert ".sandboxes-write" not in left


def test_a_bulk_upload_past_the_workspace_answers_no_space(fake_kubernetes: FakeKubernetes, runtime_image: str) -> None:
    with _sandbox(fake_kubernetes, runtime_image, workspace_size="8Mi") as sandbox:
        big = b"x" * (6 << 20)
        results = sandbox.upload_files([("/workspace/one.bin", big), ("/workspace/two.bin", big)])
        assert [r.error for r in results] == [p.NO_SPACE, p.NO_SPACE]
        assert sandbox.execute("ls -A /workspace").output == ""


def test_a_memory_hog_answers_out_of_memory(fake_kubernetes: FakeKubernetes, runtime_image: str) -> None:
    limits = {"memory_limit": "64Mi", "memory_request": "64Mi", "workspace_size": "16Mi", "tmp_size": "16Mi"}
    with _sandbox(fake_kubernetes, runtime_image, **limits) as sandbox:
        hog = sandbox.execute("python3 -c 'a = bytearray(1 << 30)'", timeout=60)
        assert hog.exit_code == 137
        assert hog.error == p.OUT_OF_MEMORY
        assert "64Mi" in (hog.message or "")
        assert sandbox.execute("kill -9 $$").error is None  # a plain 137 is not taken for one


def test_kill_tagged_kills_a_jobs_tree_through_the_helper(
    helper_sandbox: KubernetesSandbox, fallback_sandbox: KubernetesSandbox
) -> None:
    """`sandboxes.base.KillsTagged` on a pod: the exec helper kills every process carrying a
    background job's marker, detached ones too, without an exec of its own; without a helper
    (the fallback) it answers ``False`` and the job runner kills with commands."""
    from sandboxes._helper._kill import JOB_MARKER_PREFIX, MARKER_ENV
    from sandboxes.base import KillsTagged
    from sandboxes.jobs import JobRunner

    assert isinstance(helper_sandbox, KillsTagged)
    runner = JobRunner(helper_sandbox)
    state = runner.start("setsid sh -c 'sleep 303 & exec sleep 303' & echo up; wait", timeout=120)
    marker = f"{JOB_MARKER_PREFIX}{state.id}"
    count = f"grep -lsxzF -e '{MARKER_ENV}={marker}' /proc/[0-9]*/environ | wc -l"
    deadline = time.monotonic() + 30
    while helper_sandbox.execute(count).output.strip() != "3":  # the leader, both sleeps
        assert time.monotonic() < deadline, runner.poll(state.id)
        time.sleep(0.05)
    assert helper_sandbox.kill_tagged(MARKER_ENV, marker) is True
    assert helper_sandbox.execute(count).output.strip() == "0"
    assert runner.kill(state.id).state.finished
    assert fallback_sandbox.kill_tagged(MARKER_ENV, marker) is False


@pytest.mark.parametrize("what", ["write", "stdin"])
def test_a_stopped_helper_cannot_hold_a_big_write_or_stdin(
    fake_kubernetes: FakeKubernetes, runtime_image: str, monkeypatch: pytest.MonkeyPatch, what: str, docker_client: Any
) -> None:
    """Closing the client closes the exec websocket, which wakes the blocked send."""
    sandbox = _sandbox(fake_kubernetes, runtime_image)
    try:
        assert sandbox.execute("true").exit_code == 0
        assert sandbox.helper_driver.mux is not None
        pid = str(sandbox.helper_driver.mux.info["pid"])
        container = docker_client.containers.get(fake_kubernetes.kubelet.containers[("sandboxes", sandbox.id)])

        def signal_helper(name: str) -> None:
            assert container.exec_run(["kill", f"-{name}", pid], user="1000").exit_code == 0

        assert_a_stopped_helper_cannot_hold_a_big_send(sandbox, monkeypatch, what, signal_helper)
    finally:
        sandbox.destroy()
