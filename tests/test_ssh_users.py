"""Per-sandbox users on one SSH host (`sandboxes.ssh._users`): sandboxes sharing a VM cannot
read, write, list or signal each other, and a user goes back to the pool emptied of everything
the last sandbox left. Against a real sshd container from the ssh-vm image (32 pool users)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from ssh_fixtures import SSH_VM_IMAGE, SSHVM, start_vm
from support import SESSION_OWNER

from sandboxes import protocol as p
from sandboxes.jobs import JobRunner
from sandboxes.local import NotIsolatedWarning
from sandboxes.ssh import SSHSandbox, SSHSandboxConfig, UserPoolError
from sandboxes.testing import SandboxConformance


@pytest.fixture(scope="module")
def vm(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHVM]:
    machine = start_vm(tmp_path_factory.mktemp("ssh-users"))
    yield machine
    machine.stop()


@pytest.fixture
def pair(vm: SSHVM) -> Iterator[tuple[SSHSandbox, SSHSandbox]]:
    config = SSHSandboxConfig(host=vm.host_config())
    with SSHSandbox.create(config) as first, SSHSandbox.create(config) as second:
        yield first, second


def _whoami(sandbox: SSHSandbox) -> str:
    return sandbox.execute("id -un").output.strip()


def test_each_sandbox_runs_as_its_own_user(pair: tuple[SSHSandbox, SSHSandbox]) -> None:
    first, second = pair
    assert first.user is not None
    assert second.user is not None
    assert first.user != second.user
    assert _whoami(first) == first.user
    assert _whoami(second) == second.user
    assert "sandbox" not in (first.user, second.user)  # never the login user
    assert first.execute("stat -c '%U %a' .").output.split() == [first.user, "700"]


def test_sandboxes_cannot_read_write_or_list_each_others_files(pair: tuple[SSHSandbox, SSHSandbox]) -> None:
    first, second = pair
    secret = f"{first.workspace}/secret.txt"
    assert first.write(secret, "first's secret").error is None

    assert second.read(secret).error == p.PERMISSION_DENIED
    assert second.ls(first.workspace).error == p.PERMISSION_DENIED
    assert second.write(f"{first.workspace}/planted.txt", "x").error == p.PERMISSION_DENIED
    assert second.delete(secret).error == p.PERMISSION_DENIED
    assert second.download_files([secret])[0].error == p.PERMISSION_DENIED
    peek = second.execute(f"cat {secret}")
    assert peek.exit_code != 0
    assert "first's secret" not in peek.output
    # Nor can it find the other workspaces: the root is not listable.
    root = first.workspace.rsplit("/", 1)[0]
    assert second.execute(f"ls {root}").exit_code != 0
    assert second.execute("ls /home/sandbox").exit_code != 0  # nor the login user's home
    assert first.read(secret).file_data is not None  # the owner still can


def test_files_in_the_shared_tmp_are_private_and_tmpdir_is_the_sandboxs_own(
    pair: tuple[SSHSandbox, SSHSandbox],
) -> None:
    first, second = pair
    assert first.execute("echo hidden > /tmp/first-was-here").exit_code == 0
    peek = second.execute("cat /tmp/first-was-here")
    assert peek.exit_code != 0
    assert "hidden" not in peek.output

    tmpdir = first.execute('printf %s "$TMPDIR"').output
    root, _, name = first.workspace.rpartition("/")
    assert tmpdir == f"{root}/.{name}.tmp"
    made = first.execute('f=$(mktemp) && stat -c "%U %a" "$f" && dirname "$f"').output.split()
    assert made == [str(first.user), "600", tmpdir]
    assert second.execute(f"ls {tmpdir}").exit_code != 0


def test_a_sandbox_cannot_signal_anothers_processes(pair: tuple[SSHSandbox, SSHSandbox]) -> None:
    first, second = pair
    outcome: dict[str, p.ExecuteResponse] = {}
    runner = threading.Thread(target=lambda: outcome.setdefault("r", first.execute("sleep 3; echo survived")))
    runner.start()
    deadline = time.monotonic() + 10
    pids: list[str] = []
    while not pids and time.monotonic() < deadline:
        pids = second.execute(f"pgrep -u {first.user} -x sleep").output.split()
    assert pids, "the first sandbox's sleep never showed up"
    attack = second.execute(f"kill -9 {' '.join(pids)}; echo status=$?")
    assert "status=1" in attack.output  # EPERM
    runner.join(15)
    assert outcome["r"].output == "survived\n"


def test_destroy_returns_the_user_emptied_of_everything(vm: SSHVM) -> None:
    """Whatever a sandbox leaves (a background job's process still running, files
    in /tmp, /run/lock and its home, a POSIX message queue, SysV shared memory, queues and
    semaphores) is gone before the next sandbox gets the same user."""
    # A pool of one, one exec_command per command. An escaped process dies when its command
    # ends (`tests/test_kill_escapes.py`); what a command may leave running is a background
    # job, whose process is left here for the destroy to find.
    config = SSHSandboxConfig(host=vm.host_config(), user_group="sbx-07", use_exec_helper=False)
    first = SSHSandbox.create(config)
    user = first.user
    assert user == "sbx-07"
    JobRunner(first).start("exec /bin/sleep 600", timeout=1000)
    leftover = first.execute(
        "for i in $(seq 100); do pgrep -x sleep >/dev/null && break; sleep 0.05; done; "
        "echo left > /tmp/left-by-first; echo left > $HOME/.left-by-first; "
        "echo left > /run/lock/left-by-first; touch /dev/mqueue/left-by-first; "
        "ipcmk -M 4096 >/dev/null && ipcmk -Q >/dev/null && ipcmk -S 1 >/dev/null && echo ok"
    )
    assert leftover.output == "ok\n"
    assert first.execute("pgrep -x sleep").exit_code == 0, "the job's process should outlive the command"
    first.destroy()

    with SSHSandbox.create(config) as second:
        assert second.user == user
        assert second.execute("pgrep -x sleep").exit_code == 1
        assert second.execute("ls -A /tmp/left-by-first $HOME/.left-by-first").exit_code != 0
        owned = second.execute(
            "me=$(id -u); find /run/lock /dev/mqueue -user $me; "
            "awk -v me=$me 'NR > 1 && $8 == me' /proc/sysvipc/shm /proc/sysvipc/msg; "
            "awk -v me=$me 'NR > 1 && $5 == me' /proc/sysvipc/sem"
        )
        assert owned.output == "", "the previous holder of the user left IPC objects or lock files"
        assert second.execute(f"test -e {first.workspace}").exit_code == 1


def test_the_root_is_shut_to_lessees_and_a_release_leaves_nothing_the_user_owns(vm: SSHVM) -> None:
    """A lessee cannot make entries in the shared workspace root; whatever it left there (made
    while the root was open for another lease) or in /tmp, /var/tmp, /dev/shm and its home, even
    behind a directory it made unreadable, is gone for the next holder of the user."""
    config = SSHSandboxConfig(host=vm.host_config(), user_group="sbx-10", use_exec_helper=False)
    first = SSHSandbox.create(config)
    root = first.workspace.rsplit("/", 1)[0]
    assert first.user == "sbx-10"
    assert first.execute(f"mkdir {root}/.a-stash").exit_code != 0, "a lessee could write in the root"
    # What a lessee gets in while another lease has the root open: put it there as the login user's
    # window would let it (the root at 1733), then shut the root again.
    assert vm.docker.exec_run(["chmod", "1733", root]).exit_code == 0
    planted = first.execute(
        f"mkdir {root}/.a-stash && echo A-LEFTOVER-IN-ROOT > {root}/.a-stash/note && "
        f"echo A-LEFTOVER-IN-ROOT > {root}/.a-file && chmod 000 {root}/.a-stash && "
        "for d in /tmp /var/tmp /dev/shm $HOME; do mkdir $d/a-dir && echo A-LEFTOVER > $d/a-dir/note && "
        "chmod 000 $d/a-dir || exit 1; done; echo ok"
    )
    assert vm.docker.exec_run(["chmod", "711", root]).exit_code == 0
    assert planted.output == "ok\n"
    first.destroy()

    owned = vm.docker.exec_run(
        ["find", root, "/tmp", "/var/tmp", "/dev/shm", "/home/sbx-10", "-mindepth", "1", "-user", "sbx-10"]
    )
    assert owned.output.decode() == "", "the released user still owns files on the host"
    with SSHSandbox.create(config) as second:
        assert second.user == "sbx-10"
        peek = second.execute(f"cat {root}/.a-stash/note {root}/.a-file")
        assert "A-LEFTOVER-IN-ROOT" not in peek.output
        assert second.execute(f"touch {root}/.b-file").exit_code != 0
        assert second.execute(f"test -d {second.workspace}").exit_code == 0
    stat = vm.docker.exec_run(["stat", "-c", "%a", root])
    assert stat.output.decode().strip() == "711"


def test_an_exhausted_pool_is_a_clear_error_until_a_sandbox_is_destroyed(vm: SSHVM) -> None:
    config = SSHSandboxConfig(host=vm.host_config(), user_group="sbx-08")
    holder = SSHSandbox.create(config)
    try:
        with pytest.raises(UserPoolError, match="every user of group 'sbx-08'"):
            SSHSandbox.create(config)
    finally:
        holder.destroy()
    with SSHSandbox.create(config) as again:
        assert again.user == "sbx-08"


def test_a_host_not_prepared_for_isolation_says_how_to_fix_it(vm: SSHVM) -> None:
    with pytest.raises(UserPoolError, match=r"no group 'nosuchgroup'.*isolation='none'"):
        SSHSandbox.create(SSHSandboxConfig(host=vm.host_config(), user_group="nosuchgroup"))
    # `sandbox` (the login user's own group) is not one sudo lets it switch into.
    with pytest.raises(UserPoolError, match=r"cannot make workspace .* sudoers"):
        SSHSandbox.create(SSHSandboxConfig(host=vm.host_config(), user_group="sandbox"))


def test_attach_runs_as_the_leased_user(vm: SSHVM) -> None:
    config = SSHSandboxConfig(host=vm.host_config())
    original = SSHSandbox.create(config)
    try:
        original.write(f"{original.workspace}/kept.txt", "kept")
        original.close()
        attached = SSHSandbox.attach(config, original.workspace)
        assert attached.user == original.user
        assert attached.execute("cat kept.txt").output == "kept"
    finally:
        attached.destroy()
    with pytest.raises(UserPoolError, match="no workspace"):
        SSHSandbox.attach(config, original.workspace)


def test_big_files_move_by_sftp_as_the_sandboxs_user(pair: tuple[SSHSandbox, SSHSandbox]) -> None:
    first, second = pair
    data = bytes(range(256)) * (3 * 4096)  # 3 MiB: over the bulk threshold
    path = f"{first.workspace}/big.bin"
    assert first.upload_files([(path, data)])[0].error is None
    assert first.execute("stat -c '%U %a' big.bin").output.split() == [first.user, "600"]
    assert first.download_files([path])[0].content == data
    assert second.download_files([path])[0].error == p.PERMISSION_DENIED
    assert second.upload_files([(path, data)])[0].error == p.PERMISSION_DENIED


def test_run_as_one_named_user_without_isolation(vm: SSHVM) -> None:
    config = SSHSandboxConfig(host=vm.host_config(), isolation="none", run_as="sbx-09")
    with pytest.warns(NotIsolatedWarning):
        sandbox = SSHSandbox.create(config)
    with sandbox:
        assert _whoami(sandbox) == "sbx-09"
        assert sandbox.execute("stat -c %U .").output.strip() == "sbx-09"
        data = b"\x00\xff" * (1 << 20)
        assert sandbox.upload_files([(f"{sandbox.workspace}/big.bin", data)])[0].error is None
        assert sandbox.execute("stat -c %U big.bin").output.strip() == "sbx-09"


def test_run_as_is_refused_with_per_sandbox_users(vm: SSHVM) -> None:
    with pytest.raises(ValueError, match="run_as is the one user of isolation='none'"):
        SSHSandboxConfig(host=vm.host_config(), run_as="sbx-09")


def test_without_isolation_sandboxes_share_the_login_user(vm: SSHVM) -> None:
    """What ``isolation='none'`` means, asserted so that nobody mistakes it for isolation."""
    config = SSHSandboxConfig(host=vm.host_config(), isolation="none")
    with pytest.warns(NotIsolatedWarning, match="can read the others' files"):
        first = SSHSandbox.create(config)
    with pytest.warns(NotIsolatedWarning):
        second = SSHSandbox.create(config)
    try:
        assert _whoami(first) == _whoami(second) == "sandbox"
        first.write(f"{first.workspace}/open.txt", "readable")
        assert second.execute(f"cat {first.workspace}/open.txt").output == "readable"
    finally:
        first.destroy()
        second.destroy()


@pytest.fixture(scope="module")
def shared_sandbox(vm: SSHVM) -> Iterator[SSHSandbox]:
    with pytest.warns(NotIsolatedWarning):
        sandbox = SSHSandbox.create(SSHSandboxConfig(host=vm.host_config(), isolation="none"))
    with sandbox:
        yield sandbox


class TestSharedUserConformance(SandboxConformance):
    """``isolation='none'`` keeps the whole protocol (the default, isolated mode runs the suite
    in tests/test_ssh.py)."""

    @pytest.fixture
    def backend(self, shared_sandbox: SSHSandbox) -> SSHSandbox:
        return shared_sandbox

    @pytest.fixture
    def base_dir(self, shared_sandbox: SSHSandbox) -> str:
        return shared_sandbox.workspace


def test_sandboxes_have_no_network_not_even_the_vms_loopback(pair: tuple[SSHSandbox, SSHSandbox], vm: SSHVM) -> None:
    """Sandboxes on one VM share its network stack: the image firewalls the pool users, so no
    sandbox reaches a server on the VM (its sshd here, or one another sandbox would start)."""
    first, second = pair
    connect = (
        "python3 -c 'import socket, sys; s = socket.socket(); s.settimeout(5); "
        'sys.exit(s.connect_ex(("127.0.0.1", int(sys.argv[1]))))\' '
    )
    assert second.execute(connect + "22").exit_code != 0
    assert first.execute(connect + "22").exit_code != 0
    login = vm.docker.exec_run(["su", "-s", "/bin/sh", "sandbox", "-c", connect + "22"])
    assert login.exit_code == 0, "the login user (not a sandbox) still reaches the VM's sshd"


def test_a_vm_that_cannot_firewall_its_sandbox_users_refuses_to_start(docker_client: Any) -> None:
    container = docker_client.containers.run(
        SSH_VM_IMAGE,
        detach=True,
        network_mode="none",
        environment={"SSH_AUTHORIZED_KEYS": "ssh-ed25519 AAAA test"},
        labels={"io.sandboxes.test-session": SESSION_OWNER},
    )
    try:
        assert container.wait(timeout=60)["StatusCode"] == 1
        assert b"cannot firewall the sandbox users" in container.logs()
    finally:
        container.remove(force=True)
