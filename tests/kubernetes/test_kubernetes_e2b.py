"""The real E2B SDK (sync and async) against the service over the Kubernetes backend (pods of
the fake API server, a FAKE: `fake_apiserver`), with E2B's ``base`` on the ``sandboxes/e2b``
image in ``/home/user``: a sandbox's lifecycle, commands and a file round trip."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b import AsyncSandbox, CommandExitException, FileType, Sandbox, SandboxQuery

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
from e2b_harness import opts
from fake_cluster import fake_template
from service_harness import UNTHROTTLED, Running, running, settings_for

from sandboxes.kubernetes import KubernetesTemplate

E2B_IMAGE = "sandboxes/e2b:latest"


@pytest.fixture(scope="module")
def service(fake_kubeconfig: Path, docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    try:
        docker_client.images.get(E2B_IMAGE)
    except Exception:
        pytest.fail(f"{E2B_IMAGE} is missing: build it with `bash images/build.sh e2b`")
    template_of = fake_template(fake_kubeconfig, E2B_IMAGE, workdir="/home/user", default_timeout=30)
    template = KubernetesTemplate.model_validate(template_of)
    settings = settings_for(tmp_path_factory.mktemp("k8s-e2b"), templates={"default": template}, tenants=UNTHROTTLED)
    with running(settings) as svc:
        yield svc


def test_a_sandbox_lives_runs_commands_and_keeps_files(service: Running) -> None:
    created = Sandbox.create(metadata={"on": "kubernetes"}, timeout=300, **opts(service))
    try:
        assert created.get_info().template_id == "base"
        query = SandboxQuery(metadata={"on": "kubernetes"})
        assert [s.sandbox_id for s in Sandbox.list(query=query, **opts(service)).next_items()] == [created.sandbox_id]
        created.set_timeout(600)
        ran = created.commands.run('echo "$(whoami) $(id -u) $(pwd)"; echo err >&2')
        assert (ran.stdout, ran.stderr, ran.exit_code) == ("user 1000 /home/user\n", "err\n", 0)
        with pytest.raises(CommandExitException) as failed:
            created.commands.run("exit 5")
        assert failed.value.exit_code == 5
        blob = bytes(range(256)) * 4
        assert created.files.write("data/blob.bin", blob).path == "/home/user/data/blob.bin"
        assert bytes(created.files.read("/home/user/data/blob.bin", format="bytes")) == blob
        created.files.write("data/note.txt", "héllo\n")
        assert created.files.read("data/note.txt") == "héllo\n"
        listed = {(entry.name, entry.type) for entry in created.files.list("data")}
        assert listed == {("blob.bin", FileType.FILE), ("note.txt", FileType.FILE)}
        assert (
            created.commands.run("sha256sum < data/blob.bin").stdout.split()[0]
            == (created.commands.run("cat data/blob.bin | sha256sum").stdout.split()[0])
        )
        sleeper = created.commands.run("sleep 60", background=True)
        assert sleeper.pid in [process.pid for process in created.commands.list()]
        assert created.commands.kill(sleeper.pid) is True
    finally:
        assert created.kill() is True
    assert not created.is_running()


async def test_the_async_sdk_over_kubernetes(service: Running) -> None:
    created = await AsyncSandbox.create(**opts(service))
    try:
        assert (await created.commands.run("echo hi; echo there >&2")).stderr == "there\n"
        await created.files.write("x.txt", "round trip")
        assert await created.files.read("x.txt") == "round trip"
        handle = await created.commands.run("read line; echo got $line", background=True, stdin=True)
        await created.commands.send_stdin(handle.pid, "it\n")
        assert (await handle.wait()).stdout == "got it\n"
    finally:
        assert await created.kill() is True
