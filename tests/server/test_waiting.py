"""The service's awaited path (`sandboxes.server.waiting`) on a real Docker sandbox: a command
written to the helper whose answer was lost answers ``connection_lost`` and is not handed to the
thread path (which would run it again); one whose request could not be written whole is
(`sandboxes._mux.MuxBroken.may_resend`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from mux_faults import FaultyStream, faulty
from support import SESSION_OWNER

from sandboxes import protocol as p
from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.docker import sandbox as docker_sandbox
from sandboxes.server.processes import Command
from sandboxes.server.waiting import awaitable_helper, run_awaited


@pytest.fixture
def patched(
    docker_client: Any, runtime_image: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[DockerSandbox, list[FaultyStream]]]:
    streams = faulty(monkeypatch, docker_sandbox)
    with DockerSandbox.create(
        DockerSandboxConfig(image=runtime_image, owner=SESSION_OWNER), client=docker_client
    ) as sb:
        assert sb.execute("true").exit_code == 0
        assert streams, "the sandbox did not start its exec helper through the patched client"
        yield sb, streams


async def _awaited(sandbox: DockerSandbox, command: str) -> tuple[p.ExecuteResponse, int]:
    """``command`` on the awaited path; its answer and how many times it fell back to threads."""
    mux = awaitable_helper(sandbox)
    assert mux is not None
    fallbacks = 0

    async def in_a_thread() -> p.ExecuteResponse:
        nonlocal fallbacks
        fallbacks += 1
        return await asyncio.to_thread(sandbox.execute, command)

    spec = Command(command=command, timeout=30, stdin=None, env={}, cwd=None, output_limit=1 << 20)
    return await run_awaited(sandbox, mux, spec, None, in_a_thread), fallbacks


async def test_a_command_whose_answer_was_lost_is_never_run_twice(
    patched: tuple[DockerSandbox, list[FaultyStream]],
) -> None:
    sandbox, streams = patched
    streams[-1].lose_answers()
    result, fallbacks = await _awaited(sandbox, "echo ran >> /workspace/ran")
    assert (result.error, fallbacks) == (p.CONNECTION_LOST, 0), result
    assert (await asyncio.to_thread(sandbox.execute, "cat /workspace/ran")).output == "ran\n"


async def test_a_command_not_written_whole_goes_to_the_thread_path(
    patched: tuple[DockerSandbox, list[FaultyStream]],
) -> None:
    sandbox, streams = patched
    streams[-1].fail_next_request()
    result, fallbacks = await _awaited(sandbox, "echo ran >> /workspace/ran; echo done")
    assert (result.error, result.output, fallbacks) == (None, "done\n", 1), result
    assert streams[-2].sends_after_failure == 0
    assert (await asyncio.to_thread(sandbox.execute, "cat /workspace/ran")).output == "ran\n"
