"""Every backend holds one `sandboxes._mux.HelperDriver` (composition): a fault injected into the
driver class reaches an SSH sandbox and a local jail alike, with nothing of either patched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ssh_fixtures import SSHVM, start_vm
from support import HAS_BWRAP, needs

from sandboxes import protocol as p
from sandboxes._mux import DrivenSandbox, HelperDriver, MuxClient
from sandboxes.base import StreamingSandbox
from sandboxes.local import LocalSandbox
from sandboxes.local.sandbox import LocalSandboxConfig
from sandboxes.ssh import SSHSandbox, SSHSandboxConfig

BACKENDS = ("local", "ssh")


@pytest.fixture(scope="module")
def ssh_vm(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHVM]:
    vm = start_vm(tmp_path_factory.mktemp("held"))
    yield vm
    vm.stop()


@pytest.fixture(params=BACKENDS)
def sandbox(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StreamingSandbox]:
    if request.param == "local":
        needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
        with LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap")) as local:
            yield local
        return
    vm: SSHVM = request.getfixturevalue("ssh_vm")
    with SSHSandbox.create(SSHSandboxConfig(host=vm.host_config())) as remote:
        yield remote


def test_the_sandbox_holds_a_driver_and_its_helper_is_the_drivers(sandbox: Any) -> None:
    assert isinstance(sandbox, DrivenSandbox)
    assert isinstance(sandbox.helper_driver, HelperDriver)
    assert sandbox.execute("echo via the helper").output == "via the helper\n"
    assert sandbox.exec_helper() is sandbox.helper_driver.mux
    assert sandbox.running_helper() is sandbox.helper_driver.mux


def test_a_driver_without_a_helper_makes_every_backend_run_alone(sandbox: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault (the driver finds no helper) is injected into `HelperDriver` alone: each backend
    then runs its commands its own slow way, its file ops by their scripts, and offers no helper
    to the capabilities built on one."""
    asked: list[HelperDriver] = []

    def no_helper(driver: HelperDriver) -> MuxClient | None:
        asked.append(driver)
        return None

    monkeypatch.setattr(HelperDriver, "helper", no_helper)
    assert sandbox.execute("echo alone; echo err >&2").output == "alone\nerr\n"
    assert not sandbox.helper_alive
    assert sandbox.exec_helper() is None
    path = f"{sandbox.workdir}/by-the-script.txt"
    assert sandbox.write(path, "written\n").error is None
    assert sandbox.read(path).file_data == p.FileData("written\n")
    assert set(asked) == {sandbox.helper_driver}
    assert len(asked) >= 4  # the command, exec_helper, the write, the read
