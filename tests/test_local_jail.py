"""LocalSandbox's long-lived jail and the exec helper inside it: one jail for commands and file
operations, commands lost or half-sent when it fails, a stopped or dead jail, the fallback to one
jail per command, and its lifecycle: closed with the sandbox, not with the thread that started
it, dead with its owner process, what a killed owner left reaped, and the root removed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
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

from sandboxes import protocol as p
from sandboxes._helper._kill import kill_marked
from sandboxes.local import LocalSandbox, LocalSandboxConfig
from sandboxes.local import _helper as local_helper


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
    """``pid`` and every process below it, from the host's ``/proc``; one that ends while it is
    looked at (a spare shell, an orphan reaped) is listed, without its children."""
    found, queue = [], [pid]
    while queue:
        found.append(current := queue.pop())
        tasks: list[Path] = []
        with contextlib.suppress(OSError):
            tasks = list(Path(f"/proc/{current}/task").glob("*/children"))
        for task in tasks:
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


def test_a_closed_jails_pipes_never_reach_a_pipe_opened_after_them() -> None:
    """A thread still reading or writing a closed jail's stream by number (its reader thread,
    say) sees the end or a failure, never the bytes of a pipe opened since: closing frees no
    number another pipe could take (it took a new jail's hello once, whose start then timed out)."""
    process = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    stream = local_helper.PipeStream(process)
    stream.close()
    read, write = os.pipe()  # the lowest free numbers: a closed stream's, were they freed
    try:
        os.write(write, b"another pipe's")
        assert stream.recv_within(64, 5.0) == b""
        with pytest.raises(BrokenPipeError):
            stream.send(b"a frame")
        assert os.read(read, 64) == b"another pipe's"
    finally:
        os.close(read)
        os.close(write)


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
        assert sandbox.helper_driver.starts.unavailable, "a jail started again and again without its python"


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
        assert sandbox.helper_driver.starts.unavailable, "a python the jail cannot see is tried again"


def test_a_jail_that_failed_to_start_is_tried_again_later(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not given up for the sandbox's life: one jail per command (~13 ms) until the wait is over."""
    with LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap")) as sandbox:
        assert_a_failed_helper_start_is_tried_again_later(sandbox, monkeypatch)


# ---------------------------------------------------------------------- lifecycle


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
