"""A recorded command (`sandboxes._helper._record`) whose end comes when the sandbox's ``/tmp``,
where its record lives, is full, is still read as ended with its exit code, not as running for
as long as its helper lives: on Docker with a small ``/tmp`` and in a local jail, filled from
inside the sandbox."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from recording import until_recorded_end
from support import HAS_BWRAP, SESSION_OWNER, needs

from sandboxes._helper._kill import RECORD_ENV
from sandboxes.base import BaseSandbox
from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.jobs import JobRunner
from sandboxes.local import LocalSandbox, LocalSandboxConfig, _disk

DISK = 64 << 20
"""A local sandbox's disk image (its root and its /tmp): the smallest the disk tests use."""
FILL_TMP = (
    "cat /dev/zero > /tmp/fill 2>/dev/null; i=0; "
    "while [ $i -lt 10000 ] && { printf x > /tmp/fill.$i; } 2>/dev/null; do i=$((i + 1)); done; "
    "{ printf x > /tmp/probe; } 2>/dev/null || echo full"
)
"""Fills /tmp, then what a filesystem keeps back from one big file (ext4's reservations) with
small ones, until not even a byte can be written."""


@pytest.fixture(scope="module", params=["docker", "local"])
def sandbox(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BaseSandbox]:
    if request.param == "docker":
        docker_client: Any = request.getfixturevalue("docker_client")
        config = DockerSandboxConfig(image=request.getfixturevalue("runtime_image"), owner=SESSION_OWNER, tmp_size="4m")
        with DockerSandbox.create(config, client=docker_client) as docker:
            yield docker
        return
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
    needs(_disk.available() is None, f"sandbox disk images unavailable: {_disk.available()} (CI runs as root)")
    root: Path = tmp_path_factory.mktemp("record-full-local") / "root"
    local = LocalSandbox.create(LocalSandboxConfig(root_dir=root, isolation="bwrap", disk=DISK))
    try:
        yield local
    finally:
        local.destroy()


def test_a_recorded_command_ending_on_a_full_tmp_is_read_as_ended(sandbox: BaseSandbox) -> None:
    workdir = sandbox.execute("pwd").output.strip()
    go = f"{workdir}/go-full"
    record_id = secrets.token_hex(16)
    started = threading.Event()
    answers: list[Any] = []

    def seen(chunk: bytes | str, *_: object) -> None:
        if "one" in (chunk if isinstance(chunk, str) else chunk.decode()):
            started.set()

    def run() -> None:
        command = f"echo one; until [ -e {go} ]; do sleep 0.05; done; exit 7"
        answers.append(sandbox.execute_streaming(command, seen, timeout=60, env={RECORD_ENV: f"{record_id}:4096"}))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert started.wait(20), "the recorded command never printed"
        assert not JobRunner(sandbox).read_record(record_id).state.finished
        assert sandbox.execute(FILL_TMP).output == "full\n"
        assert sandbox.execute(f"touch {go}").exit_code == 0
        thread.join(20)
        assert answers, "the recorded command never answered"
        assert answers[0].exit_code == 7, answers
        job = until_recorded_end(sandbox, record_id, timeout=10)
        assert (job.state.status, job.state.exit_code) == ("exited", 7), job.state
    finally:
        sandbox.execute(f"rm -f /tmp/fill /tmp/fill.* /tmp/probe {go}")
