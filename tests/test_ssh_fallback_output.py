"""SSHSandbox without the exec helper (one channel per command): a command's answer holds all
that it printed, although sshd may send the exit status before the last of the output (it
reports the child's exit at once, and sends what is still in the output pipe as the channel's
window allows). Reproduced deterministically against a real sshd: output past the channel's
window, a consumer that holds on until the exit status is in, then a transport that delivers
what follows slowly."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import paramiko
import pytest
from ssh_fixtures import start_vm

from sandboxes.ssh import SSHSandbox, SSHSandboxConfig
from sandboxes.ssh._channels import EndScan

_WINDOW = paramiko.common.DEFAULT_WINDOW_SIZE
"""What sshd may send before the client reads (paramiko's channel window)."""


@pytest.fixture(scope="module")
def fallback(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHSandbox]:
    vm = start_vm(tmp_path_factory.mktemp("ssh-fallback-output"))
    try:
        with SSHSandbox.create(SSHSandboxConfig(host=vm.host_config(), use_exec_helper=False)) as created:
            yield created
    finally:
        vm.stop()


def test_output_that_trails_the_exit_status_is_kept(fallback: SSHSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    size = _WINDOW + (16 << 10)  # past the window, and within a pipe's buffer: the command exits first
    fed: list[paramiko.Channel] = []
    table = paramiko.Transport._channel_handler_table  # how the transport hands a channel its data
    feed = table[paramiko.common.MSG_CHANNEL_DATA]

    def slow_after_the_status(channel: paramiko.Channel, message: Any) -> None:
        fed.append(channel)
        if channel.status_event.is_set():
            time.sleep(0.3)  # the injected delay: output that trails the exit status comes late
        feed(channel, message)

    monkeypatch.setitem(table, paramiko.common.MSG_CHANNEL_DATA, slow_after_the_status)
    status_first = threading.Event()

    def hold_until_the_status(chunk: bytes, stream: str) -> None:
        if fed and not status_first.is_set() and fed[-1].status_event.wait(30):
            status_first.set()

    result = fallback.execute_streaming(
        f"yes | head -c {size}", hold_until_the_status, timeout=60, output_limit=2 * size
    )
    assert status_first.is_set(), "the exit status never came before the rest of the output"
    assert (result.exit_code, result.error, result.truncated) == (0, None, False), result.message
    lost = size - len(result.output)
    assert lost == 0, f"{lost} bytes of output lost"
    assert result.output == "y\n" * (size // 2), "the output is not what the command printed"


def test_output_of_many_concurrent_commands_is_whole(fallback: SSHSandbox) -> None:
    """Each command's whole output, with channels opened and closed side by side."""
    lines = 200
    results: list[str] = []

    def run(i: int) -> None:
        results.append(fallback.execute(f"seq {i} {i + lines - 1}").output)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sorted(len(output.splitlines()) for output in results) == [lines] * 16


def test_the_end_token_is_found_across_chunks_and_never_passed_on() -> None:
    scan = EndScan(b"0123abcd")
    passed = [scan.feed(chunk) for chunk in (b"out 01", b"2", b"3ab no 0", b"12", b"3abcd", b"late")]
    assert b"".join(passed) == b"out 0123ab no "  # only what may start the token is held back
    assert passed[0] == b"out "
    assert passed[2] == b"0123ab no "
    assert scan.found
    assert scan.rest() == b""


def test_a_stream_without_the_end_token_is_passed_on_whole() -> None:
    scan = EndScan(b"0123abcd")
    assert scan.feed(b"tail 0123") + scan.rest() == b"tail 0123"
    assert not scan.found
