"""Docker commands in a container whose pids limit a command of its own keeps full: a loop that
takes back every pid as soon as one frees. Each test has a container of its own with a small
``pids`` limit (and a small CPU share: the no-python loop spins while it waits for a pid)."""

from __future__ import annotations

import shlex
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from support import RETAKE_PIDS, SESSION_OWNER

from sandboxes import protocol as p
from sandboxes._helper._kill import MARKER_ENV
from sandboxes.docker import DockerSandbox, DockerSandboxConfig

_PIDS = 24

RETAKE_SH = "while :; do command eval 'sleep 300 &' 2>/dev/null; done"
"""The shell's way of `RETAKE_PIDS` (an image without python3): fork again at once whenever a
fork fails (``command eval``: a shell that cannot fork does not exit), so every pid that frees
up is taken back."""


@pytest.fixture(params=["no-helper", "helper"])
def full_sandbox(request: pytest.FixtureRequest, docker_client: Any) -> Iterator[tuple[DockerSandbox, str]]:
    """A container of its own, and the command that keeps its pids full there."""
    helper = request.param == "helper"
    image = request.getfixturevalue("runtime_image" if helper else "no_python_image")
    config = DockerSandboxConfig(image=image, owner=SESSION_OWNER, pids=_PIDS, cpus=0.5)
    with DockerSandbox.create(config, client=docker_client) as sandbox:
        assert sandbox.execute("true").exit_code == 0
        assert (sandbox.helper_driver.mux is not None) == helper
        filler = f"exec python3 -c {shlex.quote(RETAKE_PIDS)}" if helper else RETAKE_SH
        yield sandbox, filler


def _marked(sandbox: DockerSandbox, token: str) -> int | None:
    """How many processes carry ``token`` as their marker; ``None`` while the count cannot run."""
    count = f"grep -lsxzF -e '{MARKER_ENV}={token}' /proc/[0-9]*/environ | wc -l"
    try:
        output = sandbox.execute(count, timeout=30).output.strip()
    except Exception:  # the engine refusing an exec at the pids limit, as a 500
        return None
    return int(output) if output.isdigit() else None


def test_a_command_that_keeps_every_pid_is_killed_at_its_timeout(full_sandbox: tuple[DockerSandbox, str]) -> None:
    """Its kill at the deadline needs a ``docker exec`` then (none without the exec helper),
    which runc fails to start now and then while no pid is free: the command still answers
    ``timeout`` at its timeout, and none of its processes survives it. A few times over, as
    runc's failure is one start in a few."""
    sandbox, filler = full_sandbox
    for _ in range(4):
        token = uuid.uuid4().hex
        started = time.monotonic()
        done = sandbox.execute(f"echo filling; {filler}", timeout=2, env={MARKER_ENV: token})
        assert done.error == p.TIMEOUT, done
        assert done.output.startswith("filling\n")
        assert time.monotonic() - started < 30
        deadline = time.monotonic() + 20
        while (left := _marked(sandbox, token)) is None:
            assert time.monotonic() < deadline, "no pid freed up after the timeout's kill"
            time.sleep(0.05)  # the kernel's pid count has no event to wait on
        assert left == 0, f"{left} processes of the command outlived its timeout"
    assert sandbox.execute("echo alive").output == "alive\n"
