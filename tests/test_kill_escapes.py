"""What a sandboxed process does to its environment or its parentage does not let it outlive the
kill meant for it: a process that cleared its environment (``env -i``), left the group
(``setsid``), double-forked, or forged a background job's marker, is killed by its command's
timeout on the transports without the exec helper (an image without python3, busybox, an SSH
host without the helper, a local command jail), and by the kill of the background job
(`sandboxes.jobs`, the service's ``DELETE .../processes/{id}``) that started it, on every
backend."""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from ssh_fixtures import SSHVM, start_vm
from support import HAS_BWRAP, SESSION_OWNER, needs
from test_kill_forged import assert_the_timeout_kills_it

from sandboxes import protocol as p
from sandboxes._helper._kill import JOB_MARKER_PREFIX, MARKER_ENV
from sandboxes.base import BaseSandbox
from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.jobs import JobError, JobRunner
from sandboxes.local import LocalSandbox, LocalSandboxConfig
from sandboxes.ssh import SSHSandbox, SSHSandboxConfig

BUSYBOX = Path(__file__).parent / "fixtures" / "busybox"

DISGUISES = {
    "env-cleared": "env -i setsid",
    "forged-job-marker": f"env {MARKER_ENV}={JOB_MARKER_PREFIX}x setsid",
    "env-cleared-twice-forked": "env -i setsid sh -c '(setsid \"$@\" &)' sh",
}
"""How a process disguises itself: a prefix to the command it runs."""
VOUCHED = {
    "forged-marker-forking": f"env {MARKER_ENV}=sandboxes-forged setsid sh -c '\"$@\"; exit' sh",
}
"""A disguise whose process forges a command's marker and keeps a child carrying it, as if that
child were the running command's that the marker names: the child (whose pid is written) dies
too."""
SHAPES = {
    "child": "{disguise} sh -c {inner} < /dev/null > /dev/null 2>&1 & sleep 300",
    "orphan": "({disguise} sh -c {inner} < /dev/null > /dev/null 2>&1 &); sleep 300",
}


FALLBACK_TIMEOUT = 4.0
"""Seconds a command runs before its timeout here: without the helper every command starts a
jail, a ``docker exec`` or an SSH channel of its own, and the disguised process must have
started (written its pid) by then under a loaded CI machine's pace."""


@pytest.fixture(scope="module")
def busybox_image(docker_client: Any) -> str:
    from testcontainers.core.image import DockerImage

    with DockerImage(path=BUSYBOX, tag="sandboxes-test/busybox:latest", clean_up=False) as image:
        return str(image)


@pytest.fixture(scope="module")
def ssh_vm(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHVM]:
    vm = start_vm(tmp_path_factory.mktemp("ssh-escapes"))
    yield vm
    vm.stop()


def _open(kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BaseSandbox]:
    if kind.startswith("local"):
        needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
        root = tmp_path_factory.mktemp("escapes-local")
        config = LocalSandboxConfig(root_dir=root, isolation="bwrap", use_exec_helper=kind == "local")
        with LocalSandbox(config=config) as local:
            yield local
        return
    if kind.startswith("ssh"):
        vm: SSHVM = request.getfixturevalue("ssh_vm")
        ssh = SSHSandbox.create(SSHSandboxConfig(host=vm.host_config(), use_exec_helper=kind == "ssh"))
        try:
            yield ssh
        finally:
            ssh.destroy()
        return
    image = {"docker": "runtime_image", "no-python": "no_python_image", "busybox": "busybox_image"}[kind]
    config = DockerSandboxConfig(image=request.getfixturevalue(image), owner=SESSION_OWNER)
    with DockerSandbox.create(config, client=request.getfixturevalue("docker_client")) as docker:
        yield docker


@pytest.fixture(scope="module", params=["local-no-helper", "no-python", "busybox", "ssh-no-helper"])
def fallback(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BaseSandbox]:
    """A sandbox whose commands run without the exec helper."""
    yield from _open(request.param, request, tmp_path_factory)


@pytest.fixture(scope="module", params=["local", "docker", "busybox", "ssh", "ssh-no-helper"])
def sandbox(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BaseSandbox]:
    yield from _open(request.param, request, tmp_path_factory)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("disguise", sorted(DISGUISES))
def test_a_timeout_without_the_helper_kills_what_disguised_itself(
    fallback: BaseSandbox, disguise: str, shape: str
) -> None:
    assert not getattr(getattr(fallback, "helper_driver", None), "mux", None), "the exec helper runs here"
    assert_the_timeout_kills_it(fallback, disguise, shape, DISGUISES, SHAPES, timeout=FALLBACK_TIMEOUT)


@pytest.mark.parametrize("disguise", sorted(VOUCHED))
def test_a_timeout_without_the_helper_kills_what_its_own_child_vouches_for(
    fallback: BaseSandbox, disguise: str
) -> None:
    assert not getattr(getattr(fallback, "helper_driver", None), "mux", None), "the exec helper runs here"
    assert_the_timeout_kills_it(fallback, disguise, "orphan", VOUCHED, SHAPES, timeout=FALLBACK_TIMEOUT)


def _alive(sandbox: BaseSandbox, pid: str) -> bool:
    look = f'kill -0 {pid} 2>/dev/null && s=$(cut -d" " -f3 /proc/{pid}/stat) && [ "$s" != Z ] && echo alive'
    return sandbox.execute(look).output.strip() == "alive"


@pytest.mark.parametrize(
    ("disguise", "shape"), [(d, s) for d in sorted(DISGUISES) for s in sorted(SHAPES)] + [(*VOUCHED, "orphan")]
)
def test_a_jobs_kill_kills_what_disguised_itself(sandbox: BaseSandbox, disguise: str, shape: str) -> None:
    """A background job starts a disguised process that writes its pid; killing the job (the
    service's ``DELETE .../processes/{id}``) leaves it alive for no more than 10 s."""
    disguises = {**DISGUISES, **VOUCHED}
    workdir = sandbox.execute("pwd").output.strip()
    pid_file = shlex.quote(f"{workdir}/job-{disguise}-{shape}.pid")
    sandbox.execute(f"rm -f {pid_file}")
    inner = shlex.quote(f"echo $$ > {pid_file}.new && mv {pid_file}.new {pid_file}; exec sleep 300")
    runner = JobRunner(sandbox)
    state = runner.start(SHAPES[shape].format(disguise=disguises[disguise], inner=inner), timeout=120)
    deadline = time.monotonic() + 20
    while not (pid := sandbox.execute(f"cat {pid_file} 2>/dev/null").output.strip()).isdigit():
        assert time.monotonic() < deadline, f"the disguised process never started: {runner.poll(state.id)}"
        time.sleep(0.05)
    try:
        assert runner.kill(state.id).state.status == "killed"
        deadline = time.monotonic() + 10
        while _alive(sandbox, pid):
            assert time.monotonic() < deadline, f"{disguise} process {pid} outlived the kill of its job"
            time.sleep(0.05)
    finally:
        sandbox.execute(f"kill -9 {pid} 2>/dev/null")


@pytest.mark.parametrize("kind", ["ssh-no-helper", "no-python", "busybox"])
def test_a_running_commands_escapee_outlives_another_commands_sweep(
    kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Without the helper (over SSH, or in a container, whose init adopts it): a process that
    left a command still running (its parent shell waits on), born while another command ran,
    is spared by that other command's end (its marker is carried by a process in a running
    command's tree), and dies with its own."""
    for sandbox in _open(kind, request, tmp_path_factory):
        workdir = sandbox.execute("pwd").output.strip()
        began, pid_file = shlex.quote(f"{workdir}/b-began"), shlex.quote(f"{workdir}/daemon.pid")
        other = f"echo > {began}; while [ ! -s {pid_file} ]; do sleep 0.05; done"
        inner = shlex.quote(f"echo $$ > {pid_file}.new && mv {pid_file}.new {pid_file}; exec sleep 300")
        own = f"(setsid sh -c {inner} < /dev/null > /dev/null 2>&1 &); sleep 300"
        with ThreadPoolExecutor(2) as pool:
            ended = pool.submit(sandbox.execute, other, timeout=30)
            deadline = time.monotonic() + 20
            while sandbox.execute(f"[ -e {began} ] && echo yes").output.strip() != "yes":
                assert time.monotonic() < deadline, "the other command never began"
                time.sleep(0.05)
            timed_out = pool.submit(sandbox.execute, own, timeout=FALLBACK_TIMEOUT + 4)
            assert ended.result().exit_code == 0
            pid = sandbox.execute(f"cat {pid_file}").output.strip()
            assert pid.isdigit(), pid
            assert _alive(sandbox, pid), "the other command's end killed a running command's process"
            assert timed_out.result().error == p.TIMEOUT
        deadline = time.monotonic() + 10
        while _alive(sandbox, pid):
            assert time.monotonic() < deadline, f"process {pid} outlived its own command's timeout"
            time.sleep(0.05)


FULL_PIDS = 40
"""The pids limit of the Docker sandboxes that a command's leftovers fill: small, so that they
fill it within milliseconds."""
FULL_NPROC = 64
"""The SSH sandbox user's process limit: larger, since the kernel counts that uid's processes in
every container that shares it (other SSH VMs' sandboxes)."""
RETAKER = "while :; do command eval 'sleep 300 &'; done 2>/dev/null"
"""A shell that forks again whenever a fork fails (``command eval``: the failure does not end
it): every pid that frees up in its sandbox is taken back at once, so the sandbox stays full."""
FILL_AND_LEAVE = (
    f"env -i setsid sh -c {shlex.quote(RETAKER)} < /dev/null > /dev/null 2>&1 & "
    "while command eval ': $(:)' 2>/dev/null; do :; done; echo full"
)
"""A command that leaves `RETAKER` behind, its environment cleared (no marker: only the sweep of
strays can find it), and ends once no process can start any more, printing ``full``."""
COUNT_PROCESSES = 'n=0; for d in /proc/[0-9]*; do [ -O "$d" ] && n=$((n + 1)); done; echo $n'
"""How many processes the sandbox's user runs, with the shell's built-ins alone."""


def _count_processes(sandbox: BaseSandbox) -> int | None:
    """`COUNT_PROCESSES`, or ``None`` where the sandbox cannot start it (its pids are full)."""
    try:
        output = sandbox.execute(COUNT_PROCESSES, timeout=10).output.strip()
    except Exception:  # the engine refused the exec, or the channel failed: no pid left for it
        return None
    return int(output) if output.isdigit() else None


@pytest.mark.parametrize("image", ["no_python_image", "busybox_image"])
def test_a_commands_leftovers_that_fill_the_pids_limit_are_swept(
    image: str, request: pytest.FixtureRequest, docker_client: Any
) -> None:
    """Without the helper (dash; busybox ash), the sweep after a command finds the sandbox full
    of what the command left, which takes back every pid that frees up: the sweeping shell cannot
    fork (a shell whose ``$(...)`` cannot fork exits), yet the command's own answer comes back and
    nothing it left survives."""
    config = DockerSandboxConfig(image=request.getfixturevalue(image), owner=SESSION_OWNER, pids=FULL_PIDS)
    with DockerSandbox.create(config, client=docker_client) as sandbox:
        assert not getattr(sandbox.helper_driver, "mux", None), "the exec helper runs here"
        _assert_the_leftovers_that_fill_it_are_swept(sandbox)


def _assert_the_leftovers_that_fill_it_are_swept(sandbox: BaseSandbox) -> None:
    deadline = time.monotonic() + 10
    while (before := _count_processes(sandbox)) is None:  # SSH: the user's processes elsewhere count too
        assert time.monotonic() < deadline, "the sandbox could not start a process before the command"
        time.sleep(0.05)
    assert before < 10, before
    result = sandbox.execute(FILL_AND_LEAVE, timeout=60)
    assert (result.exit_code, result.output) == (0, "full\n"), result
    deadline = time.monotonic() + 10
    while (left := _count_processes(sandbox)) != before:
        assert time.monotonic() < deadline, f"{left} processes run, {before} before the command"
        time.sleep(0.05)


@pytest.fixture
def nproc_limited(ssh_vm: SSHVM) -> Iterator[SSHSandbox]:
    """An SSH sandbox without the helper whose user may run `FULL_NPROC` processes
    (``RLIMIT_NPROC`` through ``pam_limits``, which the user switch applies to every command)."""
    sandbox = SSHSandbox.create(SSHSandboxConfig(host=ssh_vm.host_config(), use_exec_helper=False))
    limits = f"/etc/security/limits.d/{sandbox.user}.conf"
    try:
        assert sandbox.user is not None
        assert sandbox.execute("true").exit_code == 0  # the exec helper was tried, and dropped
        assert not getattr(getattr(sandbox, "helper_driver", None), "mux", None), "the exec helper runs here"
        written = ssh_vm.docker.exec_run(["sh", "-c", f'echo "$0 - nproc {FULL_NPROC}" > {limits}', sandbox.user])
        assert written.exit_code == 0, written
        yield sandbox
    finally:
        ssh_vm.docker.exec_run(["rm", "-f", limits])
        sandbox.destroy()


def test_a_commands_leftovers_that_fill_the_users_process_limit_are_swept(nproc_limited: SSHSandbox) -> None:
    """Over SSH without the helper (dash): the same, the limit being the sandbox user's process
    limit: the sweep of what the host's init adopted (``kill_strays``) runs in a shell that cannot
    fork, and the end of the command's output is still marked."""
    _assert_the_leftovers_that_fill_it_are_swept(nproc_limited)


def test_a_jobs_leftovers_that_fill_the_users_process_limit_are_swept(nproc_limited: SSHSandbox) -> None:
    """A background job's supervisor sweeps what its command left (its adoptees) in a sandbox that
    the leftovers keep full, and still records the job's end."""
    before = _count_processes(nproc_limited)
    go = f"{nproc_limited.workspace}/go"
    runner = JobRunner(nproc_limited)
    state = runner.start(f"while [ ! -e {go} ]; do sleep 0.05; done; {FILL_AND_LEAVE}", timeout=60)
    assert nproc_limited.execute(f"touch {go}").exit_code == 0  # once the job's start has answered
    deadline = time.monotonic() + 30
    while True:
        try:
            job = runner.poll(state.id)
        except JobError:  # the poll's own process could not start (`CannotFork`): the sandbox is full
            job = None
        if job is not None and job.state.finished:
            break
        assert time.monotonic() < deadline, f"the job never ended: {job}"
        time.sleep(0.05)
    assert (job.state.status, job.state.exit_code, job.output) == ("exited", 0, b"full\n"), job
    deadline = time.monotonic() + 10
    while (left := _count_processes(nproc_limited)) != before:
        assert time.monotonic() < deadline, f"{left} processes run, {before} before the job"
        time.sleep(0.05)
