"""A write is all or nothing: a client killed halfway through a big write leaves the old file
whole, never truncated or half new, on every write path (inline through the shell, and the
Docker workspace's bulk tar path); and a stream cut short is never renamed into place."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import SESSION_OWNER

from sandboxes import _scripts
from sandboxes import protocol as p
from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.local import LocalSandbox

ORIGINAL = b"the original, which must survive\n" * 1000
BIG = 256 << 20
"""Big enough that the write is still streaming when the writer is killed."""

_WRITER = textwrap.dedent(
    """
    import json, sys
    spec = json.loads(sys.argv[1])
    if spec["kind"] == "local":
        from sandboxes.local import LocalSandbox
        sandbox = LocalSandbox(spec["root"])
    else:
        from sandboxes.docker import DockerSandbox, DockerSandboxConfig
        sandbox = DockerSandbox.attach(spec["container"], config=DockerSandboxConfig(image=spec["image"]))
    data = b"n" * spec["size"]
    if spec["op"] == "write":
        sandbox.write(spec["path"], data.decode())
    else:
        sandbox.upload_files([(spec["path"], data)])
    print("finished", flush=True)
    """
)


def _kill_writer_midway(spec: dict[str, Any], progress: Callable[[], int]) -> None:
    """Start a writer process, wait until it has written a MiB somewhere (a staged copy, or the
    target itself), then SIGKILL it."""
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, json.dumps(spec)], stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while progress() < 1 << 20:
            assert writer.poll() is None, "the writer ended before it could be killed midway"
            assert time.monotonic() < deadline, "the writer wrote nothing"
            time.sleep(0.01)
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()


@pytest.fixture(scope="module")
def docker_sandbox(docker_client: Any, runtime_image: str) -> Iterator[DockerSandbox]:
    config = DockerSandboxConfig(image=runtime_image, owner=SESSION_OWNER, memory="1g", tmp_size="600m")
    with DockerSandbox.create(config, client=docker_client) as sandbox:
        yield sandbox


def _written_in(sandbox: p.SandboxBackendProtocol, directory: str) -> Callable[[], int]:
    """Bytes of new content so far: in staged copies, or in the target once it no longer holds
    the original's size (a write in place)."""

    def size() -> int:
        staged = "cat .sandboxes-write.* 2>/dev/null | wc -c; stat -c %s file.txt 2>/dev/null || echo 0"
        staged_bytes, target_bytes = (int(n) for n in sandbox.execute(f"cd {directory} && {staged}").output.split())
        return staged_bytes + (target_bytes if target_bytes != len(ORIGINAL) else 0)

    return size


@pytest.mark.parametrize("op", ["write", "upload"])
def test_local_writer_killed_midway_leaves_the_original(tmp_path: Path, op: str) -> None:
    root = tmp_path / "root"
    target = root / "keep" / "file.txt"
    target.parent.mkdir(parents=True)
    target.write_bytes(ORIGINAL)

    def written() -> int:
        in_place = target.stat().st_size if target.exists() else 0
        staged = sum(f.stat().st_size for f in target.parent.glob(".sandboxes-write.*"))
        return staged + (in_place if in_place != len(ORIGINAL) else 0)

    spec = {"kind": "local", "root": str(root), "path": str(target), "size": BIG, "op": op}
    _kill_writer_midway(spec, written)
    assert target.read_bytes() == ORIGINAL
    sandbox = LocalSandbox(root)
    try:
        assert sandbox.read(str(target)).file_data is not None
    finally:
        sandbox.close()


@pytest.mark.parametrize(("op", "where"), [("write", "/workspace"), ("upload", "/workspace"), ("write", "/tmp")])
def test_docker_writer_killed_midway_leaves_the_original(
    docker_sandbox: DockerSandbox, runtime_image: str, op: str, where: str
) -> None:
    directory = f"{where}/keep-{op}"
    target = f"{directory}/file.txt"
    assert docker_sandbox.upload_files([(target, ORIGINAL)])[0].error is None
    spec = {"kind": "docker", "container": docker_sandbox.id, "image": runtime_image, "path": target}
    _kill_writer_midway({**spec, "size": BIG, "op": op}, _written_in(docker_sandbox, directory))
    assert docker_sandbox.download_files([target])[0].content == ORIGINAL


def test_a_stream_cut_short_is_never_renamed_into_place(docker_sandbox: DockerSandbox) -> None:
    """The write script is told the size; fewer bytes (a transport that lost the tail) leave the
    target untouched and report ``connection_lost``, not success."""
    target = "/workspace/short/file.txt"
    assert docker_sandbox.upload_files([(target, ORIGINAL)])[0].error is None
    command = _scripts.command(_scripts.WRITE, target, str(len(ORIGINAL) + 10), "cut-short")
    response = docker_sandbox.execute(command, stdin=b"only part of it")
    assert response.exit_code == _scripts.EXIT_SHORT
    assert docker_sandbox.download_files([target])[0].content == ORIGINAL
    assert docker_sandbox.execute("ls -A /workspace/short").output.split() == ["file.txt"]
