"""What every backend whose exec helper can outlive its client shows of a recorded command
(`sandboxes._helper._record`): it runs on when the handle that started it is closed (its helper's
client gone, as when the service holding it was killed), and a new handle reads its output and
its exit from the sandbox alone (`sandboxes.jobs.JobRunner.read_record`)."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable

from sandboxes._helper._kill import RECORD_ENV
from sandboxes.base import BaseSandbox
from sandboxes.jobs import Job, JobNotFound, JobRunner

__all__ = ["assert_a_recorded_command_outlives_its_handle", "recorded_until_closed", "until_recorded_end"]

GO = "/tmp/go-on-recorded"
COMMAND = f"echo one; until [ -e {GO} ]; do sleep 0.05; done; echo two; exit 7"
"""Prints, waits for the test to let it go on once its handle was closed, prints again."""


def until_recorded_end(sandbox: BaseSandbox, record_id: str, timeout: float = 20) -> Job:
    runner = JobRunner(sandbox)
    deadline = time.monotonic() + timeout
    while not (job := runner.read_record(record_id)).state.finished:
        assert time.monotonic() < deadline, f"record {record_id} still running: {job}"
        time.sleep(0.05)
    return job


def recorded_until_closed(sandbox: BaseSandbox, reattach: Callable[[], BaseSandbox]) -> tuple[BaseSandbox, str]:
    """`COMMAND` started recorded on ``sandbox``, which ``reattach`` closes (its helper's
    connection with it) once it printed, opening a new handle: (that handle, the record's id)."""
    assert sandbox.execute(f"rm -f {GO}").exit_code == 0  # the helper runs
    record_id = secrets.token_hex(16)
    started = threading.Event()

    def seen(chunk: bytes | str, *_: object) -> None:
        if "one" in (chunk if isinstance(chunk, str) else chunk.decode()):
            started.set()

    def run() -> None:
        sandbox.execute_streaming(COMMAND, seen, timeout=60, env={RECORD_ENV: f"{record_id}:4096"})

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(20), "the recorded command never printed"
    again = reattach()
    thread.join(20)
    assert not thread.is_alive(), "the first handle's command did not end with its handle"
    return again, record_id


def assert_a_recorded_command_outlives_its_handle(sandbox: BaseSandbox, reattach: Callable[[], BaseSandbox]) -> None:
    """``reattach`` closes ``sandbox``'s handle (its helper's connection with it) and opens a new one."""
    again, record_id = recorded_until_closed(sandbox, reattach)
    running = JobRunner(again).read_record(record_id)
    assert not running.state.finished, running  # it waits for GO: only a command that ran on can end now
    assert again.execute(f"touch {GO}").exit_code == 0
    job = until_recorded_end(again, record_id)
    assert job.output == b"one\ntwo\n", job
    assert (job.state.status, job.state.exit_code) == ("exited", 7), job.state
    response = job.response()
    assert (response.output, response.exit_code, response.truncated) == ("one\ntwo\n", 7, False)
    try:
        JobRunner(again).read_record("0" * 32)
    except JobNotFound:
        pass
    else:
        raise AssertionError("a record that was never made was found")
