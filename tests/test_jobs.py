"""`sandboxes.jobs` over real backends: a local bubblewrap jail, Docker (the runtime image with its
exec helper, and a busybox-only image without python3), and an SSH VM (with and without the exec
helper). Jobs are started, polled from offsets, killed with their forking and detached trees,
timed out inside the sandbox, fed hostile commands, environments and directories, and outlive
the handle (and exec helper) that started them."""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ssh_fixtures import SSHVM, start_vm
from support import FORKING_TREES, RETAKE_PIDS, SESSION_OWNER

from sandboxes import protocol as p
from sandboxes._helper._kill import JOB_MARKER_PREFIX, MARKER_ENV
from sandboxes.base import BaseSandbox
from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.jobs import CannotFork, Job, JobError, JobNotFound, JobRunner, TooManyJobs
from sandboxes.local import LocalSandbox, LocalSandboxConfig
from sandboxes.ssh import SSHSandbox, SSHSandboxConfig

BUSYBOX = Path(__file__).parent / "fixtures" / "busybox"


@dataclass
class Backend:
    sandbox: BaseSandbox
    reattach: Callable[[], BaseSandbox] | None
    """Closes the sandbox's handle (its exec helper with it, as a service restart does) and
    attaches a new one; ``None`` where a job cannot outlive its handle (a local jail)."""
    workdir: str


@pytest.fixture(scope="module")
def busybox_image(docker_client: Any, runtime_image: str) -> str:
    from testcontainers.core.image import DockerImage

    with DockerImage(path=BUSYBOX, tag="sandboxes-test/busybox:latest", clean_up=False) as image:
        return str(image)


@pytest.fixture(scope="module")
def ssh_vm(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHVM]:
    vm = start_vm(tmp_path_factory.mktemp("ssh-jobs"))
    yield vm
    vm.stop()


def _docker(image: str, docker_client: Any) -> Iterator[Backend]:
    sandbox = DockerSandbox.create(DockerSandboxConfig(image=image, owner=SESSION_OWNER), client=docker_client)
    handles = [sandbox]

    def reattach() -> BaseSandbox:
        handles[-1].close()
        handles.append(DockerSandbox.attach(sandbox.id, client=docker_client))
        return handles[-1]

    try:
        yield Backend(sandbox, reattach, "/workspace")
    finally:
        handles[-1].destroy()


def _ssh(vm: SSHVM, helper: bool) -> Iterator[Backend]:
    config = SSHSandboxConfig(host=vm.host_config(), use_exec_helper=helper)
    sandbox = SSHSandbox.create(config)
    handles = [sandbox]

    def reattach() -> BaseSandbox:
        handles[-1].close()
        handles.append(SSHSandbox.attach(config, sandbox.workspace))
        return handles[-1]

    try:
        yield Backend(sandbox, reattach, sandbox.workspace)
    finally:
        handles[-1].destroy()


@pytest.fixture(scope="module", params=["local", "docker", "busybox", "ssh", "ssh-no-helper"])
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    kind = request.param
    if kind == "local":
        root = tmp_path_factory.mktemp("jobs-local")
        with LocalSandbox(config=LocalSandboxConfig(root_dir=root, isolation="bwrap")) as sandbox:
            yield Backend(sandbox, None, str(root))
        return
    docker_client = request.getfixturevalue("docker_client")
    if kind in ("docker", "busybox"):
        image = request.getfixturevalue("runtime_image" if kind == "docker" else "busybox_image")
        yield from _docker(image, docker_client)
        return
    yield from _ssh(request.getfixturevalue("ssh_vm"), helper=kind == "ssh")


def _until_finished(runner: JobRunner, job_id: str, timeout: float = 30) -> Job:
    deadline = time.monotonic() + timeout
    while True:
        job = runner.poll(job_id)
        if job.state.finished:
            return job
        assert time.monotonic() < deadline, f"job {job_id} still running: {job}"
        time.sleep(0.05)


def _until_output(runner: JobRunner, job_id: str, wanted: bytes, timeout: float = 30) -> Job:
    deadline = time.monotonic() + timeout
    while wanted not in (job := runner.poll(job_id)).output:
        assert not job.state.finished, f"job ended without printing {wanted!r}: {job}"
        assert time.monotonic() < deadline, f"no {wanted!r} from job {job_id}: {job}"
        time.sleep(0.05)
    return job


def _marked(sandbox: BaseSandbox, job_id: str) -> int:
    """Processes carrying the job's command marker (its tree)."""
    count = f"grep -lsxzF -e '{MARKER_ENV}={JOB_MARKER_PREFIX}{job_id}' /proc/[0-9]*/environ | wc -l"
    return int(sandbox.execute(count).output.strip() or 0)


def _try_marked(sandbox: BaseSandbox, job_id: str) -> int | None:
    """`_marked`, or ``None`` when the sandbox could not run the count (no pid left)."""
    count = f"grep -lsxzF -e '{MARKER_ENV}={JOB_MARKER_PREFIX}{job_id}' /proc/[0-9]*/environ | wc -l"
    output = sandbox.execute(count).output.strip() or "0"
    return int(output) if output.isdigit() else None


def _job_processes(sandbox: BaseSandbox, job_id: str) -> int:
    """Processes of the job in any role (command, supervisor, output, watchdog). The needle is
    split in the command's text: an SSH sandbox's user switch (``sudo``) puts that text in the
    environment (``SUDO_COMMAND``), where it would count itself."""
    count = f"grep -lsF -e '{MARKER_ENV}={JOB_MARKER_PREFIX}''{job_id}' /proc/[0-9]*/environ | wc -l"
    return int(sandbox.execute(count).output.strip() or 0)


# ---------------------------------------------------------------------- start, poll, exit


def test_exit_code_and_binary_output_with_stdout_and_stderr_apart(backend: Backend) -> None:
    runner = JobRunner(backend.sandbox)
    state = runner.start("printf 'out\\000\\377\\n'; printf 'err\\n' >&2; printf 'more'; exit 3")
    assert state.status == "running"
    job = _until_finished(runner, state.id)
    assert (job.state.status, job.state.exit_code) == ("exited", 3)
    assert job.output == b"out\x00\xff\nmore"
    assert job.errors == ((0, b"err\n"),)
    assert (job.stdout(), job.stderr()) == ("out\x00\ufffd\nmore", "err\n")
    assert job.text() == "out\x00\ufffd\nmore\nerr\n"  # the merged view: the stdout, then the stderr
    assert runner.poll(state.id, offset=4, errors_offset=1).errors == ((1, b"rr\n"),)
    response = job.response()
    assert (response.exit_code, response.error, response.truncated) == (3, None, False)
    assert response.duration_ms is not None
    assert _job_processes(backend.sandbox, state.id) == 0  # supervisor, output, watchdog: all gone


def test_poll_from_offsets_and_bounded(backend: Backend) -> None:
    runner = JobRunner(backend.sandbox)
    gate = f"{backend.workdir}/gate-{uuid.uuid4().hex[:8]}"
    state = runner.start(f"printf first; while [ ! -e {gate} ]; do sleep 0.05; done; printf second", timeout=60)
    first = _until_output(runner, state.id, b"first")
    assert (first.output, first.end) == (b"first", 5)
    assert runner.poll(state.id, offset=first.end).output == b""
    assert runner.poll(state.id, offset=1, limit=3).chunks == ((1, b"irs"),)
    backend.sandbox.execute(f"touch {gate}")
    done = _until_finished(runner, state.id)
    assert done.output == b"firstsecond"
    assert runner.poll(state.id, offset=first.end).chunks == ((5, b"second"),)


def test_stdin_cwd_and_env_reach_the_command_as_given(backend: Backend) -> None:
    runner = JobRunner(backend.sandbox)
    hostile = "a'b\"c $(touch PWNED) `touch PWNED` ; & | \n\\ %s *"
    where = f"{backend.workdir}/dir with 'quotes' $(touch PWNED)"
    assert backend.sandbox.execute('mkdir -p -- "$D"', env={"D": where}).exit_code == 0
    state = runner.start(
        'printf "%s|" "$V" "$(pwd)" "${SANDBOXES_EXEC_ID%%-*}"; cat',
        env={"V": hostile, "W": "x"},
        cwd=where,
        stdin=bytes(range(256)),
    )
    job = _until_finished(runner, state.id)
    assert job.state.exit_code == 0, job
    assert job.output == f"{hostile}|{where}|sandboxes|".encode() + bytes(range(256))
    found = backend.sandbox.execute(f"find {backend.workdir} /tmp -name PWNED 2>/dev/null").output
    assert found == ""


def test_hostile_command_string_is_the_commands_own(backend: Backend) -> None:
    runner = JobRunner(backend.sandbox)
    command = 'echo \'$(touch PWNED)\' "it\'s"; echo "$0" | grep -c sh; exit 4'
    job = _until_finished(runner, runner.start(command).id)
    assert (job.state.exit_code, job.output) == (4, b"$(touch PWNED) it's\n1\n")
    assert backend.sandbox.execute(f"find {backend.workdir} /tmp -name PWNED 2>/dev/null").output == ""


def test_missing_cwd_is_file_not_found(backend: Backend) -> None:
    runner = JobRunner(backend.sandbox)
    job = _until_finished(runner, runner.start("echo ran", cwd=f"{backend.workdir}/missing").id)
    assert (job.state.status, job.state.reason, job.output) == ("failed", "cwd", b"")
    assert job.response().error == p.FILE_NOT_FOUND


def test_hostile_job_ids_are_not_found(backend: Backend) -> None:
    runner = JobRunner(backend.sandbox)
    for job_id in ("../../etc", "0" * 31 + "/", "$(touch PWNED)", "0" * 32):
        with pytest.raises(JobNotFound):
            runner.poll(job_id)
        with pytest.raises(JobNotFound):
            runner.kill(job_id)


# ---------------------------------------------------------------------- output past the limit


def test_output_past_the_limit_keeps_head_and_tail_and_the_command_runs_on(backend: Backend) -> None:
    runner = JobRunner(backend.sandbox)
    total = 3_000_000
    state = runner.start(
        f"head -c {total} /dev/zero | tr '\\0' x; echo; echo last-line; exit 5", output_limit=10_000, timeout=120
    )
    job = _until_finished(runner, state.id, timeout=120)
    assert (job.state.status, job.state.exit_code) == ("exited", 5)  # not killed by SIGPIPE (141)
    output = job.output
    assert len(output) <= 10_000
    assert output.startswith(b"x" * 5_000)
    assert output.endswith(b"x\nlast-line\n")
    assert len(output) + job.dropped == total + len(b"\nlast-line\n")
    response = job.response()
    assert response.truncated
    dropped = re.search(r"\[(\d+) bytes of output truncated\]", response.output)
    assert dropped is not None
    assert int(dropped.group(1)) == job.dropped


# ---------------------------------------------------------------------- kill and timeout


CHAIN = """if [ "$1" -gt 0 ]; then exec sh "$0" $(($1 - 1)) "$2"; fi
i=0; while :; do i=$((i + 1)); echo "$i" > "$2"; sleep 0.1; done
"""
"""``sh chain.sh N BEAT``: exec's itself N times, then counts into BEAT every 0.1 s."""


def test_a_jobs_orphan_exec_ing_is_not_taken_for_one_that_dropped_its_marker(backend: Backend) -> None:
    """A job's process left by its subshell is adopted (by the helper or the container's init)
    and, while it execs, has for a moment no environment in ``/proc``: the sweep of what escaped
    a command, after every command, took it for one that dropped its marker and killed it (8 of
    20 such chains never ran on Docker; the service's background-kill test failed for it)."""
    sandbox = backend.sandbox
    runner = JobRunner(sandbox)
    chain = f"{backend.workdir}/chain.sh"
    assert sandbox.write(chain, CHAIN).error is None
    for i in range(8):
        beat = f"{backend.workdir}/chain-beat-{i}"
        state = runner.start(f"(setsid sh {chain} 30 {beat} &); sleep 100")
        try:
            seen: set[str] = set()
            deadline = time.monotonic() + 10
            while len(seen) < 2:  # each look is a command, and a sweep after it
                assert time.monotonic() < deadline, f"chain {i} never counted twice: {seen}"
                looked = sandbox.execute(f"cat {beat} 2>/dev/null")
                if looked.exit_code == 0 and looked.output.strip():
                    seen.add(looked.output)
        finally:
            runner.kill(state.id)


def test_kill_takes_down_a_tree_that_forks_and_detaches(backend: Backend) -> None:
    """The trees reach the sandbox's pids limit (256) within milliseconds, after which the
    sandbox may not start the counting command either: both mean they forked. (Their loops end
    at the first fork that fails, and ``wait`` with them: the leader then waits on, without a
    fork, so that the job is still running when it is killed.)"""
    runner = JobRunner(backend.sandbox)
    state = runner.start(f"echo started; {FORKING_TREES}; exec sleep 1000", timeout=120)
    deadline = time.monotonic() + 30
    while (count := _try_marked(backend.sandbox, state.id)) is not None and count < 50:
        assert time.monotonic() < deadline, "the trees did not start forking"
        time.sleep(0.05)
    job = runner.kill(state.id)
    assert job.state.status == "killed"
    assert job.output.startswith(b"started\n")
    assert _marked(backend.sandbox, state.id) == 0
    assert _job_processes(backend.sandbox, state.id) == 0
    assert runner.kill(state.id).state.status == "killed"  # idempotent
    assert runner.poll(state.id).response().message is not None


FILL_PIDS = (
    'echo filling; if command -v python3 > /dev/null; then exec python3 -c "$RETAKE"; fi; '
    "sh -c 'i=0; while [ $i -lt 1000 ]; do sleep 300 & i=$((i + 1)); done' 2>/dev/null; exec sleep 300"
)
"""Takes every pid the sandbox may have (256) for 5 minutes. Where there is a python3, a process
that forks again whenever a fork fails: every pid that frees up is taken back within
milliseconds, so the sandbox stays full. Elsewhere (busybox) a shell loop, which ends at its
first failed fork (a shell that cannot fork exits) and leaves a pid or two free."""


def _until_cannot_fork(operation: Callable[[], object], timeout: float = 30) -> CannotFork:
    deadline = time.monotonic() + timeout
    while True:
        try:
            operation()
        except CannotFork as full:
            return full
        assert time.monotonic() < deadline, "the job did not fill the sandbox's pids"
        time.sleep(0.05)


@pytest.mark.parametrize("backend", ["local", "docker", "busybox"], indirect=True)
def test_kill_works_when_the_job_took_every_pid(backend: Backend) -> None:
    """What a user needs when a job fork-bombs: every script the runner sends dies at its first
    fork (``sh: Cannot fork``) or cannot start at all. Poll says so, clearly; kill still kills
    (the exec helper's kill by marker where there is one, built-in shell steps where there is
    not: busybox), the job ends ``killed`` and the sandbox works again."""
    runner = JobRunner(backend.sandbox)
    retakes = "python3" in backend.sandbox.execute("command -v python3").output
    state = runner.start(FILL_PIDS, timeout=600, env={"RETAKE": RETAKE_PIDS})
    if retakes:  # full for good
        full = _until_cannot_fork(lambda: runner.poll(state.id))
        assert (full.code, "cannot start processes" in full.message) == (p.UNAVAILABLE, True)
        assert _until_cannot_fork(runner.list).code == p.UNAVAILABLE
    else:  # full, or a pid or two short of it: the counting command cannot run, or counts 200
        deadline = time.monotonic() + 30
        while (count := _try_marked(backend.sandbox, state.id)) is not None and count < 200:
            assert time.monotonic() < deadline, "the job did not fill the sandbox's pids"
            time.sleep(0.05)
    job = runner.kill(state.id)
    assert job.state.status == "killed"
    assert job.output == b"filling\n"
    assert job.state.ended_ns is not None
    assert _job_processes(backend.sandbox, state.id) == 0
    assert backend.sandbox.execute("echo alive").output == "alive\n"
    assert [s.status for s in runner.list() if s.id == state.id] == ["killed"]


def test_kill_finds_a_leader_that_left_no_marker_in_its_environment(backend: Backend) -> None:
    """``env -i`` drops the marker from the leader itself: its process group still finds it."""
    runner = JobRunner(backend.sandbox)
    state = runner.start("exec env -i /bin/sh -c 'echo up; exec sleep 1001'", timeout=120)
    _until_output(runner, state.id, b"up\n")
    sleeping = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done 2>/dev/null | grep -cx 'sleep 1001 '"
    assert backend.sandbox.execute(sleeping).output.strip() == "1"
    assert runner.kill(state.id).state.status == "killed"
    assert backend.sandbox.execute(sleeping).output.strip() == "0"


def test_timeout_is_enforced_inside_the_sandbox(backend: Backend) -> None:
    runner = JobRunner(backend.sandbox)
    started = time.monotonic()
    state = runner.start("echo before; sleep 1000 & setsid sleep 1000 & wait", timeout=1)
    job = _until_finished(runner, state.id)
    assert time.monotonic() - started < 15
    assert (job.state.status, job.output) == ("timeout", b"before\n")
    assert job.response().error == p.TIMEOUT
    _until_unmarked(backend.sandbox, state.id)


def _until_unmarked(sandbox: BaseSandbox, job_id: str, timeout: float = 10) -> None:
    """Until no process carries the job's command marker. The watchdog records ``timeout``
    first (builtins only, so the end is recorded in a sandbox without room to fork), then kills
    the command's group, then what escaped it by marker (`_job_scripts.kill_job`): a poll may
    see the status a few milliseconds before the last of the tree is dead."""
    deadline = time.monotonic() + timeout
    while (count := _marked(sandbox, job_id)) != 0:
        assert time.monotonic() < deadline, f"{count} processes of job {job_id} outlived its timeout"
        time.sleep(0.05)


def test_a_finished_job_is_not_killed_again(backend: Backend) -> None:
    runner = JobRunner(backend.sandbox)
    state = runner.start("exit 9")
    _until_finished(runner, state.id)
    assert (runner.kill(state.id).state.status, runner.poll(state.id).state.exit_code) == ("exited", 9)


# ---------------------------------------------------------------------- list, limits, collection


def test_at_most_max_running(backend: Backend) -> None:
    root = f"/tmp/jobs-max-{uuid.uuid4().hex[:8]}"
    runner = JobRunner(backend.sandbox, root=root, max_running=2)
    first, second = (runner.start("sleep 1000", timeout=120) for _ in range(2))
    with pytest.raises(TooManyJobs):
        runner.start("echo never")
    runner.kill(first.id)
    third = runner.start("echo now")
    assert _until_finished(runner, third.id).output == b"now\n"
    runner.kill(second.id)


def test_list_and_collection_of_the_oldest_finished(backend: Backend) -> None:
    root = f"/tmp/jobs-gc-{uuid.uuid4().hex[:8]}"
    runner = JobRunner(backend.sandbox, root=root, keep=2)
    running = runner.start("sleep 1000", timeout=120)
    finished = []
    for index in range(4):
        state = runner.start(f"exit {index}")
        _until_finished(runner, state.id)
        finished.append(state.id)
    listed = {state.id: state for state in runner.list()}
    # collected at each start: the finished ones past the newest two (the last start kept 3)
    assert set(listed) == {running.id, *finished[-3:]}
    assert listed[running.id].status == "running"
    assert [listed[job_id].exit_code for job_id in finished[-3:]] == [1, 2, 3]
    with pytest.raises(JobNotFound):
        runner.poll(finished[0])
    runner.kill(running.id)


def test_the_jobs_directory_is_private(backend: Backend) -> None:
    runner = JobRunner(backend.sandbox)
    state = runner.start("true")
    _until_finished(runner, state.id)
    modes = backend.sandbox.execute(
        f'r="${{TMPDIR:-/tmp}}/.sandboxes-jobs"; stat -c %a "$r" "$r/{state.id}"'
    ).output.split()
    assert modes == ["700", "700"]


# ---------------------------------------------------------------------- outliving the handle


def test_a_job_outlives_other_commands_and_the_handle_that_started_it(backend: Backend) -> None:
    """Every command's end sweeps orphans (the exec helper's, or ``kill_orphans`` in a container
    without it); a job is an orphan once its start returns, and must be spared. Then the handle
    is closed (its exec helper dies, as when the service restarts) and a new handle finds the
    job still running, polls it and kills it."""
    if backend.reattach is None:
        return _local_jobs_die_with_their_jail(Path(backend.workdir))
    runner = JobRunner(backend.sandbox)
    state = runner.start("i=0; while :; do i=$((i + 1)); echo beat $i; sleep 0.1; done", timeout=300)
    _until_output(runner, state.id, b"beat 2\n")
    for _ in range(5):
        assert backend.sandbox.execute("true").exit_code == 0
    assert runner.poll(state.id).state.status == "running"
    again = JobRunner(backend.reattach())
    backend.sandbox = again.sandbox  # the old handle is closed: later tests use the new one
    for _ in range(3):
        assert again.sandbox.execute("true").exit_code == 0
    before = again.poll(state.id)
    assert before.state.status == "running"
    later = _until_output(again, state.id, f"beat {before.output.count(b'beat') + 3}\n".encode())
    assert later.state.status == "running"
    assert again.kill(state.id).state.status == "killed"
    assert _job_processes(again.sandbox, state.id) == 0
    assert [s.status for s in again.list() if s.id == state.id] == ["killed"]


def _local_jobs_die_with_their_jail(root: Path) -> None:
    """The documented limit of a local sandbox: its jail (a pid namespace with a private /tmp)
    dies with the handle, and its jobs with it; a new handle on the same root finds none."""
    with LocalSandbox(config=LocalSandboxConfig(root_dir=root / "own", isolation="bwrap")) as sandbox:
        runner = JobRunner(sandbox)
        state = runner.start("echo up; sleep 1000", timeout=120)
        _until_output(runner, state.id, b"up\n")
        for _ in range(3):
            assert sandbox.execute("true").exit_code == 0
        assert runner.poll(state.id).state.status == "running"  # other commands spare it
    config = LocalSandboxConfig(root_dir=root / "own", isolation="bwrap")
    with LocalSandbox(config=config) as sandbox, pytest.raises(JobNotFound):
        JobRunner(sandbox).poll(state.id)


def test_a_job_whose_supervisor_vanished_is_lost(backend: Backend) -> None:
    runner = JobRunner(backend.sandbox)
    state = runner.start("echo up; sleep 1000", timeout=120)
    _until_output(runner, state.id, b"up\n")
    supervisor = f"{JOB_MARKER_PREFIX}{state.id}-s"
    pids = backend.sandbox.execute(f"grep -lsxzF -e '{MARKER_ENV}={supervisor}' /proc/[0-9]*/environ").output
    pid = pids.split("/")[2]
    assert backend.sandbox.execute(f"kill -9 {pid}").exit_code == 0
    job = _until_finished(runner, state.id)
    assert job.state.status == "lost"
    assert job.response().error == p.CONNECTION_LOST
    assert _marked(backend.sandbox, state.id) == 0


def test_runner_needs_no_state_of_its_own(backend: Backend) -> None:
    """Two runners over one handle (as two replicas over one sandbox) see the same jobs."""
    first, second = JobRunner(backend.sandbox), JobRunner(backend.sandbox)
    state = first.start("echo shared")
    assert _until_finished(second, state.id).output == b"shared\n"
    assert state.id in {s.id for s in second.list()}
    assert os.environ.get(MARKER_ENV) is None  # the test process itself carries no marker


# ---------------------------------------------------------------------- a hostile sandbox


def _forge(sandbox: BaseSandbox, job_id: str, name: str, content: str) -> None:
    """Write ``content`` over the job's file ``name`` from inside the sandbox, as any of its
    processes may (the job's directory belongs to the sandbox's user)."""
    script = 'printf "%s" "$C" > "${TMPDIR:-/tmp}/.sandboxes-jobs/$J/$N"'
    assert sandbox.execute(script, env={"C": content, "J": job_id, "N": name}).exit_code == 0


@pytest.mark.parametrize("backend", ["local"], indirect=True)
def test_numbers_forged_in_a_jobs_files_are_refused_not_raised(backend: Backend) -> None:
    """What a poll or a listing parses comes from files the sandbox may rewrite: numbers that
    Python's ``int`` refuses (digits that are not ASCII, over 4300 of them), or that overflow a
    float (a duration), are no number (``None``); limits that are not numbers are a
    `JobError`. Never a ``ValueError`` or an ``OverflowError`` out of the runner."""
    runner = JobRunner(backend.sandbox)
    state = runner.start("echo up; sleep 1000", timeout=120)
    try:
        _until_output(runner, state.id, b"up\n")
        planted = 'd="${TMPDIR:-/tmp}/.sandboxes-jobs/not-a-job" && mkdir -p "$d" && : > "$d/limits"'
        assert backend.sandbox.execute(planted).exit_code == 0
        assert state.id in {s.id for s in runner.list()}
        assert "not-a-job" not in {s.id for s in runner.list()}
        for started in ("\u00b2", "9" * 5000, "1" + "0" * 400):
            _forge(backend.sandbox, state.id, "started", f"{started}\n")
            job = runner.poll(state.id)
            assert (job.state.status, job.state.started_ns, job.output) == ("running", None, b"up\n")
            assert [s.started_ns for s in runner.list() if s.id == state.id] == [None]
        _forge(backend.sandbox, state.id, "started", "1\n")
        _forge(backend.sandbox, state.id, "status", f"exited \u00b2 {'9' * 400}\n")
        job = runner.poll(state.id)
        assert (job.state.status, job.state.exit_code, job.state.ended_ns) == ("exited", None, None)
        assert job.response().duration_ms is None
        _forge(backend.sandbox, state.id, "limits", "\u00b2 x\n")
        with pytest.raises(JobError) as refused:
            runner.poll(state.id)
        assert refused.value.code == p.BACKEND_ERROR
        assert "unexpected answer" in refused.value.message
    finally:
        _forge(backend.sandbox, state.id, "limits", "1 1\n")
        assert runner.kill(state.id).state.finished
        assert _job_processes(backend.sandbox, state.id) == 0


@pytest.mark.parametrize("backend", ["local"], indirect=True)
def test_a_timeout_under_a_millisecond_is_still_a_timeout(backend: Backend) -> None:
    """A timeout rounds up to the millisecond the watchdog can sleep: rounded down to ``0`` it
    meant none at all (and a service's request of 0.0004 s escaped its ceiling on timeouts)."""
    runner = JobRunner(backend.sandbox)
    state = runner.start("sleep 1000", timeout=0.0004)
    job = _until_finished(runner, state.id, timeout=15)
    assert job.state.status == "timeout"


@pytest.mark.parametrize("backend", ["busybox"], indirect=True)
def test_a_timeout_of_centuries_lets_the_job_run(backend: Backend) -> None:
    """busybox ``sleep`` refuses a number of 20 digits: the watchdog's sleep of such a timeout
    failed at once, and it timed the job out. Its sleep must run, and the job with it."""
    runner = JobRunner(backend.sandbox)
    state = runner.start("echo up; exec sleep 1000", timeout=1e20)
    watchdog = f"{MARKER_ENV}={JOB_MARKER_PREFIX}{state.id}-w"
    sleeping = (
        f"grep -lsxzF -e '{watchdog}' /proc/[0-9]*/environ | "
        "while IFS=/ read -r _ _ p _; do tr '\\0' ' ' < /proc/$p/cmdline; echo; done 2>/dev/null"
    )
    deadline = time.monotonic() + 30
    while "sleep " not in backend.sandbox.execute(sleeping).output:
        assert not runner.poll(state.id).state.finished, runner.poll(state.id)
        assert time.monotonic() < deadline, "the watchdog never slept"
        time.sleep(0.05)
    assert runner.poll(state.id).state.status == "running"
    assert runner.kill(state.id).state.status == "killed"


@pytest.mark.parametrize("backend", ["local", "busybox"], indirect=True)
def test_fifos_planted_in_a_jobs_directory_do_not_block_poll_list_or_kill(backend: Backend) -> None:
    """A process of the sandbox may replace a job's files by FIFOs: a script that opened one
    to read or write it waited for the other end until its operation timed out, holding one of
    the service's worker threads that long per request. Each answers at once instead (the
    forged job reads as running, or its files as empty), and the job is still killed."""
    runner = JobRunner(backend.sandbox, operation_timeout=20)
    state = runner.start("echo up; exec sleep 1000", timeout=120)
    _until_output(runner, state.id, b"up\n")
    names = ("status", "started", "limits", "o.h", "pid", "cpid", "end", "status.new")
    plant = (
        'cd "${TMPDIR:-/tmp}/.sandboxes-jobs/$J" && for f in $N; do mv -f "$f" "$f.x" 2>/dev/null; mkfifo "$f"; done'
    )
    assert backend.sandbox.execute(plant, env={"J": state.id, "N": " ".join(names)}).exit_code == 0
    with pytest.raises(JobError) as forged:  # the limits are a FIFO: read as none, which is no answer
        runner.poll(state.id)
    assert forged.value.code == p.BACKEND_ERROR
    assert [s.status for s in runner.list() if s.id == state.id] == ["running"]
    with pytest.raises(JobError):  # its end cannot be claimed, nor its output read: still no hang
        runner.kill(state.id)
    deadline = time.monotonic() + 15  # its supervisor, which cannot record an end either, ends
    while _job_processes(backend.sandbox, state.id):
        assert time.monotonic() < deadline, "the job's processes outlived its kill"
        time.sleep(0.05)
