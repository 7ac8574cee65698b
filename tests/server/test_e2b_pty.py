"""E2B terminals through the real SDK, sync and async, against the service on loopback, over the
local jail and Docker: ``sandbox.pty.create`` (a login shell on a pseudo-terminal, through the
exec helper), ``send_stdin``, ``stream_input``, ``resize``, ``connect`` by pid, ``kill``, and the
exit code."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import pytest
from e2b import AsyncSandbox, CommandExitException, PtySize, Sandbox
from e2b.sandbox_sync.commands.command_handle import CommandHandle
from e2b_harness import service_fixture
from service_harness import KEYS, Running
from support import SESSION_OWNER

from sandboxes.server.e2b.pty import MAX_QUEUED, FellBehind, PtyRunning

CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}


service = service_fixture("e2bpty")


def _opts(service: Running) -> dict[str, Any]:
    return {"api_key": KEYS["alice"], "api_url": f"{service.url}/e2b", "sandbox_url": f"{service.url}/e2b/envd"}


@pytest.fixture(scope="module")
def sandbox(service: Running) -> Iterator[Sandbox]:
    created = Sandbox.create(timeout=3600, **_opts(service))  # the module's life, past the 300 s default
    yield created
    created.kill()


def _until(handle: CommandHandle, seen: bytearray, pattern: bytes) -> re.Match[bytes]:
    for _stdout, _stderr, pty in handle:
        if pty is not None:
            seen += pty
            if (match := re.search(pattern, seen)) is not None:
                return match
    raise AssertionError(f"the terminal ended before {pattern!r}: {bytes(seen)!r}")


def test_a_terminal_typed_into_resized_reattached_and_exited(sandbox: Sandbox) -> None:
    terminal = sandbox.pty.create(PtySize(rows=27, cols=91))
    seen = bytearray()
    sandbox.pty.send_stdin(terminal.pid, b'echo "size=$(stty size) term=$TERM tty=$(tty)"\n')
    match = _until(terminal, seen, rb"size=(\d+ \d+) term=(\S+) tty=(\S+)\r\n")
    assert (match[1], match[2]) == (b"27 91", b"xterm-256color")
    assert match[3].startswith(b"/dev/pts/")
    sandbox.pty.resize(terminal.pid, PtySize(rows=40, cols=120))
    sandbox.pty.send_stdin(terminal.pid, b'echo "now=$(stty size)"\n')
    _until(terminal, seen, rb"now=40 120\r\n")
    terminal.disconnect()
    again = sandbox.pty.connect(terminal.pid)
    assert again.pid == terminal.pid
    sandbox.pty.send_stdin(terminal.pid, b"echo back-$((6*7))\n")
    _until(again, bytearray(), rb"back-42\r\n")
    sandbox.pty.send_stdin(terminal.pid, b"exit 3\n")
    with pytest.raises(CommandExitException) as exited:
        again.wait()
    assert exited.value.exit_code == 3


def test_keys_streamed_into_a_terminal(sandbox: Sandbox) -> None:
    """``pty.stream_input``: one ``StreamInput`` stream, its chunks typed in order."""
    terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
    sandbox.pty.stream_input(terminal.pid, [b"echo str", "eam", b"ed-$((6*7))\n"])
    _until(terminal, bytearray(), rb"streamed-42\r\n")
    with pytest.raises(Exception, match="not found"):
        sandbox.pty.stream_input(999_999, [b"x"])
    sandbox.pty.stream_input(terminal.pid, [b"exit 4\n"])
    with pytest.raises(CommandExitException) as exited:
        terminal.wait()
    assert exited.value.exit_code == 4


def test_a_kill_ends_the_terminal_and_its_jobs(sandbox: Sandbox) -> None:
    terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
    sandbox.pty.send_stdin(terminal.pid, b"sleep 987 & echo job-started\n")
    _until(terminal, bytearray(), rb"job-started\r\n")
    assert sandbox.pty.kill(terminal.pid) is True
    with pytest.raises(CommandExitException) as killed:
        terminal.wait()
    assert killed.value.exit_code != 0
    listing = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' <$f; echo; done 2>/dev/null"
    seen = sandbox.commands.run(listing).stdout
    assert "sandboxes_helper" in seen  # the listing sees the sandbox's processes: its exec helper
    assert "sleep 987" not in seen


def test_input_for_an_unknown_or_plain_process_is_refused(sandbox: Sandbox) -> None:
    with pytest.raises(Exception, match="not found"):
        sandbox.pty.send_stdin(999_999, b"x")
    plain = sandbox.commands.run("sleep 30", background=True)
    try:
        with pytest.raises(Exception, match="not started with a pty"):
            sandbox.pty.resize(plain.pid, PtySize(rows=10, cols=10))
    finally:
        plain.kill()


def test_an_async_terminal(service: Running) -> None:
    async def scenario() -> tuple[int, bytes, bytes]:
        sandbox = await AsyncSandbox.create(**_opts(service))
        try:
            seen, again = bytearray(), bytearray()
            changed = asyncio.Event()  # the async SDK calls on_data on the loop

            def on_data(data: bytes) -> None:
                seen.extend(data)
                changed.set()

            terminal = await sandbox.pty.create(PtySize(rows=12, cols=50), on_data=on_data)
            await sandbox.pty.resize(terminal.pid, PtySize(rows=15, cols=60))
            await sandbox.pty.send_stdin(terminal.pid, b'echo "size=$(stty size)"\n')
            while b"size=15 60" not in seen:
                await asyncio.wait_for(changed.wait(), 20)
                changed.clear()
            typing = sandbox.pty.stream_input(terminal.pid)
            await typing.send(b"echo ty")
            await typing.send("ped-$((6*7))\n")
            await typing.close()
            while b"typed-42\r\n" not in seen:
                await asyncio.wait_for(changed.wait(), 20)
                changed.clear()
            await terminal.disconnect()
            reattached = await sandbox.pty.connect(terminal.pid, on_data=again.extend)
            await sandbox.pty.send_stdin(terminal.pid, b"exit 5\n")
            with pytest.raises(CommandExitException) as exited:
                await reattached.wait()
            return exited.value.exit_code, bytes(seen), bytes(again)
        finally:
            await sandbox.kill()

    code, seen, again = asyncio.run(scenario())
    assert code == 5
    assert b"size=15 60\r\n" in seen
    assert b"typed-42\r\n" in seen
    assert b"exit 5" in again


def test_a_connection_that_does_not_read_is_ended_not_queued_for_without_bound() -> None:
    async def scenario() -> tuple[int, object, bool]:
        work: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        running = PtyRunning(1000, "token", {}, work)
        slow, reading = running.listen(), running.listen()
        for _ in range(MAX_QUEUED + 50):
            running.publish(("stdout", b"x" * 1024))
            while not reading.empty():
                reading.get_nowait()
        items = [slow.get_nowait() for _ in range(slow.qsize())]
        work.cancel()
        return len(items), items[-1], slow in running.listeners

    queued, last, still_listening = asyncio.run(scenario())
    assert queued == MAX_QUEUED + 1
    assert isinstance(last, FellBehind)
    assert not still_listening
