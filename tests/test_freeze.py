"""`Freezable` on each backend that has it (`sandboxes.lifecycle`): a counting process stops
while its sandbox is frozen, the exec helper with it, and both go on after `thaw`; on SSH
only a sandbox with a user of its own can be frozen. Kubernetes sandboxes are not `Freezable`
(the pod API has no freezer: the service answers ``unavailable``). Real jails, containers and
an sshd container; counts are read from outside the sandbox, which answers nothing frozen."""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ssh_fixtures import SSHVM, start_vm
from support import HAS_BWRAP, SESSION_OWNER, wait_for

from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.jobs import JobRunner
from sandboxes.kubernetes import KubernetesSandbox
from sandboxes.lifecycle import Freezable, FreezeUnavailable
from sandboxes.local import LocalSandbox, NotIsolatedWarning, _limits
from sandboxes.local._freezer import _descendants, freeze_jail, thaw_jail
from sandboxes.ssh import SSHSandbox, SSHSandboxConfig

COUNTER = "i=0; while :; do i=$((i + 1)); echo $i > count.tmp; mv count.tmp count; sleep 0.02; done"


@pytest.fixture(scope="module")
def vm(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHVM]:
    machine = start_vm(tmp_path_factory.mktemp("ssh-freeze"))
    yield machine
    machine.stop()


def _assert_freezes_and_thaws(sandbox: Any, count: Callable[[], int], states: Callable[[], str]) -> None:
    assert isinstance(sandbox, Freezable)
    JobRunner(sandbox).start(COUNTER, cwd=sandbox.workdir)
    wait_for(lambda: sandbox.execute("cat count 2>/dev/null").output.strip() != "", "the counter")
    sandbox.freeze()
    sandbox.freeze()  # idempotent
    try:
        frozen_at = count()
        time.sleep(0.3)  # an observation window: a running counter moves ~15 times in it
        assert count() == frozen_at, "the counter moved while frozen"
        # Stopped, in uninterruptible sleep, or a zombie (a child that exited just before the
        # freeze, which its frozen parent reaps after the thaw): none of them runs.
        assert set(states()) <= set("TtDZ"), f"a process of the sandbox still runs: {states()!r}"
    finally:
        sandbox.thaw()
    sandbox.thaw()  # idempotent
    wait_for(lambda: int(sandbox.execute("cat count").output) > frozen_at + 2, "the counter to go on")


@pytest.mark.needs(HAS_BWRAP, "bubblewrap is not installed")
def test_a_local_jail_freezes_whole_and_thaws(tmp_path: Path) -> None:
    with LocalSandbox.create() as sandbox:
        sandbox.execute("true")  # the helper runs
        root = Path(sandbox.root)

        def states() -> str:
            process = sandbox._helper_process
            assert process is not None
            pid = process.process.pid
            cgroup = sandbox._cgroup
            pids = cgroup.pids() if cgroup is not None else [pid]
            return "".join(_state(pid) for pid in pids if _state(pid) not in ("", "Z"))

        _assert_freezes_and_thaws(sandbox, lambda: int((root / "count").read_text()), states)


def _state(pid: int) -> str:
    """A process's state letter (``T``: stopped; a cgroup v1 freezer shows ``D``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2]


def test_a_container_freezes_and_thaws(docker_client: Any, runtime_image: str) -> None:
    config = DockerSandboxConfig(image=runtime_image, owner=SESSION_OWNER)
    with DockerSandbox.create(config, client=docker_client) as sandbox:

        def count() -> int:
            chunks, _ = sandbox.container.get_archive("/workspace/count")
            with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
                member = tar.extractfile("count")
                assert member is not None
                return int(member.read())

        def states() -> str:
            sandbox.container.reload()
            return "T" if sandbox.container.status == "paused" else "R"

        _assert_freezes_and_thaws(sandbox, count, states)


def test_an_ssh_sandbox_freezes_its_users_processes_helper_included(vm: SSHVM) -> None:
    with SSHSandbox.create(SSHSandboxConfig(host=vm.host_config())) as sandbox:
        user = sandbox.user
        assert user is not None

        def in_vm(command: str) -> str:
            code, output = vm.docker.exec_run(["sh", "-c", command])
            assert code == 0, output
            return str(output.decode())

        def count() -> int:
            return int(in_vm(f"cat {sandbox.workspace}/count"))

        def states() -> str:
            lines = in_vm(f"ps -o stat=,args= -u {user}").splitlines()
            assert any("python" in line for line in lines), f"no exec helper among {lines}"
            return "".join(line.split()[0][0] for line in lines)

        _assert_freezes_and_thaws(sandbox, count, states)


def test_an_ssh_sandbox_without_a_user_of_its_own_cannot_be_frozen(vm: SSHVM) -> None:
    with pytest.warns(NotIsolatedWarning):
        sandbox = SSHSandbox.create(SSHSandboxConfig(host=vm.host_config(), isolation="none"))
    with sandbox, pytest.raises(FreezeUnavailable, match="no user of its own"):
        sandbox.freeze()


def test_a_kubernetes_sandbox_is_not_freezable() -> None:
    """The pod API has no freezer (no pause of a container's cgroup, in the real API or the
    fake): the service answers ``unavailable`` for it (tests/server/test_service_pause.py)."""
    assert not issubclass(KubernetesSandbox, Freezable)


@pytest.mark.needs(HAS_BWRAP, "bubblewrap is not installed")
def test_without_a_cgroup_a_local_jail_is_stopped_by_signals_whole(tmp_path: Path) -> None:
    """The fallback where no cgroup can be written: SIGSTOP of the jail's launch process and every
    descendant (`freeze_jail` with no cgroup), SIGCONT back."""
    with LocalSandbox.create() as sandbox:
        sandbox.execute("true")
        process = sandbox._helper_process
        assert process is not None
        launcher = process.process.pid
        root = Path(sandbox.root)
        JobRunner(sandbox).start(COUNTER, cwd=sandbox.workdir)
        wait_for(lambda: (root / "count").exists() and (root / "count").read_text().strip() != "", "the counter")
        freeze_jail(None, launcher)
        try:
            tree = [launcher, *_descendants(launcher)]
            assert len(tree) > 3  # bwrap, the jail's init, the helper, the job's processes
            assert {_state(pid) for pid in tree} - {"", "Z"} == {"T"}
            frozen_at = int((root / "count").read_text())
            time.sleep(0.3)  # an observation window: a running counter moves ~15 times in it
            assert int((root / "count").read_text()) == frozen_at
        finally:
            thaw_jail(None, launcher)
        wait_for(lambda: int(sandbox.execute("cat count").output) > frozen_at + 2, "the counter to go on")


@pytest.mark.needs(HAS_BWRAP, "bubblewrap is not installed")
def test_a_cgroup_freezer_that_does_not_settle_falls_back_to_signals(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under cgroup v1 a shell's ``vfork`` whose child the freezer took first never settles
    (the parent waits in the kernel for a child that cannot run): the freezer is thawed again
    and the jail stopped by signals instead. Here the freezer is made never to settle."""

    def never(path: Path, wanted: str, deadline: float = 0.0) -> bool:
        raise OSError(f"{path} did not reach {wanted!r}")

    monkeypatch.setattr(_limits, "_settled", never)
    with LocalSandbox.create() as sandbox:
        root = Path(sandbox.root)
        assert sandbox._cgroup is not None
        JobRunner(sandbox).start(COUNTER, cwd=sandbox.workdir)
        wait_for(lambda: (root / "count").exists() and (root / "count").read_text().strip() != "", "the counter")
        sandbox.freeze()
        try:
            cgroup = sandbox._cgroup
            assert {_state(pid) for pid in cgroup.pids()} - {"", "Z"} == {"T"}
            frozen_at = int((root / "count").read_text())
            time.sleep(0.3)  # an observation window: a running counter moves ~15 times in it
            assert int((root / "count").read_text()) == frozen_at
        finally:
            sandbox.thaw()
        wait_for(lambda: int(sandbox.execute("cat count").output) > frozen_at + 2, "the counter to go on")
