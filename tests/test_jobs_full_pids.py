"""`sandboxes.jobs` whose command takes every pid of its sandbox at once, and keeps taking back
each one that frees up: a start answers ``running`` for a job that started (never
``unavailable``, which says it did not), and a start that answered ``unavailable`` never runs
its command. Each test has a sandbox of its own with a small pids limit (and a small CPU share:
the shell's loop spins while it waits for a pid), so that what it fills is its own."""

from __future__ import annotations

import shlex
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import HAS_BWRAP, RETAKE_PIDS, SESSION_OWNER, needs

from sandboxes import _scripts
from sandboxes import protocol as p
from sandboxes.base import BaseSandbox
from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.jobs import CannotFork, JobError, JobRunner
from sandboxes.local import LocalSandbox, LocalSandboxConfig

_PIDS = 32

RETAKE_SH = "while :; do command eval 'sleep 300 &' 2>/dev/null; done"
"""The shell's `RETAKE_PIDS` (an image without python3): fork again at once whenever a fork
fails (``command eval``: a shell that cannot fork does not exit there)."""


@pytest.fixture(params=["docker", "docker-no-helper", "local"])
def full(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[BaseSandbox, str]]:
    """A sandbox of its own, and the command that takes its every pid at once."""
    kind = request.param
    python = f"exec python3 -c {shlex.quote(RETAKE_PIDS)}"
    if kind == "local":
        needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
        config = LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap", pids=_PIDS, cpus=0.5)
        with LocalSandbox(config=config) as jail:
            yield jail, python
        return
    docker_client: Any = request.getfixturevalue("docker_client")
    helper = kind == "docker"
    image = request.getfixturevalue("runtime_image" if helper else "no_python_image")
    settings = DockerSandboxConfig(image=image, owner=SESSION_OWNER, pids=_PIDS, cpus=0.5)
    with DockerSandbox.create(settings, client=docker_client) as sandbox:
        assert sandbox.execute("true").exit_code == 0
        assert (sandbox.helper_driver.mux is not None) == helper
        yield sandbox, python if helper else RETAKE_SH


def _until_full(runner: JobRunner, job_id: str) -> None:
    """Until the job's poll cannot start a process: it filled the sandbox."""
    deadline = time.monotonic() + 30
    while True:
        try:
            runner.poll(job_id)
        except CannotFork:
            return
        assert time.monotonic() < deadline, "the job did not fill the sandbox's pids"
        time.sleep(0.05)


def _kill_once_room(runner: JobRunner, job_id: str) -> None:
    """Kill the job that filled the sandbox; it ends ``killed`` with its first output, and is
    not running once there is room to look."""
    _until_full(runner, job_id)
    job = runner.kill(job_id)
    assert (job.state.status, job.output) == ("killed", b"filling\n"), job
    deadline = time.monotonic() + 20
    while True:
        try:
            left = [state.id for state in runner.list() if state.id == job_id and not state.finished]
        except CannotFork:  # the killed still hold their pids until they are reaped
            assert time.monotonic() < deadline, "no pid freed up after the kill"
            time.sleep(0.05)  # the kernel's pid count has no event to wait on
            continue
        assert left == []
        return


def test_a_job_that_takes_every_pid_at_once_is_answered_started(full: tuple[BaseSandbox, str]) -> None:
    """The start's own script must not fork once the command may run: a fork of it that fails
    then (the command took every pid) answered ``unavailable`` for a job that ran, and a client
    told so starts it again. (That fork came right after a look at ``pid``: a window of one
    fork, which this test rarely meets on the code before the fix; it guards the answer.)"""
    sandbox, filler = full
    runner = JobRunner(sandbox)
    for _ in range(3):
        try:
            state = runner.start(f"echo filling; {filler}", timeout=120, env={"RETAKE": RETAKE_PIDS})
        except JobError as refused:
            running = _running_after_room(runner)
            pytest.fail(f"the start answered {refused.code} ({refused.message}); running: {running}")
        assert state.status == "running"
        _kill_once_room(runner, state.id)


def _running_after_room(runner: JobRunner) -> list[str]:
    """The jobs still running, each killed: what a start that failed left behind."""
    deadline = time.monotonic() + 20
    while True:
        try:
            running = [state.id for state in runner.list() if not state.finished]
            break
        except CannotFork:
            assert time.monotonic() < deadline, "the sandbox stayed full"
            time.sleep(0.05)
    for job_id in running:
        runner.kill(job_id)
    return running


def test_a_start_answered_unavailable_never_runs(full: tuple[BaseSandbox, str]) -> None:
    """Into a sandbox that a job keeps full, a start fails before its command may run (its
    script cannot fork, or not even start): ``unavailable``, and its command never runs, not
    even once the filler is killed and pids are free again."""
    sandbox, filler = full
    runner = JobRunner(sandbox)
    filling = runner.start(f"echo filling; {filler}", timeout=120, env={"RETAKE": RETAKE_PIDS})
    mark = f"/tmp/ran-{uuid.uuid4().hex}"
    deadline = time.monotonic() + 30
    refused = 0
    while refused < 3:
        try:
            late = runner.start(f"sleep 1000; : > {mark}")
        except CannotFork:  # ``unavailable``
            refused += 1
            continue
        assert late.status == "running"  # a pid was free for it: it may run, and was answered so
        assert time.monotonic() < deadline, "the filler never filled the sandbox"
    _kill_once_room(runner, filling.id)
    for state in runner.list():
        if not state.finished and state.status == "running":
            assert runner.kill(state.id).state.status in ("killed", "failed")
    deadline = time.monotonic() + 70
    while any(not state.finished for state in runner.list()):
        assert time.monotonic() < deadline, "a refused start's supervisor waits on"
        time.sleep(0.1)  # a refused start's supervisor gives up once its start is gone
    assert sandbox.execute(f"test -e {mark} && echo ran || echo never").output == "never\n"


HOLD_SUPERVISOR = r"""r=$1
mkdir -m 700 "$r"
while :; do
  for d in "$r"/*/; do
    [ -d "$d" ] || continue
    d=${d%/}
    mkfifo "$d/cpid" 2>/dev/null || { echo late; exit 0; }
    break 2
  done
done
m=SANDBOXES_EXEC_ID=sandboxes-job-${d##*/}-s
i=0 s=
while [ -z "$s" ] && [ "$i" -lt 500 ]; do
  for e in $(grep -lsxzF -e "$m" /proc/[0-9]*/environ); do
    { read -r l < "${e%/environ}/stat"; } 2>/dev/null || continue
    set -- ${l##*) }
    grep -qsxzF -e "$m" "/proc/$2/environ" || { s=${e%/environ} p=$2; }
  done
  [ -n "$s" ] || sleep 0.01
  i=$((i + 1))
done
[ -n "$s" ] || { echo "no supervisor"; exit 0; }
echo held
while { read -r l < "$s/stat"; } 2>/dev/null && set -- ${l##*) } && [ "$2" = "$p" ]; do sleep 0.05; done
echo released
[ ! -e "$s" ] || read -r _ < "$d/cpid"
"""
"""``ROOT``: make ROOT, then hold the supervisor of the first job that appears in it before it writes its
``pid`` (its ``cpid`` made a FIFO, whose open blocks it: ``late`` when the supervisor wrote it
first), then, once the process that started it is gone (it is adopted), let it go on (unless it is
gone too: without the exec helper, the sweep after its start's kill may end it)."""


def _until_made(sandbox: BaseSandbox, directory: str) -> None:
    deadline = time.monotonic() + 20
    while sandbox.execute(f"test -d {directory}").exit_code != 0:
        assert time.monotonic() < deadline, f"{directory} was never made"
        time.sleep(0.02)


def _hold(sandbox: BaseSandbox, root: str, held: list[str]) -> None:
    held.append(sandbox.execute(_scripts.command(HOLD_SUPERVISOR, root), timeout=20).output)


@pytest.mark.parametrize("full", ["docker", "docker-no-helper"], indirect=True)
def test_a_start_that_ended_unanswered_never_runs_its_command(full: tuple[BaseSandbox, str]) -> None:
    """A start cut off by its operation's timeout, its supervisor not ready yet: the answer says
    the job may have started (``connection_lost``; it was ``timeout``, which the service answered
    as ``backend_unavailable``), and the supervisor, ready once the start is gone, never runs the
    command (the job ends ``failed``): it ran it, so a client that had been told the start
    failed and started it again ran it twice."""
    sandbox, _ = full
    for _ in range(5):
        root = f"/tmp/jobs-{uuid.uuid4().hex[:8]}"
        mark = f"/tmp/ran-{uuid.uuid4().hex}"
        held: list[str] = []
        watcher = threading.Thread(target=_hold, args=(sandbox, root, held))
        watcher.start()
        failed: JobError | None = None
        try:
            _until_made(sandbox, root)
            state = JobRunner(sandbox, root=root, operation_timeout=2).start(f": > {mark}")
        except JobError as refused:
            failed = refused
        finally:
            watcher.join(70)
        if held and "late" in held[0]:  # the supervisor wrote its cpid before the FIFO was there: again
            if failed is None:
                JobRunner(sandbox, root=root).kill(state.id)
            continue
        assert held[0].split() == ["held", "released"], held
        assert failed is not None, "the start answered running while its supervisor was held"
        assert failed.code == p.CONNECTION_LOST, failed
        runner = JobRunner(sandbox, root=root)
        (state,) = runner.list()
        deadline = time.monotonic() + 30
        while not (state := runner.poll(state.id).state).finished:
            assert time.monotonic() < deadline, "the job stays running"
            time.sleep(0.05)
        # without the exec helper, the sweep after the start's kill may end the adopted supervisor
        # first (it had not written its pid yet: no live job's): ``lost``, which says "may have run"
        assert (state.status, state.reason) in [("failed", "start"), ("lost", None)]
        assert sandbox.execute(f"test -e {mark} && echo ran || echo never").output == "never\n"
        return
    pytest.fail("the supervisor wrote its cpid first every time")
