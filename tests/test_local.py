"""LocalSandbox: the full sandbox conformance suite, isolated and not."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mux_faults import (
    assert_a_stopped_helper_cannot_hold_a_big_send,
    assert_an_unanswered_command_runs_once,
    assert_an_unsent_command_is_resent,
    faulty,
)
from support import (
    HAS_BWRAP,
    SHADOWING_MODULES,
    assert_a_failed_helper_start_is_tried_again_later,
    assert_one_kill_ends_forking_trees,
    needs,
    write_shadowing_modules,
)

from sandboxes import _scripts
from sandboxes import protocol as p
from sandboxes._kill import kill_marked
from sandboxes._mux._spawn import SPARES
from sandboxes.composite import CompositeBackend
from sandboxes.local import LocalSandbox, LocalSandboxConfig, NotIsolatedWarning
from sandboxes.local import _helper as local_helper
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


@pytest.fixture(scope="module")
def unisolated_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSandbox]:
    root = tmp_path_factory.mktemp("unisolated")
    with (
        pytest.warns(NotIsolatedWarning, match="NOT isolated"),
        LocalSandbox(config=LocalSandboxConfig(root_dir=root, isolation="none")) as sandbox,
    ):
        yield sandbox


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


# ---------------------------------------------------------------------- limits

LIMITS = {"memory": 256 << 20, "pids": 64, "cpus": 0.5, "disk": 16 << 20}


@pytest.fixture(scope="module")
def limited_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSandbox]:
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
    config = LocalSandboxConfig(root_dir=tmp_path_factory.mktemp("limited"), isolation="bwrap", **LIMITS)
    with LocalSandbox(config=config) as sandbox:
        yield sandbox


def test_a_memory_hog_is_killed_and_reported(limited_sandbox: LocalSandbox) -> None:
    hog = limited_sandbox.execute("python3 -c \"b = b'x' * (1 << 30); print(len(b))\"", timeout=60)
    assert hog.exit_code != 0
    assert str(1 << 30) not in hog.output
    if limited_sandbox._cgroup is not None:  # the kernel says who killed it only with a cgroup
        assert hog.error == p.OUT_OF_MEMORY, hog
    assert limited_sandbox.execute("echo alive").output == "alive\n"


def test_a_fork_bomb_stops_at_the_process_limit(limited_sandbox: LocalSandbox) -> None:
    bomb = limited_sandbox.execute("for i in $(seq 300); do sleep 5 & done; echo all-forked", timeout=30)
    assert "all-forked" not in bomb.output
    assert "fork" in bomb.output.lower()
    cgroup = limited_sandbox._cgroup
    if cgroup is not None:  # none of the bomb's processes outlives it (the jail's helper remains,
        current = Path(cgroup.pids_view[0]) / "pids.current"  # with the shells waiting for commands)
        deadline = time.monotonic() + 10
        while int(current.read_text()) > 3 + SPARES:
            assert time.monotonic() < deadline, f"{current.read_text()} processes left after the bomb"
            time.sleep(0.01)
    assert limited_sandbox.execute("echo alive").output == "alive\n"
    assert subprocess.run(["true"], check=False).returncode == 0  # the host still forks


def test_cpu_bandwidth_is_bounded(limited_sandbox: LocalSandbox) -> None:
    needs(limited_sandbox._cgroup is not None, "no writable cgroup here (CI runs as root: it has one)")
    assert limited_sandbox._cgroup is not None
    # Each spinner burns 0.6 s of CPU, not of wall time: on a loaded machine a wall-clock spinner
    # may get too little CPU to reach the budget, and nothing is throttled (seen in CI runs).
    spin = "python3 -c 'import time\nwhile time.process_time() < 0.6: pass'"
    before = limited_sandbox._cgroup.throttled_periods()
    ran = limited_sandbox.execute(f"{spin} & {spin} & wait", timeout=60)
    assert ran.exit_code == 0
    # 1.2 s of CPU on a budget of half a CPU takes at least 2.4 s, however idle the machine, and
    # the kernel holds the spinners back period after period
    assert ran.duration_ms is not None
    assert ran.duration_ms >= 2000
    assert limited_sandbox._cgroup.throttled_periods() - before > 5


def test_writes_past_the_disk_bound_answer_no_space(limited_sandbox: LocalSandbox) -> None:
    root = limited_sandbox.root
    too_big = limited_sandbox.write(f"{root}/too-big", "x" * (LIMITS["disk"] + 1))
    assert too_big.error == p.NO_SPACE
    first, second = limited_sandbox.upload_files([(f"{root}/a", b"a" * (10 << 20)), (f"{root}/b", b"b" * (10 << 20))])
    assert first.error is None
    assert second.error == p.NO_SPACE
    assert limited_sandbox.download_files([f"{root}/a"])[0].content == b"a" * (10 << 20)
    assert limited_sandbox.download_files([f"{root}/b"])[0].error == p.FILE_NOT_FOUND
    big = limited_sandbox.execute(f"head -c {LIMITS['disk'] * 2} /dev/zero > {root}/by-command")
    assert big.exit_code != 0
    assert (root / "by-command").stat().st_size <= LIMITS["disk"]
    limited_sandbox.delete(f"{root}/a")
    limited_sandbox.delete(f"{root}/by-command")
    assert limited_sandbox.write(f"{root}/fits", "x" * (1 << 20)).error is None


def test_the_cgroup_goes_with_the_sandbox(tmp_path: Path) -> None:
    with LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "r", isolation="bwrap", **LIMITS)) as sandbox:
        cgroup = sandbox._cgroup
        needs(cgroup is not None, "no writable cgroup here (CI runs as root: it has one)")
        assert cgroup is not None
        sandbox.execute("true")
        assert all(directory.is_dir() for directory in cgroup.directories)
    assert not any(directory.exists() for directory in cgroup.directories)


def test_without_a_cgroup_rlimits_bound_memory_and_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where cgroups cannot be written (not root, no delegation), rlimits stand in."""
    monkeypatch.setattr("sandboxes.local.sandbox.Cgroup.create", classmethod(lambda cls, *args, **kwargs: None))
    with LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "r", isolation="bwrap", **LIMITS)) as sandbox:
        assert sandbox._cgroup is None
        hog = sandbox.execute("python3 -c \"b = b'x' * (1 << 30); print(len(b))\"", timeout=60)
        assert hog.exit_code != 0
        assert str(1 << 30) not in hog.output
        bomb = sandbox.execute("for i in $(seq 300); do sleep 5 & done; echo all-forked", timeout=30)
        assert "all-forked" not in bomb.output
        assert sandbox.execute("echo alive").output == "alive\n"


# ---------------------------------------------------------------------- the long-lived jail


@pytest.fixture
def helper_sandbox(tmp_path: Path) -> Iterator[LocalSandbox]:
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
    with LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap")) as sandbox:
        assert sandbox.execute("true").exit_code == 0
        assert sandbox.helper_alive
        yield sandbox


def _jail_pid(sandbox: LocalSandbox) -> int:
    helper = sandbox._helper_process
    assert helper is not None
    return helper.pid


def test_file_operations_and_commands_share_one_jail(helper_sandbox: LocalSandbox) -> None:
    jail = _jail_pid(helper_sandbox)
    root = helper_sandbox.root
    for i in range(10):
        assert helper_sandbox.write(f"{root}/f{i}", str(i)).error is None
        assert helper_sandbox.read(f"{root}/f{i}").error is None
        assert helper_sandbox.execute(f"cat f{i}").output == str(i)
    assert helper_sandbox.ls(str(root)).error is None
    assert _jail_pid(helper_sandbox) == jail
    assert helper_sandbox.helper_alive


def test_a_command_whose_answer_was_lost_is_never_run_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    needs(HAS_BWRAP, "bubblewrap not installed")
    streams = faulty(monkeypatch, local_helper)
    with LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap")) as sandbox:
        assert_an_unanswered_command_runs_once(sandbox, streams, f"{sandbox.root}/ran")


def test_a_command_not_written_whole_is_resent_to_a_new_jail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    needs(HAS_BWRAP, "bubblewrap not installed")
    streams = faulty(monkeypatch, local_helper)
    with LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap")) as sandbox:
        assert_an_unsent_command_is_resent(sandbox, streams, f"{sandbox.root}/ran")


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, from the host's ``/proc``."""
    found, queue = [], [pid]
    while queue:
        found.append(current := queue.pop())
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                queue.extend(int(child) for child in task.read_text().split())
    return found


@pytest.mark.parametrize("what", ["write", "stdin"])
def test_a_stopped_jail_cannot_hold_a_big_write_or_stdin(
    helper_sandbox: LocalSandbox, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    """Closing the client kills the jail, which is what wakes a write blocked on its pipe."""
    jail = _jail_pid(helper_sandbox)
    tree = _descendants(jail)  # bwrap, its init, the helper (a session of its own) and its spares

    def signal_jail(name: str) -> None:
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):  # killed meanwhile: the stall's answer
                os.kill(pid, getattr(signal, f"SIG{name}"))

    assert_a_stopped_helper_cannot_hold_a_big_send(helper_sandbox, monkeypatch, what, signal_jail)
    assert _jail_pid(helper_sandbox) != jail


def _kill_jail(sandbox: LocalSandbox) -> None:
    """Kill the jail and wait until the sandbox has seen its stream end."""
    helper = sandbox._helper_process
    assert helper is not None
    os.killpg(helper.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while helper.client.alive:
        assert time.monotonic() < deadline, "the jail's stream never ended"
        time.sleep(0.01)


def test_a_jail_that_died_is_restarted_transparently(helper_sandbox: LocalSandbox) -> None:
    jail = _jail_pid(helper_sandbox)
    _kill_jail(helper_sandbox)
    assert helper_sandbox.execute("echo back").output == "back\n"
    assert helper_sandbox.helper_alive
    assert _jail_pid(helper_sandbox) != jail


def test_python_files_in_the_root_do_not_shadow_the_helper(helper_sandbox: LocalSandbox) -> None:
    """A jail restarted in a root holding ``json.py`` (the helper's working directory): it
    starts (isolated python), so commands do not fall back to a jail each."""
    root = str(helper_sandbox.root)
    write_shadowing_modules(helper_sandbox, root)
    try:
        jail = _jail_pid(helper_sandbox)
        _kill_jail(helper_sandbox)
        assert helper_sandbox.execute("echo back").output == "back\n"
        assert helper_sandbox.helper_alive, "the jail's helper did not start again"
        assert _jail_pid(helper_sandbox) != jail
    finally:
        for name in SHADOWING_MODULES:
            helper_sandbox.delete(f"{root}/{name}.py")


def test_a_command_whose_jail_dies_answers_connection_lost(helper_sandbox: LocalSandbox) -> None:
    root = helper_sandbox.root
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(helper_sandbox.execute, f"touch {root}/started; sleep 60", timeout=120)
        deadline = time.monotonic() + 30
        while not (root / "started").exists():
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.01)
        _kill_jail(helper_sandbox)
        lost = running.result(timeout=30)
    assert lost.error == p.CONNECTION_LOST
    assert lost.exit_code is None
    assert helper_sandbox.execute("echo next").output == "next\n"


def test_without_python_in_the_jail_it_falls_back_to_one_jail_per_command(tmp_path: Path) -> None:
    config = LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap", helper_python="/nonexistent/python3")
    with LocalSandbox(config=config) as sandbox:
        assert sandbox.execute("echo fallback").output == "fallback\n"
        assert not sandbox.helper_alive
        assert sandbox.write(f"{sandbox.root}/f", "x").error is None
        assert sandbox.execute("cat f; id -u").output == "x1000\n"
        assert sandbox.execute("sleep 5", timeout=1).error == p.TIMEOUT
        assert sandbox._starts.unavailable, "a jail started again and again without its python"


def test_a_helper_python_outside_the_jail_is_given_up_for_good(tmp_path: Path) -> None:
    """A python this machine has but the jail does not see (a virtualenv's, here a link beside
    the root): the jail's own shell says it is missing, so the sandbox stops trying at once,
    not every 30 s for its life."""
    outside = tmp_path / "elsewhere" / "python3"
    outside.parent.mkdir()
    outside.symlink_to(sys.executable)
    config = LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap", helper_python=str(outside))
    with LocalSandbox(config=config) as sandbox:
        assert sandbox.execute("echo alone").output == "alone\n"
        assert not sandbox.helper_alive
        assert sandbox._starts.unavailable, "a python the jail cannot see is tried again"


def test_a_jail_that_failed_to_start_is_tried_again_later(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not given up for the sandbox's life: one jail per command (~13 ms) until the wait is over."""
    with LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap")) as sandbox:
        assert_a_failed_helper_start_is_tried_again_later(sandbox, monkeypatch)


def test_an_entry_gone_while_it_was_listed_leaves_the_listing_standing(tmp_path: Path) -> None:
    """`sandboxes._scripts.LS` lists the names, then ``exec``s one ``stat`` for them all; an entry
    removed in between makes ``stat`` exit 1 (`EXIT_LS_VANISHED`): the listing is still an
    answer, not a backend error. The race is made, not waited for: a ``stat`` first in PATH
    removes the entry, then runs the real one."""
    shims, root = tmp_path / "shims", tmp_path / "root"
    shims.mkdir()
    (shims / "stat").write_text('#!/bin/sh\nrm -f -- "$GONE"\nexec /usr/bin/stat "$@"\n')
    (shims / "stat").chmod(0o755)
    (root / "d").mkdir(parents=True)
    for name in ("a", "b", ".c"):
        (root / "d" / name).write_text(name)
    env = {"PATH": f"{shims}:/usr/bin:/bin", "GONE": str(root / "d" / "b")}
    with pytest.warns(NotIsolatedWarning):
        sandbox = LocalSandbox(config=LocalSandboxConfig(root_dir=root, isolation="none", env=env))
    with sandbox:
        listed = sandbox.ls(str(root / "d"))
        assert listed.error is None, listed
        assert [e.path.rsplit("/", 1)[1] for e in listed.entries or []] == [".c", "a", "b"]
        assert not (root / "d" / "b").exists(), "the shim did not run: no race was made"


def test_a_listing_past_the_argument_limit_still_answers(tmp_path: Path) -> None:
    """Names over the kernel's argument limit (~2 MiB here): `sandboxes._scripts.LS` cannot
    ``exec`` its ``stat`` for them (status 126 would end the script), so it runs it as a child,
    whose failure leaves the listing, without sizes. Over 64 KiB of names the native ls hands
    a directory to the script, so this is the path a big directory takes everywhere."""
    directory = tmp_path / "root" / "big"
    directory.mkdir(parents=True)
    for i in range(12000):
        (directory / f"f{i:0200}").touch()
    with pytest.warns(NotIsolatedWarning):
        sandbox = LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "root", isolation="none"))
    with sandbox:
        listed = sandbox.ls(str(directory))
        assert listed.error is None, listed.message
        assert len(listed.entries or []) == 12000


def test_a_jail_that_could_not_start_is_not_an_empty_listing(tmp_path: Path) -> None:
    """bwrap's own failures exit 1 (a full pids limit: "Creating new namespace failed"), as the
    listing's ``stat`` does when an entry vanished: before any record, it is an error."""
    config = LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap", use_exec_helper=False)
    with tempfile.TemporaryDirectory(prefix="fake-bwrap-") as shared, LocalSandbox(config=config) as sandbox:
        fake = Path(shared) / "bwrap"  # where the jail's launcher may read it, unlike tmp_path (0700)
        fake.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: Resource temporarily' >&2\nexit 1\n")
        fake.chmod(0o755)
        Path(shared).chmod(0o755)
        (sandbox.root / "a").write_text("a")
        assert [e.path for e in sandbox.ls(str(sandbox.root)).entries or []] == [f"{sandbox.root}/a"]
        assert sandbox._jail is not None
        sandbox._jail.bwrap = str(fake)
        listed = sandbox.ls(str(sandbox.root))
        assert listed.error == p.BACKEND_ERROR, listed


@pytest.mark.parametrize("umask", [0o027, 0o077, 0o002])
def test_the_scripts_give_a_new_file_the_mode_of_the_shells_umask(unisolated_sandbox: LocalSandbox, umask: int) -> None:
    """A new target gets the mode of the writing shell's umask: a write and an upload from
    their temporary file's (no ``$(umask)``), a staged file's commit from its own ``$(umask)``,
    whatever mode the staged file was made with (Kubernetes' tar: 0644). Each in a shell whose
    umask is not the default."""
    directory = unisolated_sandbox.root / f"umask-{umask:03o}"
    directory.mkdir()
    data = b"hello"
    staged = f"{directory}/.staged"
    steps = [
        (_scripts.command(_scripts.WRITE, f"{directory}/written", str(len(data)), "w"), data),
        (_scripts.command(_scripts.UPLOAD, "u", f"{directory}/uploaded", str(len(data))), data),
        (_scripts.command(_scripts.STAGE_CHUNK, staged, "new") + f'\nchmod 644 "{staged}"', data),  # as tar makes it
        (_scripts.command(_scripts.COMMIT_STAGED, staged, f"{directory}/committed", str(len(data))), None),
    ]
    for command, stdin in steps:
        done = unisolated_sandbox.execute(f"umask {umask:03o}\n{command}", stdin=stdin, env={"nm": "777"})
        assert done.exit_code == 0, done
        assert done.output.strip("0\n") == "", done  # the per-file statuses, all 0
    for name in ("written", "uploaded", "committed"):
        assert (directory / name).read_bytes() == data
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o666 & ~umask, name


def test_close_ends_the_jail(tmp_path: Path) -> None:
    sandbox = LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap"))
    sandbox.execute("true")
    jail = _jail_pid(sandbox)
    sandbox.close()
    with pytest.raises(ProcessLookupError):
        os.kill(jail, 0)
    assert sandbox.execute("true").error == p.UNAVAILABLE  # and no new jail starts
    assert sandbox._helper_process is None


def test_a_jail_started_by_a_passing_thread_outlives_that_thread(tmp_path: Path) -> None:
    """bwrap's --die-with-parent fires when the THREAD that spawned it exits: the long-lived jail,
    started by whichever worker thread needed it first (a tool call in an agent's pool), must not
    die with that thread and take the next command with it."""
    sandbox = LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap"))
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:  # both workers exit when the block ends
            writes = list(pool.map(lambda n: sandbox.write(f"{sandbox.root}/{n}.txt", n), ["a", "b"]))
        assert [w.error for w in writes] == [None, None]
        jail = _jail_pid(sandbox)
        assert sandbox.execute("cat a.txt b.txt").output == "ab"
        assert _jail_pid(sandbox) == jail, "the jail was restarted"
    finally:
        sandbox.close()


def test_the_jail_ends_with_the_process_that_started_it(tmp_path: Path) -> None:
    """The jail still dies with the process that started it (kill -9, no cleanup at all)."""
    script = (
        "import sys; from sandboxes.local import LocalSandbox, LocalSandboxConfig\n"
        "s = LocalSandbox(config=LocalSandboxConfig(root_dir=sys.argv[1], isolation='bwrap'))\n"
        "s.execute('true'); print(s._helper_process.process.pid, flush=True); sys.stdin.read()\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "root")], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert owner.stdout is not None
    jail = int(owner.stdout.readline())
    os.kill(jail, 0)
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(jail, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(jail, os.WNOHANG)
        time.sleep(0.05)
    pytest.fail("the jail outlived the process that started it")


def test_what_a_killed_owner_left_is_removed_by_the_next_process(tmp_path: Path) -> None:
    """A process SIGKILLed with a sandbox open leaves its state dir (private /tmp, /etc files)
    and its cgroup; the next process to start a jail removes both, and only those."""
    import sandboxes.local.sandbox as local_sandbox

    script = (
        "import sys; from sandboxes.local import LocalSandbox, LocalSandboxConfig\n"
        "s = LocalSandbox(config=LocalSandboxConfig(root_dir=sys.argv[1], isolation='bwrap', memory=256 << 20))\n"
        "s.execute('true'); c = s._cgroup\n"
        "print(s._jail.state, *(c.directories if c else []), flush=True); sys.stdin.read()\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "root")], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert owner.stdout is not None
    state, *cgroups = (Path(word) for word in owner.stdout.readline().decode().split())
    live = LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "live", isolation="bwrap"))
    try:
        owner.kill()
        owner.wait()
        assert state.is_dir()
        if os.geteuid() == 0:  # root writes cgroups here (CI does): the leak to repair
            assert cgroups
            assert all(c.is_dir() for c in cgroups)
        local_sandbox._reaped.clear()  # as if this were a new process
        with LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "next", isolation="bwrap")) as fresh:
            assert fresh.execute("echo ok").output == "ok\n"
        assert not state.exists()
        assert not any(c.exists() for c in cgroups)
        assert (tmp_path / "root").is_dir(), "a sandbox's root is its caller's"
        assert live.execute("echo alive").output == "alive\n", "a live process's sandbox was touched"
        assert live._jail is not None
        assert live._jail.state.is_dir()
    finally:
        live.close()


def test_one_kill_ends_a_tree_that_keeps_forking_in_the_jail(helper_sandbox: LocalSandbox) -> None:
    """The service's kill of a local command: one `kill_marked` from the host, which sees the
    jail's processes (the helper takes the caller's marker as the command's own)."""
    assert_one_kill_ends_forking_trees(helper_sandbox, kill_marked)


def test_a_tree_deeper_than_the_recursion_limit_is_removed(tmp_path: Path) -> None:
    """A sandbox may nest directories past Python's recursion limit (``shutil.rmtree`` recursed
    per level before 3.13): its root is still removed, links inside are not followed, and a
    directory it made unreadable does not stop the removal."""
    from sandboxes.local._tree import remove_tree

    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    root = tmp_path / "root"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(1200):  # one level at a time: paths this long exceed what path calls take
            os.mkdir("d", dir_fd=fd)
            fd, parent = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
            os.close(parent)
        os.symlink(outside, "link", dir_fd=fd)
        os.mkdir("locked", dir_fd=fd)
        os.close(os.open("locked/f", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
        os.chmod("locked", 0, dir_fd=fd)
    finally:
        os.close(fd)
    remove_tree(root)
    assert not root.exists()
    assert outside.read_text() == "keep"
