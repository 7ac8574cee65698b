"""A command's timeout kills what it started whatever that process did to its environment: cleared
it (``env -i``) and left the group (``setsid``), or forged a background job's marker, still a
child of the command or orphaned at once. Over the exec helper of a local jail, a Docker
container and an SSH host (each kills by what it saw, not by what a process claims)."""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator
from typing import Any

import pytest
from ssh_fixtures import SSHVM, start_vm
from support import HAS_BWRAP, SESSION_OWNER, needs

from sandboxes import protocol as p
from sandboxes._helper._kill import JOB_MARKER_PREFIX, MARKER_ENV
from sandboxes.base import BaseSandbox
from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.jobs import JobRunner
from sandboxes.local import LocalSandbox, LocalSandboxConfig
from sandboxes.ssh import SSHSandbox, SSHSandboxConfig

_DISGUISES = {
    "env-cleared": "env -i setsid",
    "forged-job-marker": f"env {MARKER_ENV}={JOB_MARKER_PREFIX}x setsid",
}
_SHAPES = {
    "child": "{disguise} sh -c {inner} < /dev/null > /dev/null 2>&1 & sleep 300",
    "orphan": "({disguise} sh -c {inner} < /dev/null > /dev/null 2>&1 &); sleep 300",
}


@pytest.fixture(scope="module", params=["local", "docker", "ssh"])
def sandbox(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BaseSandbox]:
    if request.param == "local":
        needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
        root = tmp_path_factory.mktemp("forged-local")
        with LocalSandbox(config=LocalSandboxConfig(root_dir=root, isolation="bwrap")) as local:
            yield local
    elif request.param == "docker":
        docker_client: Any = request.getfixturevalue("docker_client")
        config = DockerSandboxConfig(image=request.getfixturevalue("runtime_image"), owner=SESSION_OWNER)
        with DockerSandbox.create(config, client=docker_client) as docker:
            yield docker
    else:
        request.getfixturevalue("docker_client")  # the VM is a container
        vm: SSHVM = start_vm(tmp_path_factory.mktemp("forged-ssh"))
        try:
            ssh = SSHSandbox.create(SSHSandboxConfig(host=vm.host_config()))
            try:
                yield ssh
            finally:
                ssh.destroy()
        finally:
            vm.stop()


def _workdir(sandbox: BaseSandbox) -> str:
    return str(sandbox.execute("pwd").output.strip())


def _alive(sandbox: BaseSandbox, pid: str) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    look = f'kill -0 {pid} 2>/dev/null && s=$(cut -d" " -f3 /proc/{pid}/stat) && [ "$s" != Z ] && echo alive'
    return sandbox.execute(look).output.strip() == "alive"


DISGUISES = sorted(_DISGUISES)
SHAPES = sorted(_SHAPES)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("disguise", DISGUISES)
def test_a_timeout_kills_what_cleared_or_forged_its_environment(
    sandbox: BaseSandbox, disguise: str, shape: str
) -> None:
    assert_the_timeout_kills_it(sandbox, disguise, shape)


def assert_the_timeout_kills_it(
    sandbox: BaseSandbox,
    disguise: str,
    shape: str,
    disguises: dict[str, str] = _DISGUISES,
    shapes: dict[str, str] = _SHAPES,
    timeout: float = 2,
) -> None:
    """A command starts a ``disguise``d process (``shape``: its child, or orphaned at once) that
    writes its pid and sleeps, then times out after ``timeout`` seconds: that process is gone
    within 10 s."""
    pid_file = f"{_workdir(sandbox)}/{disguise}-{shape}.pid"
    quoted = shlex.quote(pid_file)
    sandbox.execute(f"rm -f {quoted}")
    inner = shlex.quote(f"echo $$ > {quoted}.new && mv {quoted}.new {quoted}; exec sleep 300")
    command = f"{shapes[shape].format(disguise=disguises[disguise], inner=inner)}"
    result = sandbox.execute(command, timeout=timeout)
    assert result.error == p.TIMEOUT, result
    pid = sandbox.execute(f"cat {quoted}").output.strip()
    assert pid.isdigit(), f"the disguised process never started: {pid!r}"
    try:
        deadline = time.monotonic() + 10
        while _alive(sandbox, pid):
            assert time.monotonic() < deadline, f"{disguise} process {pid} outlived its command's timeout"
            time.sleep(0.05)
    finally:
        sandbox.execute(f"kill -9 {pid} 2>/dev/null")
    assert sandbox.execute("echo alive").output == "alive\n"


def test_a_job_started_by_the_runner_outlives_the_sweep_that_kills_forgeries(sandbox: BaseSandbox) -> None:
    """The job the helper saw started is spared by the sweep that kills a forged marker."""
    runner = JobRunner(sandbox)
    state = runner.start("echo up; exec sleep 300", timeout=120)
    try:
        for _ in range(3):
            result = sandbox.execute(f"({_DISGUISES['forged-job-marker']} sleep 301 &); sleep 300", timeout=1)
            assert result.error == p.TIMEOUT, result
        assert runner.poll(state.id).state.status == "running"
    finally:
        assert runner.kill(state.id).state.status == "killed"
