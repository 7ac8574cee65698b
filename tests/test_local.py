"""LocalSandbox: the full sandbox conformance suite, isolated and not, and what the jail keeps
from its commands: writes outside the root and private /tmp, the host's root-only files, the
/etc secrets, nested user namespaces and dangerous syscalls."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import HAS_BWRAP, needs

from sandboxes import protocol as p
from sandboxes.composite import CompositeBackend
from sandboxes.local import LocalSandbox, LocalSandboxConfig
from sandboxes.state import StateBackend
from sandboxes.testing import SandboxConformance


@pytest.fixture(scope="module", params=["exec-helper", "exec-helper-scripted-writes", "jail-per-command"])
def isolated_sandbox(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalSandbox]:
    """Every way commands and writes run: through the long-lived jail's exec helper (writes
    done by the helper itself), the same with writes forced through the scripts, and the
    fallback of one jail per command. Every test of the isolated sandbox runs on each."""
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed: the isolated LocalSandbox is not testable")
    helper = request.param != "jail-per-command"
    root = tmp_path_factory.mktemp("isolated")
    with LocalSandbox(config=LocalSandboxConfig(root_dir=root, isolation="bwrap", use_exec_helper=helper)) as sb:
        sb.native_file_ops = request.param == "exec-helper"
        assert sb.execute("true").exit_code == 0
        assert sb.helper_alive == helper
        yield sb


class TestIsolatedLocalSandbox(SandboxConformance):
    @pytest.fixture
    def backend(self, isolated_sandbox: LocalSandbox) -> LocalSandbox:
        return isolated_sandbox

    @pytest.fixture
    def base_dir(self, isolated_sandbox: LocalSandbox) -> str:
        return str(isolated_sandbox.root)


class TestUnisolatedLocalSandbox(SandboxConformance):
    """Without bubblewrap the sandbox must be just as correct, only not isolated."""

    @pytest.fixture
    def backend(self, unisolated_sandbox: LocalSandbox) -> LocalSandbox:
        return unisolated_sandbox

    @pytest.fixture
    def base_dir(self, unisolated_sandbox: LocalSandbox) -> str:
        return str(unisolated_sandbox.root)


# ---------------------------------------------------------------------- what is writable


@pytest.mark.parametrize("path", ["/work/a.txt", "/opt/a.txt", "/a.txt", "/home/a.txt", "/var/a.txt", "/etc/a.txt"])
def test_writes_outside_the_root_and_tmp_are_refused(isolated_sandbox: LocalSandbox, path: str) -> None:
    """The jail's / is a throwaway tmpfs: a write there must not answer success and vanish."""
    assert isolated_sandbox.write(path, "lost?").error == p.PERMISSION_DENIED
    assert isolated_sandbox.upload_files([(path, b"lost?")])[0].error == p.PERMISSION_DENIED
    assert isolated_sandbox.execute(f"echo x > {path}").exit_code != 0


def test_writes_through_a_composite_are_refused_outside_the_root(isolated_sandbox: LocalSandbox) -> None:
    composite = CompositeBackend.create(isolated_sandbox, {"/memories/": StateBackend()})
    assert composite.write("/work/a.txt", "lost?").error == p.PERMISSION_DENIED
    kept = f"{isolated_sandbox.root}/composite.txt"
    assert composite.write(kept, "kept").error is None
    assert composite.download_files([kept])[0].content == b"kept"


def test_the_root_and_private_tmp_stay_writable(isolated_sandbox: LocalSandbox) -> None:
    for path in (f"{isolated_sandbox.root}/deep/w.txt", "/tmp/deep/w.txt"):
        assert isolated_sandbox.write(path, "w").error is None
        assert isolated_sandbox.download_files([path])[0].content == b"w"


# ---------------------------------------------------------------------- started by root

as_root = pytest.mark.needs(os.geteuid() == 0, "the attacked case is a sandbox started by root (CI runs as root)")


@as_root
def test_root_only_host_files_stay_unreadable(isolated_sandbox: LocalSandbox, tmp_path: Path) -> None:
    """uid 1000 inside must not be uid 0 outside: a root-only file a bind exposes stays closed
    (here below pytest's root-only temporary directory, which the bind reaches all the same)."""
    secret_dir = tmp_path / "exposed"
    secret_dir.mkdir()
    (secret_dir / "secret").write_text("root only\n")
    os.chmod(secret_dir / "secret", 0o600)
    config = isolated_sandbox.config.model_copy(update={"extra_ro_binds": (secret_dir,), "sandbox_id": None})
    with LocalSandbox(config=config) as sandbox:
        assert sandbox.execute(f"ls {secret_dir}").output == "secret\n"  # the bind is there
        result = sandbox.execute(f"cat {secret_dir}/secret")
        assert result.exit_code != 0
        assert "root only" not in result.output
    in_root = isolated_sandbox.root / "root-only"
    in_root.write_text("root only\n")
    os.chown(in_root, 0, 0)
    os.chmod(in_root, 0o600)
    result = isolated_sandbox.execute(f"cat {in_root}")
    assert result.exit_code != 0
    assert "root only" not in result.output


@as_root
def test_processes_and_files_of_a_root_started_jail_are_not_root_on_the_host(isolated_sandbox: LocalSandbox) -> None:
    assert isolated_sandbox.host_ids[0] != 0
    assert isolated_sandbox.execute("id -u").output.strip() == "1000"
    made = isolated_sandbox.execute(f"echo x > {isolated_sandbox.root}/by-command")
    assert made.exit_code == 0
    assert (isolated_sandbox.root / "by-command").stat().st_uid == isolated_sandbox.host_ids[0]
    pid = isolated_sandbox.execute("sleep 0.1 & cat /proc/self/stat >/dev/null; echo ok")
    assert pid.output == "ok\n"


@as_root
def test_files_the_caller_puts_in_the_root_become_the_jails(isolated_sandbox: LocalSandbox) -> None:
    """The service extracts archives as root; claimed, they are the jail's to change."""
    placed = isolated_sandbox.root / "placed" / "f.txt"
    placed.parent.mkdir()
    placed.write_text("from the caller\n")
    isolated_sandbox.claim(placed.parent)
    assert isolated_sandbox.execute(f"echo more >> {placed} && rm {placed}").exit_code == 0
    assert isolated_sandbox.write(str(placed), "again").error is None
    assert placed.read_text() == "again"  # and the caller reads what the jail wrote


def test_a_search_from_the_top_skips_the_jails_device_files(isolated_sandbox: LocalSandbox) -> None:
    """bubblewrap's ``/dev`` holds the host's devices bind-mounted over plain files, which
    ``find -type f`` lists: a grep from ``/`` (an agent's grep with no path) read ``/dev/zero``
    until its 300 s timeout. A walk from above skips ``/proc``, ``/sys`` and ``/dev``."""
    timeout = isolated_sandbox.operation_timeout
    isolated_sandbox.operation_timeout = 60
    try:
        started = time.monotonic()
        found = isolated_sandbox.grep("x", path="/", glob="zero")
        assert found.error is None, found
        assert found.matches == []
        assert time.monotonic() - started < 30
    finally:
        isolated_sandbox.operation_timeout = timeout


def test_secrets_of_etc_are_not_in_the_jail(isolated_sandbox: LocalSandbox) -> None:
    for path in ("/etc/shadow", "/etc/gshadow", "/etc/docker", "/etc/ssh", "/etc/sudoers", "/etc/subuid"):
        assert isolated_sandbox.execute(f"test -e {path}").exit_code == 1, path
    passwd = isolated_sandbox.execute("cat /etc/passwd").output
    assert "sandbox:x:1000:1000" in passwd
    assert len(passwd.splitlines()) == 3
    assert isolated_sandbox.execute("sh -c 'ls /usr/bin >/dev/null && python3 -c \"print(1)\"'").output == "1\n"


def test_nested_user_namespaces_are_disabled(isolated_sandbox: LocalSandbox) -> None:
    assert isolated_sandbox.execute("unshare -r true").exit_code != 0
    assert isolated_sandbox.execute("unshare -U true").exit_code != 0
    assert isolated_sandbox.execute("true").exit_code == 0


KEYCTL_SESSION = """
import ctypes, os, platform
nr = {"x86_64": 250, "aarch64": 219}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
print(libc.syscall(nr, 0, -3, 0), ctypes.get_errno())
"""


def test_a_seccomp_filter_refuses_dangerous_syscalls(isolated_sandbox: LocalSandbox) -> None:
    status = isolated_sandbox.execute("grep '^Seccomp:' /proc/self/status").output
    assert status.split() == ["Seccomp:", "2"]
    # keyctl(KEYCTL_GET_KEYRING_ID, session): allowed for any process without the filter
    assert isolated_sandbox.execute("python3 -", stdin=KEYCTL_SESSION).output.split() == ["-1", str(errno.EPERM)]


@as_root
def test_a_root_below_root_only_directories_works(tmp_path: Path) -> None:
    """bwrap resolves bind sources as the jail's unprivileged uid; /root and pytest's own
    temporary directories are closed to it, and the sandbox must work there all the same."""
    os.chmod(tmp_path, 0o700)
    with LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap")) as sandbox:
        assert sandbox.write(f"{sandbox.root}/f", "x").error is None
        assert sandbox.execute("cat f").output == "x"
