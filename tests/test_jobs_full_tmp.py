"""A job whose end cannot be written (the sandbox's ``/tmp``, where jobs keep their files, is
full) is still seen to end, and a kill of it answers what happened: on Docker with a small
``/tmp``, filled by a command of the sandbox as twenty background writers would."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from support import SESSION_OWNER

from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.jobs import Job, JobRunner

WAIT_FOR_GO = "while [ ! -e /workspace/go ]; do sleep 0.05; done; echo done"
FILL_TMP = "cat /dev/zero > /tmp/fill 2>/dev/null; { printf x > /tmp/probe; } 2>/dev/null || echo full"


@pytest.fixture(scope="module")
def sandbox(docker_client: Any, runtime_image: str) -> Iterator[DockerSandbox]:
    config = DockerSandboxConfig(image=runtime_image, owner=SESSION_OWNER, tmp_size="4m")
    with DockerSandbox.create(config, client=docker_client) as sb:
        yield sb


def _until_finished(runner: JobRunner, job_id: str, timeout: float = 15) -> Job:
    deadline = time.monotonic() + timeout
    while not (job := runner.poll(job_id)).state.finished:
        assert time.monotonic() < deadline, f"job {job_id} still running with no process left: {job.state}"
        time.sleep(0.05)
    return job


def test_a_job_that_cannot_record_its_end_is_seen_ended_and_a_kill_kills(sandbox: DockerSandbox) -> None:
    runner = JobRunner(sandbox)
    ending = runner.start(WAIT_FOR_GO, timeout=60)
    running = runner.start("exec sleep 300", timeout=60)
    try:
        assert sandbox.execute(FILL_TMP).output == "full\n"
        assert sandbox.execute("touch /workspace/go").exit_code == 0
        ended = _until_finished(runner, ending.id)
        assert ended.state.status == "exited"
        assert ended.state.exit_code == 0
        killed = runner.kill(running.id)
        assert killed.state.status == "killed", killed.state
        assert not any(state.status == "running" for state in runner.list())
    finally:
        sandbox.execute("rm -f /tmp/fill /workspace/go")
        runner.kill(running.id)
