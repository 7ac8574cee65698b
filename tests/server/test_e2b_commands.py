"""Commands as E2B runs them, through the real E2B SDK (sync and async) over the local jail and
Docker: stdin held open (``stdin=True``, then ``send_stdin``, ``stream_input``,
``close_stdin``), and what E2B's users complain of, fixed here: a kill leaves no process of the
command's tree (E2B#1034), a running command never vanishes from the list (#1031), a command is
reattached by pid however long after its start (#1074), and output keeps flowing after a
reattach (#1352)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import toy_backend
from e2b import AsyncSandbox, Sandbox, SandboxException
from e2b_harness import opts, service_fixture
from service_harness import Running, running, settings_for

service = service_fixture("e2bcmd")

DEADLINE = 20.0
"""Seconds a test waits at most for a condition it polls."""


@pytest.fixture(scope="module")
def sandbox(service: Running) -> Iterator[Sandbox]:
    created = Sandbox.create(**opts(service))
    yield created
    created.kill()


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE} s: {what}"
        time.sleep(0.05)


def test_stdin_is_fed_as_the_command_runs_and_closed(sandbox: Sandbox) -> None:
    mark = f"/tmp/stdin-{time.monotonic_ns()}"
    handle = sandbox.commands.run(f'read first; echo "$first" > {mark}; cat; echo end', background=True, stdin=True)
    sandbox.commands.send_stdin(handle.pid, "one\n")
    _until(lambda: sandbox.files.exists(mark), "the first line read by the running command")
    assert sandbox.files.read(mark) == "one\n"
    sandbox.commands.send_stdin(handle.pid, b"\x00two\n")
    sandbox.commands.stream_input(handle.pid, ["thr", b"ee\n"])
    handle.send_stdin("four\n")
    sandbox.commands.close_stdin(handle.pid)
    result = handle.wait()
    assert (result.stdout, result.exit_code) == ("\x00two\nthree\nfour\nend\n", 0)


def test_stdin_is_refused_for_a_command_started_without_it(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 30", background=True)
    try:
        with pytest.raises(SandboxException, match="has no open stdin"):
            sandbox.commands.send_stdin(handle.pid, "x")
        with pytest.raises(SandboxException, match="has no open stdin"):
            sandbox.commands.close_stdin(handle.pid)
    finally:
        assert handle.kill() is True
    assert sandbox.commands.run("cat", stdin=False).stdout == ""  # a closed stdin: cat ends at once


async def test_the_async_sdk_feeds_stdin_as_it_goes(service: Running) -> None:
    created = await AsyncSandbox.create(**opts(service))
    try:
        seen: list[str] = []
        changed = asyncio.Event()

        def heard(text: str) -> None:
            seen.append(text)
            changed.set()

        async def until_seen(text: str) -> None:
            async with asyncio.timeout(DEADLINE):
                while text not in "".join(seen):
                    changed.clear()
                    await changed.wait()

        script = "while read line; do echo got-$line; done; echo closed"
        handle = await created.commands.run(script, background=True, stdin=True, on_stdout=heard)
        await created.commands.send_stdin(handle.pid, "one\n")
        await until_seen("got-one\n")
        async with created.commands.stream_input(handle.pid) as stream:
            await stream.send("two\n")
            await stream.send(b"three\n")
            await until_seen("got-three\n")  # each chunk reaches the command while the stream is open
        await created.commands.close_stdin(handle.pid)
        result = await handle.wait()
        assert result.stdout == "got-one\ngot-two\ngot-three\nclosed\n"
    finally:
        await created.kill()


def test_a_sandbox_without_an_exec_helper_runs_the_command_with_its_stdin_closed(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, templates={"default": {"backend": "toy", "default_timeout": 30}})
    assert isinstance(settings.templates["default"], toy_backend.ToyTemplate)
    with running(settings) as toy:
        created = Sandbox.create(**opts(toy))
        try:
            handle = created.commands.run("cat; echo ran", background=True, stdin=True)
            with pytest.raises(SandboxException, match="without an exec helper"):
                created.commands.send_stdin(handle.pid, "lost\n")
            assert handle.wait().stdout == "ran\n"
        finally:
            created.kill()
