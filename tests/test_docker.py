"""DockerSandbox: the full conformance suite through the exec helper and through the
one-docker-exec-per-command fallback, plus the helper's lifecycle."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import docker.errors
import pytest
from mux_faults import (
    assert_a_stopped_helper_cannot_hold_a_big_send,
    assert_an_unanswered_command_runs_once,
    assert_an_unsent_command_is_resent,
    faulty,
)
from native_listings import assert_ls_and_delete_go_native, assert_native_listings_match_the_scripts
from native_searches import assert_native_searches_match_the_scripts
from native_writes import assert_file_ops_go_native, assert_native_writes_match_the_scripts, helper_client
from support import (
    SESSION_OWNER,
    assert_a_failed_helper_start_is_tried_again_later,
    assert_command_marker_never_waits_for_the_helper_lock,
    assert_one_kill_ends_forking_trees,
    assert_the_sh_kill_works_in_a_full_sandbox,
    write_shadowing_modules,
)

from sandboxes import _scripts
from sandboxes import protocol as p
from sandboxes._helper._kill import JOB_MARKER_PREFIX, KILL_MARKED_SH, MARKER_ENV
from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.docker import sandbox as docker_sandbox
from sandboxes.testing import SandboxConformance


def _config(image: str, **overrides: Any) -> DockerSandboxConfig:
    return DockerSandboxConfig(image=image, owner=SESSION_OWNER, **overrides)


@pytest.fixture(scope="module")
def helper_sandbox(docker_client: Any, runtime_image: str) -> Iterator[DockerSandbox]:
    with DockerSandbox.create(_config(runtime_image), client=docker_client) as sandbox:
        yield sandbox


@pytest.fixture(scope="module")
def fallback_sandbox(docker_client: Any, no_python_image: str) -> Iterator[DockerSandbox]:
    with DockerSandbox.create(_config(no_python_image), client=docker_client) as sandbox:
        yield sandbox


class TestDockerSandboxConformance(SandboxConformance):
    @pytest.fixture
    def backend(self, helper_sandbox: DockerSandbox) -> DockerSandbox:
        return helper_sandbox

    @pytest.fixture
    def base_dir(self) -> str:
        return "/workspace"

    def test_commands_go_through_the_exec_helper(self, helper_sandbox: DockerSandbox) -> None:
        helper_sandbox.execute("true")
        assert helper_sandbox.helper_driver.mux is not None
        assert helper_sandbox.helper_driver.mux.alive
        assert not helper_sandbox.helper_driver.starts.unavailable

    def test_file_ops_go_through_the_exec_helper_natively(self, helper_sandbox: DockerSandbox) -> None:
        assert_file_ops_go_native(helper_sandbox, "/workspace")


class TestDockerScriptedWritesConformance(SandboxConformance):
    """The exec helper with its native file ops turned off: reads, writes, edits, listings,
    deletes and searches run the scripts through it, as on every transport without the helper."""

    @pytest.fixture
    def backend(self, helper_sandbox: DockerSandbox) -> Iterator[DockerSandbox]:
        helper_sandbox.native_file_ops = False
        yield helper_sandbox
        helper_sandbox.native_file_ops = True

    @pytest.fixture
    def base_dir(self) -> str:
        return "/workspace"

    def test_writes_run_the_scripts(self, backend: DockerSandbox) -> None:
        before = helper_client(backend).native_answers
        assert backend.write("/workspace/scripted.txt", "x").error is None
        assert helper_client(backend).native_answers == before


def test_native_writes_answer_what_the_scripts_answer(helper_sandbox: DockerSandbox) -> None:
    def make_foreign(path: str) -> None:
        script = 'printf "someone else\'s\\n" > "$1" && chmod 666 "$1"'
        made = helper_sandbox.container.exec_run(["sh", "-c", script, "sh", path], user="root")
        assert made.exit_code == 0, made.output

    assert_native_writes_match_the_scripts(helper_sandbox, "/workspace", make_foreign)


def test_native_searches_answer_what_the_scripts_answer(helper_sandbox: DockerSandbox) -> None:
    assert_native_searches_match_the_scripts(helper_sandbox, "/workspace")


def test_native_listings_answer_what_the_scripts_answer(helper_sandbox: DockerSandbox) -> None:
    assert_native_listings_match_the_scripts(helper_sandbox, "/workspace")


def test_ls_and_delete_go_through_the_exec_helper_natively(helper_sandbox: DockerSandbox) -> None:
    assert_ls_and_delete_go_native(helper_sandbox, "/workspace")


class TestDockerFallbackConformance(SandboxConformance):
    """An image without python3: every command is its own docker exec, same semantics."""

    @pytest.fixture
    def backend(self, fallback_sandbox: DockerSandbox) -> DockerSandbox:
        return fallback_sandbox

    @pytest.fixture
    def base_dir(self) -> str:
        return "/workspace"

    def test_no_helper_is_used(self, fallback_sandbox: DockerSandbox) -> None:
        assert fallback_sandbox.execute("echo ok").output == "ok\n"
        assert fallback_sandbox.helper_driver.starts.unavailable
        assert fallback_sandbox.helper_driver.mux is None


def test_the_marker_for_a_command_never_waits_for_a_helper_start(helper_sandbox: DockerSandbox) -> None:
    """Nor does the service's look for a running helper to await a command on."""
    assert_command_marker_never_waits_for_the_helper_lock(helper_sandbox, also=helper_sandbox.running_helper)


def test_dead_helper_is_replaced(docker_client: Any, runtime_image: str) -> None:
    with DockerSandbox.create(_config(runtime_image), client=docker_client) as sandbox:
        sandbox.execute("true")
        assert sandbox.helper_driver.mux is not None
        first_pid = sandbox.helper_driver.mux.info["pid"]
        killed = sandbox.execute(f"kill -9 {first_pid}")
        assert killed.error == p.CONNECTION_LOST
        second_pid = _helper_parent(sandbox)
        assert second_pid != first_pid
        helper = sandbox.helper_driver.mux
        assert helper is not None
        docker_client.containers.get(sandbox.id).exec_run(["kill", "-9", str(second_pid)])
        # Once the client has seen the stream end, nothing of the next command is written to the
        # dead helper: it is replaced transparently. (A command written before the client saw it
        # answers connection_lost: the client cannot tell a helper that died before reading the
        # request from one that started the command and then died; MuxBroken.may_resend.)
        deadline = time.monotonic() + 30
        while helper.alive:
            assert time.monotonic() < deadline, "the helper's stream never ended"
            time.sleep(0.01)
        third_pid = _helper_parent(sandbox)
        assert third_pid not in (first_pid, second_pid)
        assert sandbox.helper_driver.mux is not helper


def test_python_files_in_the_workspace_do_not_shadow_the_helper(docker_client: Any, runtime_image: str) -> None:
    """A helper restarted in a workspace holding ``json.py``: it starts (isolated python), so
    commands do not fall back to one ``docker exec`` each for the sandbox's life."""
    with DockerSandbox.create(_config(runtime_image), client=docker_client) as sandbox:
        write_shadowing_modules(sandbox, sandbox.config.workdir)
        helper = sandbox.helper_driver.mux
        assert helper is not None
        assert sandbox.execute(f"kill -9 {helper.info['pid']}").error == p.CONNECTION_LOST
        assert sandbox.execute("echo back").output == "back\n"
        assert sandbox.helper_alive, "the helper did not start again"
        assert sandbox.helper_driver.mux is not helper


def test_a_helper_that_failed_to_start_is_tried_again_later(
    docker_client: Any, runtime_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with DockerSandbox.create(_config(runtime_image), client=docker_client) as sandbox:
        assert_a_failed_helper_start_is_tried_again_later(sandbox, monkeypatch)


def test_a_failed_question_whether_python_is_there_gives_nothing_up(
    docker_client: Any, runtime_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with DockerSandbox.create(_config(runtime_image), client=docker_client) as sandbox:
        assert_a_failed_helper_start_is_tried_again_later(sandbox, monkeypatch, question_fails=True)


def _helper_parent(sandbox: DockerSandbox) -> int:
    """The pid of the process that ran a command: the exec helper's, which reported its own pid
    when it started. A command of the per-command fallback has another parent (its own
    ``docker exec``'s wrapper), even when a new helper was started beside it."""
    parent = int(sandbox.execute("echo $PPID").output)
    assert sandbox.helper_driver.mux is not None, "answered by the fallback, not by an exec helper"
    assert parent == sandbox.helper_driver.mux.info["pid"], f"run by pid {parent}, not by the helper"
    return parent


def test_a_command_whose_answer_was_lost_is_never_run_twice(
    docker_client: Any, runtime_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    streams = faulty(monkeypatch, docker_sandbox)
    with DockerSandbox.create(_config(runtime_image), client=docker_client) as sandbox:
        assert_an_unanswered_command_runs_once(sandbox, streams, "/workspace/ran")


def test_a_command_not_written_whole_is_resent_to_a_new_helper(
    docker_client: Any, runtime_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    streams = faulty(monkeypatch, docker_sandbox)
    with DockerSandbox.create(_config(runtime_image), client=docker_client) as sandbox:
        assert_an_unsent_command_is_resent(sandbox, streams, "/workspace/ran")


def test_attach_and_idempotent_delete(docker_client: Any, runtime_image: str) -> None:
    sandbox = DockerSandbox.create(_config(runtime_image), client=docker_client)
    sandbox.write("/workspace/kept.txt", "still here")
    attached = DockerSandbox.attach(sandbox.id, client=docker_client)
    assert attached.read("/workspace/kept.txt").file_data == p.FileData("still here")
    attached.close()
    sandbox.destroy()
    sandbox.destroy()
    assert docker_client.containers.list(all=True, filters={"id": sandbox.id}) == []


def test_a_sandbox_holds_its_container_without_its_full_inspection(
    docker_client: Any, helper_sandbox: DockerSandbox
) -> None:
    """A service holds every live sandbox: its container's inspection (mounts, host config,
    network settings) is not kept, its id, name, labels and state are."""
    held = helper_sandbox.container
    whole = docker_client.containers.get(helper_sandbox.id)
    assert set(held.attrs) == {"Id", "Name", "Config", "State"}
    assert (held.id, held.name, held.labels) == (whole.id, whole.name, whole.labels)
    assert len(json.dumps(held.attrs)) < len(json.dumps(whole.attrs)) / 4


@pytest.mark.parametrize("which", ["helper_sandbox", "fallback_sandbox"])
def test_one_kill_ends_a_tree_that_keeps_forking(which: str, request: pytest.FixtureRequest) -> None:
    """The service's kill of a Docker command without an exec helper: the shared script, run
    once in the container as a command."""
    sandbox: DockerSandbox = request.getfixturevalue(which)
    kill = KILL_MARKED_SH + 'kill_marked "$1"'
    assert_one_kill_ends_forking_trees(sandbox, lambda token: sandbox.execute(_scripts.command(kill, token)))


def test_one_kill_tagged_ends_a_tree_that_keeps_forking(helper_sandbox: DockerSandbox) -> None:
    """The service's kill of a Docker command with an exec helper (`kill_tagged`)."""
    assert_one_kill_ends_forking_trees(helper_sandbox, lambda token: helper_sandbox.kill_tagged(MARKER_ENV, token))


@pytest.mark.parametrize("which", ["helper_sandbox", "fallback_sandbox"])
def test_the_shared_kill_works_when_the_container_has_no_pid_left(which: str, request: pytest.FixtureRequest) -> None:
    assert_the_sh_kill_works_in_a_full_sandbox(request.getfixturevalue(which))


@pytest.mark.usefixtures("slow_header_parsing")
def test_output_read_with_the_headers_is_not_lost(fallback_sandbox: DockerSandbox) -> None:
    """Bytes the HTTP client read past the headers are the command's first output (a CI run
    under load got an empty archive with exit 0; the fallback's `echo` answered nothing)."""
    done = fallback_sandbox.execute("echo hello; echo oops >&2")
    assert sorted(done.output.splitlines()) == ["hello", "oops"]  # two pipes: no order between them
    assert done.exit_code == 0
    stream = fallback_sandbox.open_output_stream("printf archive")
    try:
        assert stream.recv(1 << 16) == b"archive"
    finally:
        stream.close()
    assert stream.exit_code() == 0


def test_an_exec_not_started_yet_is_waited_for(
    fallback_sandbox: DockerSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before its process starts (a slow runtime, a container just unpaused: a CI run answered
    an empty output), the engine inspects an exec as not running, with no exit code: the command
    is waited for, not taken as ended. The engine's real exec runs; its first inspections answer
    as the engine does before the start."""
    api = fallback_sandbox.client.api
    real_inspect = api.exec_inspect
    early = iter(range(3))

    def inspect_before_the_start(exec_id: str) -> dict[str, Any]:
        info = dict(real_inspect(exec_id))
        if next(early, None) is not None:
            info.update(Running=False, ExitCode=None, Pid=0)
        return info

    monkeypatch.setattr(api, "exec_inspect", inspect_before_the_start)
    done = fallback_sandbox.execute("sleep 1; echo back")
    assert (done.output, done.exit_code, done.error) == ("back\n", 0, None), done


def test_a_command_runs_in_a_container_with_one_pid_left(docker_client: Any, no_python_image: str) -> None:
    """Without an exec helper, a command takes two processes (the wrapper that kills what it
    leaves behind, and the command): with room for one only, the command replaces the wrapper
    and still runs, which is what the scripts that kill what filled the container need. A
    container of its own: what other tests leave running in a shared one may end meanwhile
    and free pids."""
    # The filler's marker is a job's (of no live job: a sweep that can look that up kills it, one
    # at the pids limit cannot and spares it), so the sweep of orphans after the command spares it; and it
    # is the whole filling shell's, so a `sleep` forked but not yet exec'd, which still shows the
    # shell's environment, is not killed with the command either.
    filler = f"{JOB_MARKER_PREFIX}{uuid.uuid4().hex}"
    loop = "while command eval 'sleep 300 &' 2>/dev/null; do :; done; echo full"
    fill = _scripts.command('exec env SANDBOXES_EXEC_ID="$1" /bin/sh -c "$2"', filler, loop)
    kill = _scripts.command(KILL_MARKED_SH + 'kill_marked "$1"; echo "kill=$?"', filler)
    with DockerSandbox.create(_config(no_python_image), client=docker_client) as sandbox:
        assert sandbox.execute(fill).output.endswith("full\n")  # its own two processes end with it
        _take_one_pid(docker_client, sandbox.id)
        try:
            assert _execute_once_runc_starts(sandbox, "echo ran") == "ran\n"
        finally:
            assert _execute_once_runc_starts(sandbox, kill) == "kill=0\n"
        assert sandbox.execute("echo ran").output == "ran\n"


def _take_one_pid(docker_client: Any, container_id: str) -> None:
    """Start a `sleep` beside the sandbox's commands and wait until exactly one pid is free:
    a detached exec that runc could not start, or processes not yet reaped, would leave the
    test proving nothing."""
    for _ in range(20):
        exec_id = docker_client.api.exec_create(container_id, ["sleep", "30"])["Id"]
        try:
            docker_client.api.exec_start(exec_id, detach=True)
        except docker.errors.APIError as refused:  # runc's lost race (`_execute_once_runc_starts`), as a 500
            if "OCI runtime exec failed" not in str(refused):
                raise
            continue
        if _exec_started(docker_client, exec_id):
            break
    deadline = time.monotonic() + 10
    while (free := _free_pids(docker_client, container_id)) != 1 and time.monotonic() < deadline:
        time.sleep(0.05)  # the kernel's pid count has no event to wait on
    assert free == 1, f"{free} pids free, expected exactly one"


def _free_pids(docker_client: Any, container_id: str) -> int:
    stats = docker_client.api.stats(container_id, stream=False, one_shot=True)["pids_stats"]
    return int(stats["limit"]) - int(stats["current"])


def _exec_started(docker_client: Any, exec_id: str) -> bool:
    """True once the exec runs its process, False once it ended or failed to start."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        info = docker_client.api.exec_inspect(exec_id)
        if info["Running"] and info["Pid"]:
            return True
        if info["ExitCode"] is not None:
            return False
        time.sleep(0.01)  # the daemon publishes no event for an exec's start: poll its state
    return False


def _execute_once_runc_starts(sandbox: DockerSandbox, command: str) -> str:
    """runc's own `init` forks while it joins the container; with one pid free it loses that
    race now and then, and `docker exec` fails before our wrapper exists. That failure is
    runc's, so try again: a wrapper that needs a second process fails every time, not now and then."""
    output = ""
    for _ in range(20):
        try:
            output = sandbox.execute(command).output
        except docker.errors.APIError as refused:  # the engine answers the same failure as a 500 at times
            if "OCI runtime exec failed" not in str(refused):
                raise
            output = str(refused)
            continue
        if not output.startswith("OCI runtime exec failed"):
            return output
    return output


@pytest.mark.parametrize("what", ["write", "stdin"])
def test_a_stopped_helper_cannot_hold_a_big_write_or_stdin(
    docker_client: Any, runtime_image: str, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    with DockerSandbox.create(_config(runtime_image), client=docker_client) as sandbox:
        assert sandbox.execute("true").exit_code == 0
        assert sandbox.helper_driver.mux is not None
        pid = str(sandbox.helper_driver.mux.info["pid"])

        def signal_helper(name: str) -> None:
            assert sandbox.container.exec_run(["kill", f"-{name}", pid], user=sandbox.config.user).exit_code == 0

        assert_a_stopped_helper_cannot_hold_a_big_send(sandbox, monkeypatch, what, signal_helper)
