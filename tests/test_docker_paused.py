"""A paused container (``docker pause``: an operator's, or the engine's own freeze) answers every
operation in the protocol's vocabulary: ``unavailable`` where the engine refused before anything
ran, ``connection_lost`` where a command may have run. These were docker-py's ``APIError``
(409) raised out of `execute`, `upload_files` and the rest. Once unpaused, everything works.

Real containers, paused and unpaused through the real engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support import SESSION_OWNER

from sandboxes import protocol as p
from sandboxes.docker import DockerSandbox, DockerSandboxConfig

BIG = 2 << 20
"""Above `sandboxes.docker.BULK_THRESHOLD`: an upload of the workspace's own path (own exec)."""


@pytest.fixture
def paused_later(docker_client: Any) -> Iterator[list[DockerSandbox]]:
    """Sandboxes a test pauses; each is unpaused (if still paused) and destroyed after it."""
    made: list[DockerSandbox] = []
    yield made
    for sandbox in made:
        sandbox.container.reload()
        if sandbox.container.status == "paused":
            sandbox.container.unpause()
        sandbox.destroy()


def _create(client: Any, image: str, made: list[DockerSandbox]) -> DockerSandbox:
    sandbox = DockerSandbox.create(DockerSandboxConfig(image=image, owner=SESSION_OWNER), client=client)
    made.append(sandbox)
    return sandbox


def _assert_every_operation_answers_unavailable(sandbox: DockerSandbox) -> None:
    ran = sandbox.execute("echo ran")
    assert ran.error == p.UNAVAILABLE, ran
    assert "paused" in (ran.message or ""), ran
    assert sandbox.write("/workspace/w.txt", "x").error == p.UNAVAILABLE
    assert sandbox.read("/workspace/kept.txt").error == p.UNAVAILABLE
    assert sandbox.ls("/workspace").error == p.UNAVAILABLE
    assert [r.error for r in sandbox.upload_files([("/workspace/big.bin", b"b" * BIG)])] == [p.UNAVAILABLE]
    assert [r.error for r in sandbox.download_files(["/workspace/kept.txt"])] == [p.UNAVAILABLE]


def _assert_everything_works_again(sandbox: DockerSandbox) -> None:
    sandbox.container.unpause()
    assert sandbox.execute("echo back").output == "back\n"
    assert sandbox.read("/workspace/kept.txt").file_data == p.FileData("kept\n")
    assert [r.error for r in sandbox.upload_files([("/workspace/big.bin", b"b" * BIG)])] == [None]
    assert sandbox.download_files(["/workspace/big.bin"])[0].content == b"b" * BIG


def test_a_paused_container_without_python_answers_unavailable(
    docker_client: Any, no_python_image: str, paused_later: list[DockerSandbox]
) -> None:
    """Every command and file op is a ``docker exec`` of its own, whose creation the engine refuses."""
    sandbox = _create(docker_client, no_python_image, paused_later)
    assert sandbox.write("/workspace/kept.txt", "kept\n").error is None
    sandbox.container.pause()
    _assert_every_operation_answers_unavailable(sandbox)
    _assert_everything_works_again(sandbox)


def test_a_paused_container_answers_unavailable_where_the_helper_must_start(
    docker_client: Any, runtime_image: str, paused_later: list[DockerSandbox]
) -> None:
    """No helper runs (dropped, as after a failure): its start is what the engine refuses."""
    sandbox = _create(docker_client, runtime_image, paused_later)
    assert sandbox.write("/workspace/kept.txt", "kept\n").error is None
    assert sandbox.helper_driver.mux is not None
    sandbox.helper_driver.close()  # dropped, as after a failure
    sandbox.container.pause()
    _assert_every_operation_answers_unavailable(sandbox)
    _assert_everything_works_again(sandbox)
    assert sandbox.helper_alive


def test_a_command_whose_container_is_paused_under_it_answers_connection_lost(
    docker_client: Any, no_python_image: str, paused_later: list[DockerSandbox]
) -> None:
    """At its deadline the kill is refused too (the review's case): the command may have run,
    and may still run once unpaused, so ``connection_lost``, in time."""
    sandbox = _create(docker_client, no_python_image, paused_later)
    answers: list[p.ExecuteResponse] = []
    worker = threading.Thread(target=lambda: answers.append(sandbox.execute("touch started; sleep 30", timeout=2)))
    worker.start()
    deadline = time.monotonic() + 30
    while sandbox.container.exec_run(["test", "-e", "/workspace/started"]).exit_code != 0:
        assert time.monotonic() < deadline, "the command never started"
    sandbox.container.pause()
    worker.join(60)
    assert not worker.is_alive()
    assert answers[0].error == p.CONNECTION_LOST, answers[0]
    sandbox.container.unpause()
    assert sandbox.execute("echo back").output == "back\n"


def test_freeze_tries_again_when_the_runtime_gave_up_freezing(
    docker_client: Any, runtime_image: str, paused_later: list[DockerSandbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    """runc answers "unable to freeze" when a process does not reach the frozen state in its time
    (a loaded host); `freeze` tries again instead of failing the pause. The first try's failure is
    injected in front of the real engine's pause, which the second try reaches."""
    import docker.errors

    sandbox = _create(docker_client, runtime_image, paused_later)
    real_pause = sandbox.container.pause
    tries: list[int] = []

    def pause_that_gives_up_once() -> None:
        tries.append(1)
        if len(tries) == 1:
            raise docker.errors.APIError(
                "500 Server Error",
                explanation="Cannot pause container: OCI runtime pause failed: unable to freeze: unknown",
            )
        real_pause()

    monkeypatch.setattr(sandbox.container, "pause", pause_that_gives_up_once)
    sandbox.freeze()
    sandbox.container.reload()
    assert (len(tries), sandbox.container.status) == (2, "paused")
