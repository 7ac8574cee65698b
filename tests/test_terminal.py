"""An interactive terminal in a sandbox (`sandboxes.terminal`): a login shell on a pseudo-terminal
through the exec helper, in a local jail and in a Docker container, sync and async; a sandbox
without a helper says so."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import SESSION_OWNER

from sandboxes import protocol as p
from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.local import LocalSandbox
from sandboxes.state import StateBackend
from sandboxes.terminal import Terminal, TerminalError, aopen_terminal, open_terminal


class _Screen:
    """What the terminal wrote, and a condition to wait on it."""

    def __init__(self) -> None:
        self.data = b""
        self._changed = threading.Condition()

    def __call__(self, chunk: bytes) -> None:
        with self._changed:
            self.data += chunk
            self._changed.notify_all()

    def wait_for(self, pattern: bytes) -> re.Match[bytes]:
        found: list[re.Match[bytes]] = []

        def seen() -> bool:
            match = re.search(pattern, self.data)
            if match is not None:
                found.append(match)
            return match is not None

        with self._changed:
            assert self._changed.wait_for(seen, timeout=20), self.data
        return found[0]


@pytest.fixture(params=["local", "docker"])
def sandbox(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "local":
        yield request.getfixturevalue("jail")
        return
    image = request.getfixturevalue("runtime_image")
    client = request.getfixturevalue("docker_client")
    config = DockerSandboxConfig(image=image, owner=SESSION_OWNER, env={"GREETING": "from-config"})
    with DockerSandbox.create(config, client=client) as made:
        yield made


def _workdir(sandbox: Any) -> str:
    return str(sandbox.root) if isinstance(sandbox, LocalSandbox) else sandbox.config.workdir


def _shell(sandbox: Any, screen: Callable[[bytes], None], **options: Any) -> Terminal:
    return open_terminal(sandbox, screen, cols=91, rows=27, **options)


def test_a_login_shell_on_a_terminal_sized_resized_where_commands_run(sandbox: Any) -> None:
    screen = _Screen()
    terminal = _shell(sandbox, screen, env={"EXTRA": "given"})
    terminal.send('echo "size=$(stty size) dir=$(pwd) term=$TERM extra=$EXTRA tty=$(tty)"\n')
    match = screen.wait_for(rb"size=(\d+ \d+) dir=(\S+) term=(\S+) extra=(\S+) tty=(\S+)\r\n")
    assert match[1] == b"27 91"
    assert match[2].decode() == _workdir(sandbox)
    assert match[3] == b"xterm-256color"
    assert match[4] == b"given"
    assert match[5].startswith(b"/dev/pts/")
    terminal.resize(120, 33)
    terminal.send('echo "now=$(stty size)"\n')
    screen.wait_for(rb"now=33 120\r\n")
    terminal.send("exit 5\n")
    answer = terminal.wait(20)
    assert answer is not None
    assert answer.exit_code == 5
    assert terminal.done


def test_the_sandboxs_own_environment_reaches_the_terminal(sandbox: Any) -> None:
    screen = _Screen()
    terminal = _shell(sandbox, screen, command='echo "home=$HOME greeting=${GREETING:-none}"')
    answer = terminal.wait(20)
    assert answer is not None
    assert answer.exit_code == 0
    expected = sandbox.command_context()[0]
    match = screen.wait_for(rb"home=(\S*) greeting=(\S+)\r\n")
    assert match[1].decode() == expected.get("HOME", match[1].decode())
    assert match[2].decode() == expected.get("GREETING", "none")


def test_a_kill_ends_a_shell_and_its_jobs(sandbox: Any) -> None:
    screen = _Screen()
    terminal = _shell(sandbox, screen)
    terminal.send("sleep 300 & sleep 301 & echo jobs-started\n")
    screen.wait_for(rb"jobs-started\r\n")
    terminal.kill()
    answer = terminal.wait(20)
    assert answer is not None
    assert answer.exit_code not in (0, None)
    listing = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' <$f; echo; done 2>/dev/null"
    seen = sandbox.execute(listing).output
    assert "sandboxes_helper" in seen  # the listing sees the sandbox's processes: its exec helper
    assert "sleep 300" not in seen


def test_a_terminal_on_an_event_loop(sandbox: Any) -> None:
    screen = _Screen()

    async def scenario() -> int | None:
        terminal = await aopen_terminal(sandbox, screen, cols=40, rows=10, command="read line; stty size; exit 7")
        await terminal.aresize(50, 12)
        await terminal.asend(b"go\r")
        answer = await terminal.wait_async()
        return answer.exit_code

    assert asyncio.run(scenario()) == 7
    screen.wait_for(rb"12 50\r\n")


def test_a_size_out_of_bounds_is_refused(jail: LocalSandbox) -> None:
    with pytest.raises(ValueError, match="cols and rows"):
        open_terminal(jail, lambda chunk: None, cols=0, rows=24)


def test_a_sandbox_without_an_exec_helper_says_so(tmp_path: Path) -> None:
    with pytest.raises(TerminalError, match="no exec helper") as raised:
        open_terminal(StateBackend(), lambda chunk: None)
    assert raised.value.code == p.UNAVAILABLE
