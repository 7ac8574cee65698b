"""Attacks from inside a Docker sandbox on what lies outside it: the host's disk, the engine's
logs, the service's memory, and the timeout that must end a command's whole tree.

Each test runs the attack in a real container with small limits, asserts it was stopped with the
protocol's error, then that the engine and a neighbour sandbox did not notice. Nothing leaves the
machine: every container has ``network_mode=none``.
"""

from __future__ import annotations

import io
import json
import shlex
import tarfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from native_writes import assert_a_failed_native_write_stops_sending, helper_client
from support import SESSION_OWNER

from sandboxes import protocol as p
from sandboxes.docker import DockerSandbox, DockerSandboxConfig

DISK = "16m"
FILES = 2_000


def _config(image: str, **overrides: Any) -> DockerSandboxConfig:
    limits: dict[str, Any] = {"cpus": 1.0, "memory": "128m", "pids": 128, "disk": DISK, "disk_files": FILES}
    return DockerSandboxConfig(image=image, owner=SESSION_OWNER, **{**limits, **overrides})


@pytest.fixture(scope="module")
def sandbox(docker_client: Any, runtime_image: str) -> Iterator[DockerSandbox]:
    with DockerSandbox.create(_config(runtime_image), client=docker_client) as sb:
        yield sb


@pytest.fixture(scope="module")
def neighbour(docker_client: Any, runtime_image: str) -> Iterator[DockerSandbox]:
    with DockerSandbox.create(_config(runtime_image), client=docker_client) as sb:
        yield sb


def _assert_unharmed(neighbour: DockerSandbox, client: Any) -> None:
    assert client.ping()
    assert neighbour.write("/workspace/neighbour.txt", "fine").error is None
    assert neighbour.read("/workspace/neighbour.txt").file_data == p.FileData("fine")
    assert neighbour.execute("rm /workspace/neighbour.txt").exit_code == 0


# ---------------------------------------------------------------------------- disk


def test_workspace_writes_past_the_disk_limit_answer_no_space(
    sandbox: DockerSandbox, neighbour: DockerSandbox, docker_client: Any
) -> None:
    """A command filling the workspace stops at ``disk``; so do a write and a big upload (the
    engine's archive API writes into the same limited volume). Deleting frees the space."""
    filled = sandbox.execute("head -c 64m /dev/zero > /workspace/fill; echo $?; du -k /workspace/fill")
    status, size = filled.output.split()[-3], int(filled.output.split()[-2])
    assert status != "0", filled
    assert "No space left" in filled.output, filled
    assert size <= 16 * 1024, filled
    assert sandbox.write("/workspace/more.txt", "x" * 100_000).error == p.NO_SPACE
    upload = sandbox.upload_files([("/workspace/big.bin", b"\x01" * (4 << 20))])
    assert upload[0].error == p.NO_SPACE, upload
    assert sandbox.execute("rm /workspace/fill").exit_code == 0
    assert sandbox.upload_files([("/workspace/big.bin", b"\x01" * (4 << 20))])[0].error is None
    assert sandbox.download_files(["/workspace/big.bin"])[0].content == b"\x01" * (4 << 20)
    assert sandbox.execute("rm /workspace/big.bin").exit_code == 0
    _assert_unharmed(neighbour, docker_client)


def test_a_big_upload_past_the_disk_limit_leaves_the_old_file_and_nothing_else(sandbox: DockerSandbox) -> None:
    """A file of more than one chunk, streamed into a ``docker exec`` of its own, answers
    ``no_space`` as the chunks do; the target keeps its old content, no staged file is left."""
    assert sandbox.write("/workspace/kept.bin", "old\n").error is None
    try:
        upload = sandbox.upload_files([("/workspace/kept.bin", b"\x02" * (17 << 20))])
        assert upload[0].error == p.NO_SPACE, upload
        assert sandbox.read("/workspace/kept.bin").file_data == p.FileData("old\n")
        assert sandbox.execute("ls -A /workspace").output == "kept.bin\n"
    finally:
        sandbox.execute("rm -f /workspace/kept.bin")


@pytest.mark.parametrize("native", [True, False], ids=["native", "scripted"])
def test_a_write_past_the_disk_limit_leaves_the_old_file_and_nothing_else(sandbox: DockerSandbox, native: bool) -> None:
    """``no_space`` from the helper's own write and from the script's alike; the target keeps
    its old content and no staged file is left (the space is free again)."""
    mux = helper_client(sandbox)
    sandbox.native_file_ops = native
    try:
        assert sandbox.write("/workspace/kept.txt", "old\n").error is None
        before = mux.native_answers
        too_big = sandbox.write("/workspace/kept.txt", "x" * (17 << 20))
        assert too_big.error == p.NO_SPACE, too_big
        assert mux.native_answers - before == (1 if native else 0)
        assert sandbox.read("/workspace/kept.txt").file_data == p.FileData("old\n")
        assert sandbox.execute("ls -A /workspace").output == "kept.txt\n"
    finally:
        sandbox.native_file_ops = True
        sandbox.execute("rm -f /workspace/kept.txt")


def test_a_native_write_past_the_disk_limit_stops_sending_at_the_failure(
    sandbox: DockerSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the reader thread (the client sends; another thread reads the early answer)."""
    assert_a_failed_native_write_stops_sending(sandbox, "/workspace/too-big.txt", monkeypatch, 16 << 20)
    assert sandbox.execute("ls -A /workspace").output == ""


def test_workspace_holds_a_bounded_number_of_files(
    sandbox: DockerSandbox, neighbour: DockerSandbox, docker_client: Any
) -> None:
    """Inodes are a disk resource too: a command creating many empty files, and an archive
    of many members put through the engine, stop at ``disk_files``."""
    made = sandbox.execute(f"mkdir /workspace/many && cd /workspace/many && seq 1 {2 * FILES} | xargs touch; echo $?")
    assert made.output.split()[-1] != "0", made
    assert "No space left" in made.output, made
    count = int(sandbox.execute("ls /workspace/many | wc -l").output)
    assert count < FILES, count
    assert sandbox.execute("rm -rf /workspace/many").exit_code == 0
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for index in range(-1, 2 * FILES):
            member = tarfile.TarInfo("members" if index < 0 else f"members/{index}")
            member.uid = member.gid = 1000
            member.type, member.mode = (tarfile.DIRTYPE, 0o755) if index < 0 else (tarfile.REGTYPE, 0o644)
            archive.addfile(member, io.BytesIO(b""))
    with pytest.raises(Exception, match=r"(?i)no space left"):
        sandbox.container.put_archive("/workspace", buffer.getvalue())
    assert sandbox.execute("rm -rf /workspace/members").exit_code == 0
    _assert_unharmed(neighbour, docker_client)


# ---------------------------------------------------------------------------- logs


def test_writing_to_the_containers_init_leaves_a_bounded_log(sandbox: DockerSandbox, docker_client: Any) -> None:
    """The container's init runs as the sandbox's user, so a command can write to its stdout,
    which is the engine's log on the host's disk: it must be capped."""
    flood = sandbox.execute("head -c 8m /dev/zero | tr '\\0' 'x' | fold -w 1000 > /proc/1/fd/1; echo $?")
    assert flood.output.split()[-1] == "0", flood  # the attack itself works: the log is reachable
    logged = docker_client.api.logs(sandbox.id, stdout=True, stderr=True)
    assert 0 < len(logged) <= 2 << 20, len(logged)
    assert docker_client.ping()


# ---------------------------------------------------------------------------- the exec helper's stream


def test_a_command_cannot_forge_frames_into_the_helpers_stream(sandbox: DockerSandbox, docker_client: Any) -> None:
    """The helper runs as the commands' uid and runc hands it its stdio: unprotected, a command
    writes a header announcing 4 GiB into /proc/<helper>/fd/1 and the client buffers whatever
    follows (measured: the service grew by 2 GiB). The helper is undumpable, so every way in
    is refused, and the same helper keeps serving."""
    from test_mux import _REACH_INTO

    sandbox.execute("true")
    assert sandbox.helper_driver.mux is not None
    helper = sandbox.helper_driver.mux.info["pid"]
    assert sandbox.helper_driver.mux.info["undumpable"] is True
    result = sandbox.execute("python3 -c " + shlex.quote(_REACH_INTO) + f" {helper}", timeout=20)
    assert result.exit_code == 0, result
    outcomes = json.loads(result.output)
    assert len(outcomes) == 3, outcomes
    assert "ok" not in outcomes.values(), outcomes
    assert sandbox.execute("echo alive").output == "alive\n"
    assert sandbox.helper_driver.mux.info["pid"] == helper
    assert docker_client.ping()


# ---------------------------------------------------------------------------- escaping the kill

_ESCAPE = "env -u SANDBOXES_EXEC_ID setsid sh -c 'while :; do sleep 1; done & sleep 303 &'"
"""Drops the marker, leaves the group, orphans itself: found by neither marker nor group."""


def _escaped(sandbox: DockerSandbox) -> list[str]:
    listed = sandbox.execute("ps -eo args=", timeout=20)
    return [line for line in listed.output.splitlines() if line.startswith(("sleep 303", "sh -c while"))]


@pytest.fixture(scope="module", params=[True, False], ids=["helper", "docker-exec"])
def any_path(request: pytest.FixtureRequest, docker_client: Any, runtime_image: str) -> Iterator[DockerSandbox]:
    config = _config(runtime_image, use_exec_helper=request.param)
    with DockerSandbox.create(config, client=docker_client) as sb:
        yield sb


def test_what_drops_the_marker_dies_with_its_command(any_path: DockerSandbox) -> None:
    result = any_path.execute(_ESCAPE, timeout=20)
    assert result.exit_code == 0, result
    assert _escaped(any_path) == []


def test_what_empties_its_environment_dies_with_its_command(any_path: DockerSandbox) -> None:
    """An environment read empty is waited for only while an exec sets it up (`sandboxes._helper._kill.
    _environ`, the shell's sweep alike): one emptied for good (``env -i``) is swept at once."""
    result = any_path.execute(_ESCAPE.replace("env -u SANDBOXES_EXEC_ID", "env -i"), timeout=20)
    assert result.exit_code == 0, result
    assert _escaped(any_path) == []


def test_what_drops_the_marker_dies_at_the_timeout(any_path: DockerSandbox) -> None:
    started = time.monotonic()
    result = any_path.execute(_ESCAPE + "; sleep 300", timeout=2)
    assert result.error == p.TIMEOUT, result
    assert time.monotonic() - started < 10
    assert _escaped(any_path) == []
    assert any_path.execute("echo alive").output == "alive\n"


def test_what_drops_the_marker_spares_the_containers_own_command(any_path: DockerSandbox) -> None:
    any_path.execute(_ESCAPE, timeout=20)
    any_path.container.reload()
    assert any_path.container.status == "running"
    assert "sleep infinity" in any_path.execute("ps -eo args=").output


def _processes(sandbox: DockerSandbox) -> list[str]:
    return sandbox.execute("ps -eo args=").output.splitlines()


def test_a_foreign_containers_init_keeps_its_children(docker_client: Any, runtime_image: str) -> None:
    """A container we did not make (``attach``) may run services as children of its init: the
    orphan sweep must leave them alone there, since it cannot tell them from orphans."""
    container = docker_client.containers.run(
        runtime_image,
        command=["sh", "-c", "sleep 0.5; (sleep 404 &); exec sleep infinity"],  # a 'service' adopted by init
        detach=True,
        init=True,
        user="1000:1000",
        network_mode="none",
        labels={"io.sandboxes.test-session": SESSION_OWNER},
    )
    try:
        for use_exec_helper in (True, False):
            config = _config(runtime_image, use_exec_helper=use_exec_helper)
            with DockerSandbox.attach(container.id, client=docker_client, config=config) as sb:
                deadline = time.monotonic() + 10
                while "sleep 404" not in _processes(sb):
                    assert time.monotonic() < deadline, "the service never started"
                assert sb.execute(_ESCAPE + "; sleep 5", timeout=1).error == p.TIMEOUT
                assert "sleep 404" in _processes(sb), use_exec_helper
    finally:
        container.remove(force=True, v=True)


def test_closing_a_helper_wakes_its_reader_and_ends_its_commands(docker_client: Any, runtime_image: str) -> None:
    """Dropping a helper (a violation, a restart, close) must release its reader thread, which
    would otherwise sit in recv holding the socket, and end the helper, whose commands die."""
    with DockerSandbox.create(_config(runtime_image), client=docker_client) as sb:
        sb.execute("true")
        mux = sb.helper_driver.mux
        assert mux is not None
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(sb.execute, "echo started > /workspace/started; sleep 300", timeout=600)
            deadline = time.monotonic() + 10
            while sb.execute("cat /workspace/started 2>/dev/null").output != "started\n":
                assert time.monotonic() < deadline
            sb.close()
            mux._reader.join(5)
            assert not mux._reader.is_alive()
            assert running.result(timeout=10).error == p.CONNECTION_LOST
        deadline = time.monotonic() + 10
        while "sleep 300" in _processes(sb):  # a new helper answers; the old one took its command along
            assert time.monotonic() < deadline, _processes(sb)


def test_internal_scripts_of_the_fallback_path_buffer_little(docker_client: Any, runtime_image: str) -> None:
    """Without the helper, the sandbox's internal scripts (cwd probe, kill, OOM probe) run as
    their own ``docker exec``, whose stdout a command can open through /proc and flood, or hold
    open: what is read of them is capped, and nobody waits past their end."""
    with DockerSandbox.create(_config(runtime_image, use_exec_helper=False), client=docker_client) as sb:
        flood = sb._probe("head -c 64m /dev/zero | tr '\\0' x")
        assert 0 < len(flood) < 8192, len(flood)
        started = time.monotonic()
        held = sb._run_small("sleep 300 & echo held", timeout=30)  # a background job keeps stdout open
        assert held == (0, "held\n"), held
        assert time.monotonic() - started < 5


def test_many_big_uploads_in_one_call_are_all_written(sandbox: DockerSandbox) -> None:
    """More big files than one call used to put in one archive (the engine's archive API is no
    longer used, `tests/test_docker_bulk.py`): every one written, in order."""
    files = [(f"/workspace/split/{index}.bin", bytes([index]) * ((1 << 20) + 1)) for index in range(5)]
    assert [r.error for r in sandbox.upload_files(files)] == [None] * 5
    assert [r.content for r in sandbox.download_files([path for path, _ in files])] == [data for _, data in files]
    assert sandbox.execute("rm -rf /workspace/split").exit_code == 0
