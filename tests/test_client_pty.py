"""Terminals through the Python client (`RemoteSandbox.pty`, `apty`) and the CLI (``sandboxes shell
SANDBOX``, driven under a real pseudo-terminal made with python's `pty` module), against the real
service in-process (uvicorn on 127.0.0.1, the local backend)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator

import pydantic
import pytest
from server.service_harness import KEYS, Running, running, settings_for
from support import HAS_BWRAP

from sandboxes.client import NotFound, RemoteSandbox, SandboxClient, Unauthorized

pytestmark = pytest.mark.needs(HAS_BWRAP, "the local backend needs bubblewrap")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with running(settings_for(tmp_path_factory.mktemp("client-pty"))) as svc:
        yield svc


@pytest.fixture(scope="module")
def remote(service: Running) -> Iterator[RemoteSandbox]:
    with SandboxClient(service.url, KEYS["alice"]) as client, client.create() as sandbox:
        yield sandbox


def _until(chunks: Iterator[bytes], seen: bytearray, pattern: bytes) -> re.Match[bytes]:
    for chunk in chunks:
        seen += chunk
        if (match := re.search(pattern, seen)) is not None:
            return match
    raise AssertionError(f"the terminal ended before {pattern!r}: {bytes(seen)!r}")


def test_send_iterate_resize_and_the_exit(remote: RemoteSandbox) -> None:
    with remote.pty(cols=91, rows=27) as terminal:
        assert terminal.session
        output = iter(terminal)
        seen = bytearray()
        terminal.send('echo "size=$(stty size) term=$TERM"\n')
        _until(output, seen, rb"size=27 91 term=xterm-256color\r\n")
        terminal.resize(120, 40)
        terminal.send('echo "now=$(stty size)"\n')
        _until(output, seen, rb"now=40 120\r\n")
        terminal.send("exit 6\n")
        ended = terminal.wait()
    assert ended is not None
    assert ended.exit_code == 6


def test_kill_and_reattach_by_session(remote: RemoteSandbox) -> None:
    first = remote.pty(command="echo begun; cat")
    _until(iter(first), bytearray(), rb"begun\r\n")
    first.close()
    with remote.pty(session=first.session) as again:
        output = iter(again)
        seen = bytearray()
        _until(output, seen, rb"begun\r\n")  # the scrollback
        again.send("live\n")
        _until(output, seen, rb"live\r\nlive\r\n")
        again.kill()
        ended = again.wait()
    assert ended is not None
    assert ended.exit_code not in (0, None)


def test_refusals_raise_the_clients_errors(remote: RemoteSandbox, service: Running) -> None:
    with pytest.raises(NotFound):
        remote.pty(session="no-such-session")
    with pytest.raises(pydantic.ValidationError):
        remote.pty(cols=0)
    with SandboxClient(service.url, "wrong-key") as stranger, pytest.raises(Unauthorized):
        stranger.attach(remote.id).pty()


def test_an_async_terminal(remote: RemoteSandbox) -> None:
    async def scenario() -> tuple[int | None, bytes]:
        terminal = await remote.apty(cols=50, rows=12, command="read line; stty size; exit 9")
        async with terminal:
            await terminal.resize(60, 15)
            await terminal.send(b"go\r")
            seen = b""
            async for chunk in terminal:
                seen += chunk
            assert terminal.exit is not None
            return terminal.exit.exit_code, seen

    code, seen = asyncio.run(scenario())
    assert code == 9
    assert b"15 60\r\n" in seen


# ---------------------------------------------------------------------- the CLI

_CONTROLLING = (
    "import os, sys, fcntl, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); os.execv(sys.argv[1], sys.argv[1:])"
)
"""Run the rest of the command line with its stdin (a pty's slave) as its controlling terminal,
so that the kernel sends it SIGWINCH when the size changes, as a shell's child gets it."""


def _set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class _Screen:
    """The CLI's terminal as a person sees it: the master side of its pty."""

    def __init__(self, master: int) -> None:
        self.master = master
        self.seen = b""

    def until(self, pattern: bytes, start: int = 0) -> re.Match[bytes]:
        deadline = time.monotonic() + 20
        while (match := re.search(pattern, self.seen[start:], re.DOTALL)) is None:
            left = deadline - time.monotonic()
            assert left > 0, self.seen
            if select.select([self.master], [], [], left)[0]:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: the CLI exited
                    chunk = b""
                assert chunk, f"the CLI ended before {pattern!r}: {self.seen!r}"
                self.seen += chunk
        return match


def _shell(service: Running, remote: RemoteSandbox, slave: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SANDBOXES_URL": service.url, "SANDBOXES_API_KEY": KEYS["alice"]}
    argv = [sys.executable, "-c", _CONTROLLING, sys.executable, "-m", "sandboxes.cli", "shell", remote.id]
    return subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)


def test_the_cli_shell_is_interactive_follows_the_size_and_exits_with_the_shells_code(
    service: Running, remote: RemoteSandbox
) -> None:
    master, slave = pty.openpty()
    _set_size(master, 100, 30)
    before = termios.tcgetattr(slave)
    process = _shell(service, remote, slave)
    try:
        screen = _Screen(master)
        screen.until(rb"\$ ")  # the shell's prompt: the CLI is in raw mode (which flushes what came before)
        os.write(master, b'echo "size=$(stty size)"\r')
        screen.until(rb"size=30 100\r\n")
        _set_size(master, 120, 40)  # the CLI gets SIGWINCH, and resizes the sandbox's terminal
        for _ in range(50):  # the resize and the keys go separate ways: ask until the new size shows
            start = len(screen.seen)
            os.write(master, b'echo "now=$(stty size)"\r')
            if screen.until(rb"now=(\d+ \d+)\r\n", start)[1] == b"40 120":
                break
        else:
            raise AssertionError(f"the resize never reached the sandbox: {screen.seen!r}")
        start = len(screen.seen)
        os.write(master, b"sleep 100\r")
        screen.until(rb"sleep 100\r\n", start)
        os.write(master, b"\x03")  # raw mode: Ctrl-C goes to the sandbox's terminal, the CLI lives on
        screen.until(rb"sleep 100\r\n.*\^C.*\$ ", start)  # the sleep interrupted, the next prompt
        os.write(master, b"exit 3\r")
        assert process.wait(20) == 3
        assert termios.tcgetattr(slave) == before  # this terminal is back as it was
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
        os.close(slave)


def test_the_cli_shell_on_a_terminal_of_unknown_size_opens_80_by_24(service: Running, remote: RemoteSandbox) -> None:
    master, slave = pty.openpty()  # a new pty's size is 0 x 0
    process = _shell(service, remote, slave)
    try:
        screen = _Screen(master)
        screen.until(rb"\$ ")
        os.write(master, b'echo "size=$(stty size)"; exit\r')
        screen.until(rb"size=24 80\r\n")
        assert process.wait(20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
        os.close(slave)


def test_the_cli_shell_without_a_terminal_says_so(service: Running, remote: RemoteSandbox) -> None:
    env = {**os.environ, "SANDBOXES_URL": service.url, "SANDBOXES_API_KEY": KEYS["alice"]}
    result = subprocess.run(
        [sys.executable, "-m", "sandboxes.cli", "shell", remote.id],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert b"shell needs a terminal on its stdin" in result.stderr
