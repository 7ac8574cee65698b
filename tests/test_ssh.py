"""SSHSandbox against a real sshd (the `sandboxes/ssh-vm` image, on loopback): the full
conformance suite through the exec helper and through one ``exec_command`` per command, then
what happens when the host goes away, restarts, freezes, or is not who it claims to be."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest
from mux_faults import (
    assert_a_stopped_helper_cannot_hold_a_big_send,
    assert_an_unanswered_command_runs_once,
    assert_an_unsent_command_is_resent,
    faulty,
)
from native_listings import assert_ls_and_delete_go_native, assert_native_listings_match_the_scripts
from native_searches import assert_native_searches_match_the_scripts
from native_writes import assert_file_ops_go_native, assert_native_writes_match_the_scripts
from ssh_fixtures import SSHVM, free_port, new_key, start_vm, write_known_hosts
from support import assert_command_marker_never_waits_for_the_helper_lock, assert_one_kill_ends_forking_trees

from sandboxes import _scripts
from sandboxes import protocol as p
from sandboxes._helper._kill import KILL_MARKED_SH
from sandboxes.local import NotIsolatedWarning
from sandboxes.ssh import (
    SSHAuthenticationError,
    SSHHostConfig,
    SSHHostKeyError,
    SSHSandbox,
    SSHSandboxConfig,
    SSHUnreachableError,
    UserPoolError,
)
from sandboxes.ssh import sandbox as ssh_sandbox
from sandboxes.testing import SandboxConformance


@pytest.fixture(scope="module")
def ssh_vm(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHVM]:
    """The VM every non-destructive test shares."""
    vm = start_vm(tmp_path_factory.mktemp("ssh"))
    yield vm
    vm.stop()


@pytest.fixture
def fault_vm(docker_client: Any, tmp_path: Path) -> Iterator[SSHVM]:
    """A VM of its own, for tests that restart, kill or freeze it."""
    vm = start_vm(tmp_path)
    yield vm
    vm.stop()


@pytest.fixture(scope="module")
def helper_sandbox(ssh_vm: SSHVM) -> Iterator[SSHSandbox]:
    with SSHSandbox.create(SSHSandboxConfig(host=ssh_vm.host_config())) as sandbox:
        yield sandbox


@pytest.fixture(scope="module")
def fallback_sandbox(ssh_vm: SSHVM) -> Iterator[SSHSandbox]:
    with SSHSandbox.create(SSHSandboxConfig(host=ssh_vm.host_config(), use_exec_helper=False)) as sandbox:
        yield sandbox


class TestSSHSandboxConformance(SandboxConformance):
    @pytest.fixture
    def backend(self, helper_sandbox: SSHSandbox) -> SSHSandbox:
        return helper_sandbox

    @pytest.fixture
    def base_dir(self, helper_sandbox: SSHSandbox) -> str:
        return helper_sandbox.workspace

    def test_commands_go_through_the_exec_helper(self, helper_sandbox: SSHSandbox) -> None:
        assert helper_sandbox.execute("true").exit_code == 0
        assert helper_sandbox.helper_driver.mux is not None
        assert helper_sandbox.helper_driver.mux.alive
        assert not helper_sandbox.helper_driver.starts.unavailable

    def test_the_marker_for_a_command_never_waits_for_a_helper_start(self, helper_sandbox: SSHSandbox) -> None:
        assert_command_marker_never_waits_for_the_helper_lock(helper_sandbox)

    def test_file_ops_go_through_the_exec_helper_natively(self, helper_sandbox: SSHSandbox) -> None:
        assert_file_ops_go_native(helper_sandbox, helper_sandbox.workspace)


class TestSSHScriptedWritesConformance(SandboxConformance):
    """The exec helper with its native file ops turned off: every file op runs its script."""

    @pytest.fixture
    def backend(self, helper_sandbox: SSHSandbox) -> Iterator[SSHSandbox]:
        helper_sandbox.native_file_ops = False
        yield helper_sandbox
        helper_sandbox.native_file_ops = True

    @pytest.fixture
    def base_dir(self, helper_sandbox: SSHSandbox) -> str:
        return helper_sandbox.workspace


def test_native_writes_answer_what_the_scripts_answer(helper_sandbox: SSHSandbox, ssh_vm: SSHVM) -> None:
    def make_foreign(path: str) -> None:  # root's, on the VM
        script = 'printf "someone else\'s\\n" > "$1" && chmod 666 "$1"'
        made = ssh_vm.docker.exec_run(["sh", "-c", script, "sh", path], user="root")
        assert made.exit_code == 0, made.output

    assert_native_writes_match_the_scripts(helper_sandbox, helper_sandbox.workspace, make_foreign)


def test_native_searches_answer_what_the_scripts_answer(helper_sandbox: SSHSandbox) -> None:
    assert_native_searches_match_the_scripts(helper_sandbox, helper_sandbox.workspace)


def test_native_listings_answer_what_the_scripts_answer(helper_sandbox: SSHSandbox) -> None:
    assert_native_listings_match_the_scripts(helper_sandbox, helper_sandbox.workspace)


def test_ls_and_delete_go_through_the_exec_helper_natively(helper_sandbox: SSHSandbox) -> None:
    assert_ls_and_delete_go_native(helper_sandbox, helper_sandbox.workspace)


def test_execute_streaming_hands_output_over_live(helper_sandbox: SSHSandbox, fallback_sandbox: SSHSandbox) -> None:
    """Through the exec helper stdout and stderr apart; on a channel of its own, merged (one
    pipe for both); either way a line printed before a pause arrives during it."""
    for sandbox, expected in (
        (helper_sandbox, {"stdout": b"out\ndone\n", "stderr": b"err\n"}),
        (fallback_sandbox, {"merged": b"out\nerr\ndone\n"}),
    ):
        seen: list[tuple[float, bytes, str]] = []
        command = "echo out; echo err >&2; sleep 2; echo done"
        response = sandbox.execute_streaming(
            command, lambda chunk, name, seen=seen: seen.append((time.monotonic(), chunk, name))
        )
        ended = time.monotonic()
        assert (response.exit_code, response.error) == (0, None), response
        got: dict[str, bytes] = {}
        for _, chunk, name in seen:
            got[name] = got.get(name, b"") + chunk
        assert got.keys() == expected.keys(), seen
        assert all(sorted(got[name].splitlines()) == sorted(expected[name].splitlines()) for name in got), seen
        assert ended - seen[0][0] >= 1, "the line printed before the pause arrived only with the exit"


class TestSSHFallbackConformance(SandboxConformance):
    """``use_exec_helper=False``: every command is its own ``exec_command`` (`SSHSandbox.run_alone`)."""

    @pytest.fixture
    def backend(self, fallback_sandbox: SSHSandbox) -> SSHSandbox:
        return fallback_sandbox

    @pytest.fixture
    def base_dir(self, fallback_sandbox: SSHSandbox) -> str:
        return fallback_sandbox.workspace

    def test_no_helper_is_used(self, fallback_sandbox: SSHSandbox) -> None:
        assert fallback_sandbox.execute("echo ok").output == "ok\n"
        assert fallback_sandbox.helper_driver.starts.unavailable
        assert fallback_sandbox.helper_driver.mux is None


# ---------------------------------------------------------------------------------- helpers


def _in_thread(call: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        box["result"] = call()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def _wait_for_file(sandbox: SSHSandbox, path: str, deadline: float = 10.0) -> str:
    """Content of ``path`` once a concurrently running command has written it."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        result = sandbox.read(path)
        if result.file_data is not None and result.file_data.content:
            return result.file_data.content
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def _fast_failing(vm: SSHVM, **overrides: Any) -> SSHSandboxConfig:
    """Short connect timeouts and a single reconnect attempt, so outages answer in seconds."""
    settings: dict[str, Any] = {"connect_timeout": 2.0, "reconnect_attempts": 2, **overrides}
    return SSHSandboxConfig(host=vm.host_config(**settings))


# ---------------------------------------------------------------------------------- outages


def test_restart_between_operations_reconnects(fault_vm: SSHVM) -> None:
    """sshd restarts (same port, same host key): the next read reconnects transparently."""
    with SSHSandbox.create(_fast_failing(fault_vm)) as sandbox:
        path = f"{sandbox.workspace}/kept.txt"
        assert sandbox.write(path, "survives\n").error is None
        assert sandbox.execute("true").exit_code == 0
        before = sandbox._connection.transport()

        fault_vm.docker.restart(timeout=1)
        fault_vm.wait_for_sshd()

        result = sandbox.read(path)
        assert result.error is None
        assert result.file_data is not None
        assert result.file_data.content == "survives\n"
        listing = sandbox.ls(sandbox.workspace)
        assert [entry.path for entry in listing.entries or []] == [path]
        after = sandbox._connection.transport()
        assert after is not before
        assert not before.is_active()
        assert sandbox.execute("echo again").output == "again\n"


def test_command_sent_while_host_is_down_never_runs(fault_vm: SSHVM) -> None:
    """A command that cannot reach the host answers ``unavailable`` (it never left), within the
    reconnect budget, and does not run later when the host is back."""
    with SSHSandbox.create(_fast_failing(fault_vm)) as sandbox:
        log = f"{sandbox.workspace}/log"
        assert sandbox.execute("true").exit_code == 0
        fault_vm.docker.stop(timeout=1)

        started = time.monotonic()
        result = sandbox.execute(f"echo once >> {log}")
        assert result.error == p.UNAVAILABLE
        assert result.exit_code is None
        assert "127.0.0.1" in (result.message or "")
        assert time.monotonic() - started < 15
        assert sandbox.write(log, "x").error == p.UNAVAILABLE

        fault_vm.docker.start()
        fault_vm.wait_for_sshd()
        assert sandbox.read(log).error == p.FILE_NOT_FOUND
        assert sandbox.execute(f"echo once >> {log}").exit_code == 0
        assert sandbox.read(log).file_data is not None
        assert sandbox.execute(f"cat {log}").output == "once\n"


@pytest.mark.parametrize("use_exec_helper", [True, False], ids=["helper", "exec-per-command"])
def test_command_across_restart_is_lost_not_repeated(fault_vm: SSHVM, use_exec_helper: bool) -> None:
    """A command that was running when sshd restarted answers ``connection_lost`` and is not
    retried: the line it appended is there exactly once."""
    config = _fast_failing(fault_vm, keepalive=0)
    with SSHSandbox.create(config.model_copy(update={"use_exec_helper": use_exec_helper})) as sandbox:
        log = f"{sandbox.workspace}/log"
        thread, box = _in_thread(lambda: sandbox.execute(f"echo once >> {log}; sleep 30"))
        assert _wait_for_file(sandbox, log) == "once\n"

        fault_vm.docker.restart(timeout=1)
        thread.join(15)
        assert not thread.is_alive(), "the command outlived its connection"
        assert box["result"].error == p.CONNECTION_LOST
        assert box["result"].exit_code is None

        fault_vm.wait_for_sshd()
        assert sandbox.execute(f"cat {log}").output == "once\n"


def test_a_command_whose_answer_was_lost_is_never_run_twice(ssh_vm: SSHVM, monkeypatch: pytest.MonkeyPatch) -> None:
    streams = faulty(monkeypatch, ssh_sandbox)
    with SSHSandbox.create(SSHSandboxConfig(host=ssh_vm.host_config())) as sandbox:
        assert_an_unanswered_command_runs_once(sandbox, streams, f"{sandbox.workspace}/ran")


def test_a_command_not_written_whole_is_resent_to_a_new_helper(ssh_vm: SSHVM, monkeypatch: pytest.MonkeyPatch) -> None:
    streams = faulty(monkeypatch, ssh_sandbox)
    with SSHSandbox.create(SSHSandboxConfig(host=ssh_vm.host_config())) as sandbox:
        assert_an_unsent_command_is_resent(sandbox, streams, f"{sandbox.workspace}/ran")


@pytest.mark.parametrize("what", ["write", "stdin"])
def test_a_stopped_helper_cannot_hold_a_big_write_or_stdin(
    ssh_vm: SSHVM, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    """Closing the client closes the helper's channel, which wakes paramiko's blocked send."""
    with SSHSandbox.create(SSHSandboxConfig(host=ssh_vm.host_config())) as sandbox:
        assert sandbox.execute("true").exit_code == 0
        assert sandbox.helper_driver.mux is not None
        pid = str(sandbox.helper_driver.mux.info["pid"])

        def signal_helper(name: str) -> None:
            assert ssh_vm.docker.exec_run(["kill", f"-{name}", pid]).exit_code == 0

        assert_a_stopped_helper_cannot_hold_a_big_send(sandbox, monkeypatch, what, signal_helper)


@pytest.mark.parametrize("use_exec_helper", [True, False], ids=["helper", "exec-per-command"])
def test_container_killed_mid_command(fault_vm: SSHVM, use_exec_helper: bool) -> None:
    """The host dies under a running command: it answers ``connection_lost`` promptly, later
    commands answer ``unavailable``, and nothing raises."""
    config = _fast_failing(fault_vm, keepalive=0).model_copy(update={"use_exec_helper": use_exec_helper})
    sandbox = SSHSandbox.create(config)
    try:
        marker = f"{sandbox.workspace}/running"
        thread, box = _in_thread(lambda: sandbox.execute(f"echo yes > {marker}; sleep 30"))
        _wait_for_file(sandbox, marker)

        started = time.monotonic()
        fault_vm.docker.kill()
        thread.join(15)
        assert not thread.is_alive(), "execute hung after the host died"
        assert time.monotonic() - started < 15
        assert box["result"].error == p.CONNECTION_LOST

        after = sandbox.execute("true")
        assert after.error == p.UNAVAILABLE
        assert sandbox.read(marker).error == p.UNAVAILABLE
    finally:
        sandbox.close()
    assert sandbox.execute("true").error == p.UNAVAILABLE  # closed: an answer, not an exception


def test_frozen_host_is_detected_by_keepalive(fault_vm: SSHVM) -> None:
    """A frozen host (``docker pause``: TCP stays up, nothing answers) is declared dead after
    ``keepalive * keepalive_count_max`` seconds without a reply, instead of the command hanging
    until its timeout plus the exec helper's grace (and the caller forever without a timeout).

    - a command running when the host froze: ``connection_lost`` (it was running);
    - a command sent to the frozen host: ``connection_lost`` too, not ``unavailable``: it was
      sent, and the host may still run it once it thaws;
    - a command while it stays frozen: ``unavailable`` (the reconnect gets no SSH greeting);
    - after ``docker unpause`` the sandbox works again on a new connection."""
    config = _fast_failing(fault_vm, keepalive=0.5, keepalive_count_max=4, reconnect_attempts=1)
    with SSHSandbox.create(config) as sandbox:
        assert sandbox.execute("true").exit_code == 0
        thread, box = _in_thread(lambda: sandbox.execute("sleep 30", timeout=60))
        time.sleep(0.3)
        fault_vm.docker.pause()
        try:
            started = time.monotonic()
            thread.join(15)
            assert not thread.is_alive()
            assert box["result"].error == p.CONNECTION_LOST
            assert time.monotonic() - started < 10

            started = time.monotonic()
            assert sandbox.execute("echo hi", timeout=2).error == p.UNAVAILABLE
            assert time.monotonic() - started < 10
        finally:
            fault_vm.docker.unpause()
        assert sandbox.execute("echo back").output == "back\n"

        fault_vm.docker.pause()
        try:
            started = time.monotonic()
            sent = sandbox.execute("echo hi", timeout=2)
            assert sent.error == p.CONNECTION_LOST
            assert time.monotonic() - started < 10
        finally:
            fault_vm.docker.unpause()
        assert sandbox.execute("echo back").output == "back\n"


# ---------------------------------------------------------------------------------- connecting


def test_wrong_key_is_refused_fast(ssh_vm: SSHVM, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused at the first attempt: a wrong key is not retried like an unreachable host. (The
    handshake has a loaded machine's time: the fixture's 5 s once timed out before the refusal.)"""
    _, _, other_private = new_key()
    config = SSHSandboxConfig(host=ssh_vm.host_config(private_key=other_private, connect_timeout=60))
    attempts: list[object] = []
    connect = paramiko.SSHClient.connect

    def counted(self: paramiko.SSHClient, *args: Any, **kwargs: Any) -> None:
        attempts.append(args)
        connect(self, *args, **kwargs)

    monkeypatch.setattr(paramiko.SSHClient, "connect", counted)
    with pytest.raises(
        SSHAuthenticationError, match=re.escape(f"authentication to sandbox@127.0.0.1:{ssh_vm.port} failed")
    ):
        SSHSandbox.create(config)
    assert len(attempts) == 1


def test_changed_host_key_is_refused(ssh_vm: SSHVM, tmp_path: Path) -> None:
    impostor = paramiko.RSAKey.generate(2048)
    known_hosts = write_known_hosts(tmp_path / "known_hosts", ssh_vm.port, impostor)
    with pytest.raises(SSHHostKeyError, match="CHANGED"):
        SSHSandbox.create(SSHSandboxConfig(host=ssh_vm.host_config(known_hosts=known_hosts)))


def test_unknown_host_is_refused(ssh_vm: SSHVM, tmp_path: Path) -> None:
    known_hosts = write_known_hosts(tmp_path / "known_hosts", ssh_vm.port)
    assert known_hosts.read_text() == ""
    with pytest.raises(SSHHostKeyError, match="not in known_hosts"):
        SSHSandbox.create(SSHSandboxConfig(host=ssh_vm.host_config(known_hosts=known_hosts)))


def test_insecure_mode_connects_and_says_so(ssh_vm: SSHVM, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    known_hosts = write_known_hosts(tmp_path / "known_hosts", ssh_vm.port, paramiko.RSAKey.generate(2048))
    host = ssh_vm.host_config(known_hosts=known_hosts, insecure_accept_any_host_key=True)
    with (
        caplog.at_level(logging.WARNING, logger="sandboxes.ssh._connection"),
        SSHSandbox.create(SSHSandboxConfig(host=host)) as sandbox,
    ):
        assert sandbox.execute("echo in").output == "in\n"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "INSECURE" in r.getMessage()]
    assert warnings, caplog.text
    assert f"127.0.0.1:{ssh_vm.port}" in warnings[0].getMessage()


def test_unreachable_port_fails_fast() -> None:
    port = free_port()
    host = SSHSandboxConfig(
        host=SSHHostConfig(host="127.0.0.1", port=port, username="sandbox", use_agent=False, known_hosts=None)
    )
    started = time.monotonic()
    with pytest.raises(SSHUnreachableError, match=re.escape(f"127.0.0.1:{port}")):
        SSHSandbox.create(host)
    assert time.monotonic() - started < 15


def test_a_silent_host_does_not_stall_connections_to_others(ssh_vm: SSHVM) -> None:
    """A host that accepts TCP but never speaks SSH holds only its own connect, not the registry."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    try:
        stuck = SSHSandboxConfig(
            host=SSHHostConfig(
                host="127.0.0.1",
                port=silent.getsockname()[1],
                username="sandbox",
                use_agent=False,
                known_hosts=None,
                connect_timeout=8,
                reconnect_attempts=1,
            )
        )
        outcome: dict[str, Any] = {}

        def connect_to_silent_host() -> None:
            try:
                outcome["result"] = SSHSandbox.create(stuck)
            except Exception as exc:
                outcome["error"] = exc

        threading.Thread(target=connect_to_silent_host, daemon=True).start()
        time.sleep(0.5)  # the silent connect is now waiting for a banner
        started = time.monotonic()
        with SSHSandbox.create(SSHSandboxConfig(host=ssh_vm.host_config())) as sandbox:
            assert sandbox.execute("echo ok").output == "ok\n"
        assert time.monotonic() - started < 5, "connecting to a healthy host waited for the silent one"
    finally:
        silent.close()
    deadline = time.monotonic() + 20
    while "error" not in outcome and "result" not in outcome:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert isinstance(outcome.get("error"), SSHUnreachableError)


# ---------------------------------------------------------------------------------- sharing


def test_sandboxes_of_a_host_share_one_transport(ssh_vm: SSHVM) -> None:
    """Sandboxes on one host share one SSH connection, and each has its own workspace that
    `destroy` removes without touching the others.

    That they cannot read each other's files (each runs as its own leased user) is
    tests/test_ssh_users.py's subject."""
    config = SSHSandboxConfig(host=ssh_vm.host_config())
    first = SSHSandbox.create(config)
    second = SSHSandbox.create(config)
    try:
        assert first._connection is second._connection
        assert first._connection.transport() is second._connection.transport()
        assert first.workspace != second.workspace
        assert first.id != second.id
        assert first.execute("pwd").output.strip() == first.workspace
        assert second.execute("pwd").output.strip() == second.workspace
        assert first.execute("stat -c %a .").output.strip() == "700"
        first.write(f"{first.workspace}/mine.txt", "first")
        second.write(f"{second.workspace}/mine.txt", "second")

        first.destroy()
        gone = second.execute(f"test -e {first.workspace} && echo present || echo gone")
        assert gone.output == "gone\n"
        assert second.read(f"{second.workspace}/mine.txt").file_data is not None
        assert second.execute("cat mine.txt").output == "second"
        assert second._connection.transport().is_active()
    finally:
        first.destroy()
        second.destroy()


def test_destroy_is_idempotent_and_removes_the_workspace(ssh_vm: SSHVM) -> None:
    config = SSHSandboxConfig(host=ssh_vm.host_config())
    with SSHSandbox.create(config) as witness:
        sandbox = SSHSandbox.create(config)
        sandbox.write(f"{sandbox.workspace}/deep/file.txt", "x")
        assert witness.execute(f"test -d {sandbox.workspace}").exit_code == 0

        sandbox.destroy()
        assert witness.execute(f"test -e {sandbox.workspace}").exit_code == 1
        sandbox.destroy()
        assert sandbox.execute("true").error == p.UNAVAILABLE

        # An isolated workspace names its user by its owner: once gone, there is nothing to attach.
        with pytest.raises(UserPoolError, match="no workspace"):
            SSHSandbox.attach(config, sandbox.workspace)


def test_destroy_of_a_shared_user_workspace_already_gone_is_fine(ssh_vm: SSHVM) -> None:
    config = SSHSandboxConfig(host=ssh_vm.host_config(), isolation="none")
    with pytest.warns(NotIsolatedWarning):
        sandbox = SSHSandbox.create(config)
    sandbox.destroy()
    attached = SSHSandbox.attach(config, sandbox.workspace)
    attached.destroy()  # a workspace already gone: still fine
    attached.destroy()


@pytest.mark.parametrize("which", ["helper_sandbox", "fallback_sandbox"])
def test_one_kill_ends_a_tree_that_keeps_forking(which: str, request: pytest.FixtureRequest) -> None:
    """A kill of an SSH command: the shared script, run once as the sandbox's user."""
    sandbox: SSHSandbox = request.getfixturevalue(which)
    kill = KILL_MARKED_SH + 'kill_marked "$1"'
    assert_one_kill_ends_forking_trees(sandbox, lambda token: sandbox.execute(_scripts.command(kill, token)))
