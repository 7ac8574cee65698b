"""`tests/test_kill_forged.py` on a Kubernetes pod (the fake API server's), through the exec helper:
a timeout kills what cleared its environment or forged a job's marker; and `tests/test_kill_escapes.py`'s
disguises on a pod without the helper (an image without python3), by a timeout or the command's end."""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator
from typing import Any

import pytest
import test_kill_escapes as escapes
from fake_apiserver import FakeKubernetes
from support import SESSION_OWNER
from test_kill_forged import DISGUISES, SHAPES, assert_the_timeout_kills_it

from sandboxes.jobs import JobRunner
from sandboxes.kubernetes import KubernetesSandbox, KubernetesSandboxConfig

_ALL_DISGUISES = {**escapes.DISGUISES, **escapes.VOUCHED}


@pytest.fixture(scope="module")
def sandbox(fake_kubernetes: FakeKubernetes, runtime_image: str) -> Iterator[KubernetesSandbox]:
    from kubernetes import client

    api_client: Any = client.ApiClient(client.Configuration(host=fake_kubernetes.url))
    template = KubernetesSandboxConfig(image=runtime_image, owner=SESSION_OWNER)
    with KubernetesSandbox.create(template, api_client=api_client) as sb:
        yield sb


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("disguise", DISGUISES)
def test_a_timeout_kills_what_cleared_or_forged_its_environment(
    sandbox: KubernetesSandbox, disguise: str, shape: str
) -> None:
    assert_the_timeout_kills_it(sandbox, disguise, shape)


@pytest.fixture(scope="module")
def fallback(fake_kubernetes_v4: FakeKubernetes, no_python_image: str) -> Iterator[KubernetesSandbox]:
    """A pod whose image has no python3: each command is an exec of its own, without the helper
    (over ``v4``, which cannot end an exec's stdin)."""
    from kubernetes import client

    api_client: Any = client.ApiClient(client.Configuration(host=fake_kubernetes_v4.url))
    template = KubernetesSandboxConfig(image=no_python_image, owner=SESSION_OWNER)
    with KubernetesSandbox.create(template, api_client=api_client) as sb:
        yield sb


@pytest.mark.parametrize("shape", sorted(escapes.SHAPES))
@pytest.mark.parametrize("disguise", sorted(_ALL_DISGUISES))
def test_a_timeout_without_the_helper_kills_what_disguised_itself(
    fallback: KubernetesSandbox, disguise: str, shape: str
) -> None:
    """An ``env -i``'d, ``setsid``'d, twice-forked or forged process of a timed-out command is
    gone, found by owner, parent and start time (`sandboxes._scripts.KILL_MARKED`'s ``kill_strays``)."""
    assert fallback.helper_driver.mux is None, "the exec helper runs here"
    assert_the_timeout_kills_it(
        fallback, disguise, shape, _ALL_DISGUISES, escapes.SHAPES, timeout=escapes.FALLBACK_TIMEOUT
    )


@pytest.mark.parametrize("disguise", sorted(escapes.DISGUISES))
def test_a_command_without_the_helper_ends_with_what_disguised_itself(
    fallback: KubernetesSandbox, disguise: str
) -> None:
    """A command that exits 0 once its disguised child started leaves it running no more than 10 s."""
    pid_file = shlex.quote(f"/tmp/ended-{disguise}.pid")
    inner = shlex.quote(f"echo $$ > {pid_file}.new && mv {pid_file}.new {pid_file}; exec sleep 300")
    disguised = escapes.DISGUISES[disguise]
    command = f"rm -f {pid_file}; {disguised} sh -c {inner} < /dev/null > /dev/null 2>&1 & "
    command += f"while [ ! -s {pid_file} ]; do sleep 0.05; done"
    assert fallback.execute(command, timeout=30).exit_code == 0
    pid = fallback.execute(f"cat {pid_file}").output.strip()
    assert pid.isdigit(), pid
    try:
        deadline = time.monotonic() + 10
        while escapes._alive(fallback, pid):
            assert time.monotonic() < deadline, f"{disguise} process {pid} outlived its command"
            time.sleep(0.05)
    finally:
        fallback.execute(f"kill -9 {pid} 2>/dev/null")


def test_a_job_started_without_the_helper_outlives_the_sweep_of_strays(fallback: KubernetesSandbox) -> None:
    """The supervisor a background job leaves (adopted by the pod's init, started during its
    command) is a live job's, spared by that command's sweep and the next ones; its kill ends it."""
    runner = JobRunner(fallback)
    state = runner.start("sleep 300", timeout=120)
    for _ in range(3):
        assert fallback.execute("true").exit_code == 0
    assert runner.poll(state.id).state.status == "running"
    assert runner.kill(state.id).state.status == "killed"
