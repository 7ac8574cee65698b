"""SSHSandbox: a silent command is never idleness that ends the exec helper's channel. Paramiko
gives a channel no read timeout unless told, and the transport's keepalive requests keep the
connection busy while a command prints nothing; checked here at the unit level (the five-minute
silence on every backend is `tests/test_long_silent.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ssh_fixtures import start_vm

from sandboxes.ssh import SSHSandbox, SSHSandboxConfig


@pytest.fixture
def sandbox(docker_client: Any, tmp_path: Path) -> Iterator[SSHSandbox]:
    vm = start_vm(tmp_path)
    try:
        with SSHSandbox.create(SSHSandboxConfig(host=vm.host_config(keepalive=1))) as created:
            yield created
    finally:
        vm.stop()


def test_a_silent_command_keeps_its_helper_and_channel(sandbox: SSHSandbox) -> None:
    assert sandbox.execute("true").exit_code == 0
    mux = sandbox.helper_driver.mux
    assert mux is not None
    channel = mux._stream._channel  # type: ignore[attr-defined]
    assert channel.gettimeout() is None
    result = sandbox.execute("sleep 3; echo done", timeout=30)  # three keepalive rounds meanwhile
    assert (result.exit_code, result.error, result.output) == (0, None, "done\n"), result
    assert sandbox.helper_driver.mux is mux
    assert mux.alive
