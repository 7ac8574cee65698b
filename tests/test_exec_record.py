"""A command recorded by the exec helper (`sandboxes._helper._record`) outlives the handle that
started it on Docker and SSH (Kubernetes: tests/kubernetes/test_kubernetes_record.py): it runs on,
and a new handle reads the rest of its output and its exit from the sandbox; the record keeps a
bounded head and tail, and a request that asks for one wrongly records nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from recording import assert_a_recorded_command_outlives_its_handle, until_recorded_end
from ssh_fixtures import SSHVM, start_vm
from support import SESSION_OWNER

from sandboxes._helper._kill import RECORD_ENV
from sandboxes.base import BaseSandbox
from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.ssh import SSHSandbox, SSHSandboxConfig

Handles = tuple[BaseSandbox, Callable[[], BaseSandbox]]


@pytest.fixture(scope="module")
def ssh_vm(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHVM]:
    vm = start_vm(tmp_path_factory.mktemp("ssh-record"))
    yield vm
    vm.stop()


@pytest.fixture(params=["docker", "ssh"])
def handles(request: pytest.FixtureRequest) -> Iterator[Handles]:
    if request.param == "docker":
        docker_client = request.getfixturevalue("docker_client")
        config = DockerSandboxConfig(image=request.getfixturevalue("runtime_image"), owner=SESSION_OWNER)
        first: BaseSandbox = DockerSandbox.create(config, client=docker_client)

        def attach() -> BaseSandbox:
            return DockerSandbox.attach(first.id, client=docker_client)
    else:
        ssh_config = SSHSandboxConfig(host=request.getfixturevalue("ssh_vm").host_config())
        first = SSHSandbox.create(ssh_config)
        workspace = first.workspace  # type: ignore[attr-defined]

        def attach() -> BaseSandbox:
            return SSHSandbox.attach(ssh_config, workspace)

    held = [first]

    def reattach() -> BaseSandbox:
        held[-1].close()
        held.append(attach())
        return held[-1]

    try:
        yield first, reattach
    finally:
        held[-1].destroy()


def test_a_recorded_command_outlives_its_handle(handles: Handles) -> None:
    assert_a_recorded_command_outlives_its_handle(*handles)


def test_a_record_keeps_a_bounded_head_and_tail(handles: Handles) -> None:
    sandbox = handles[0]
    printed = b"".join(b"%05d\n" % i for i in range(4000))  # 24,000 bytes into a record of 4,096
    command = "i=0; while [ $i -lt 4000 ]; do printf '%05d\\n' $i; i=$((i + 1)); done"
    result = sandbox.execute(command, env={RECORD_ENV: f"{'ab' * 16}:4096"}, timeout=30)
    assert result.exit_code == 0, result
    job = until_recorded_end(sandbox, "ab" * 16)
    (head_at, head), *tail = job.chunks
    assert (head_at, head) == (0, printed[:2048])
    assert tail
    assert sum(len(data) for _, data in tail) <= 2048
    for at, data in tail:
        assert data == printed[at : at + len(data)]
    assert tail[-1][0] + len(tail[-1][1]) == len(printed)
    assert job.response().truncated


@pytest.mark.parametrize("value", ["../../etc:10", "ABC:10", f"{'a' * 65}:10", "abc:-1", "abc", ""])
def test_a_malformed_record_request_records_nothing(handles: Handles, value: str) -> None:
    sandbox = handles[0]
    result = sandbox.execute(f"echo ${RECORD_ENV}-", env={RECORD_ENV: value}, timeout=30)
    assert (result.exit_code, result.output) == (0, "-\n")  # taken out of the command's environment
    made = sandbox.execute("ls -a ${TMPDIR:-/tmp}/.sandboxes-streams 2>/dev/null; true").output.split()
    assert value.partition(":")[0] not in made or not value, made
