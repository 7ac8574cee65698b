"""Over real HTTP with an ``ssh`` template: sandboxes as workspaces on a `sandboxes/ssh-vm`
container reached on loopback (hosts and keys from the service's config), through the same
provider adapter as the other backends; archives through the sandbox's own commands; and a
``kill -9`` of the service followed by a restart that adopts the workspaces from their records
and reaps the expired."""

from __future__ import annotations

import io
import shlex
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import (
    KEYS,
    UNTHROTTLED,
    Running,
    ServiceProcess,
    assert_an_archive_streams_whole,
    create,
    execute,
    heartbeat,
    heartbeat_stopped,
    running,
    settings_for,
    start_process,
    subprocess_config,
    wait_beating,
    wait_until_expired,
)
from ssh_fixtures import SSHVM, start_vm
from test_service_archive_bound import assert_pseudo_files_are_archived_as_read
from test_service_snapshot_helper import counting_restore
from test_service_snapshots import _listing, _snapshot

from sandboxes.client import RemoteSandbox, SandboxClient
from sandboxes.local import LocalTemplate
from sandboxes.ssh import SSHTemplate
from sandboxes.testing import SandboxConformance


@pytest.fixture(scope="module")
def vm(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHVM]:
    machine = start_vm(tmp_path_factory.mktemp("service-ssh"))
    yield machine
    machine.stop()


def _template(vm: SSHVM, ws_root: str) -> dict[str, Any]:
    """As an operator writes it in the config file: the host, its key file, its known_hosts."""
    host = vm.config_host(vm.known_hosts.parent / f"id-{vm.port}")
    return {
        "backend": "ssh",
        "hosts": [host],
        "workspace_root": ws_root,
        "cpus": 0.5,
        "memory": "256m",
        "default_timeout": 30,
    }


def _on_vm(vm: SSHVM, command: str) -> str:
    result = vm.docker.exec_run(["sh", "-c", command])
    return str(result.output.decode())


@pytest.fixture(scope="module")
def ws_root() -> str:
    return f"/tmp/svc-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def service(vm: SSHVM, ws_root: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    settings = settings_for(
        tmp_path_factory.mktemp("ssh"),
        templates={"default": SSHTemplate.model_validate(_template(vm, ws_root))},
        tenants=UNTHROTTLED,  # the conformance suite below runs through this service
    )
    with running(settings) as svc:
        yield svc


@pytest.fixture(scope="module")
def client(service: Running) -> Iterator[httpx.Client]:
    with service.client("alice") as client:
        yield client


def test_the_template_comes_from_the_config_file_format(vm: SSHVM, ws_root: str, tmp_path: Path) -> None:
    settings = settings_for(tmp_path, templates={"vm": _template(vm, ws_root)})
    template = settings.templates["vm"]
    assert isinstance(template, SSHTemplate)
    assert template.provider_config(1 << 20).hosts[0].port == vm.port


def test_create_execute_delete(client: httpx.Client, vm: SSHVM, ws_root: str) -> None:
    sandbox = create(client, env={"GREETING": "hello"})
    assert sandbox["backend"] == "ssh"
    assert sandbox["workdir"].startswith(f"{ws_root}/")
    result = execute(client, sandbox["id"], 'id -un; pwd; echo "$GREETING"')
    user, cwd, greeting = result["output"].split()
    assert user.startswith("sbx-")  # a user leased from the VM's pool, not the login user
    assert (cwd, greeting) == (sandbox["workdir"], "hello")
    assert _on_vm(vm, f"test -d {sandbox['workdir']} && echo yes") == "yes\n"
    assert client.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
    assert _on_vm(vm, f"test -d {sandbox['workdir']} && echo yes || echo gone") == "gone\n"
    assert client.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 404


def test_files_and_archive_round_trip(client: httpx.Client) -> None:
    sandbox = create(client)
    base = f"/v1/sandboxes/{sandbox['id']}"
    try:
        work = sandbox["workdir"]
        client.post(f"{base}/files/write", json={"file_path": f"{work}/t/a.txt", "content": "alpha\n"})
        archive = client.get(f"{base}/archive", params={"path": f"{work}/t"})
        assert archive.status_code == 200, archive.text
        with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
            assert sorted(tar.getnames()) == ["t", "t/a.txt"]
        put = client.put(f"{base}/archive", params={"path": f"{work}/copy"}, content=archive.content)
        assert put.status_code == 204, put.text
        assert execute(client, sandbox["id"], "cat copy/t/a.txt")["output"] == "alpha\n"
        assert client.get(f"{base}/archive", params={"path": f"{work}/missing"}).status_code == 404
    finally:
        client.delete(base)


def test_a_pseudo_file_is_archived_as_a_read_gives_it(client: httpx.Client) -> None:
    sandbox = create(client)
    try:
        assert_pseudo_files_are_archived_as_read(client, sandbox)
    finally:
        client.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_an_archive_bigger_than_any_command_output_streams_whole(client: httpx.Client, service: Running) -> None:
    """The archive streams raw on a channel of its own: it is not an `execute` answer, so it is
    not bounded by the service's output ceiling (nor by base64's inflation of it)."""
    assert_an_archive_streams_whole(client, service.registry.settings.max_output_bytes + (1 << 20))


def test_background_kill_takes_down_the_tree(client: httpx.Client) -> None:
    sandbox = create(client)
    base = f"/v1/sandboxes/{sandbox['id']}/processes"
    try:
        loop = heartbeat("beat")
        process = start_process(client, sandbox["id"], f"(setsid sh -c {shlex.quote(loop)} &); sleep 100")
        wait_beating(client, sandbox["id"], "beat", process=process)
        assert client.delete(f"{base}/{process['id']}").json()["status"] == "killed"
        assert heartbeat_stopped(client, sandbox["id"], "beat")
    finally:
        client.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_kill_9_then_restart_adopts_workspaces_and_reaps_the_rest(vm: SSHVM, tmp_path: Path) -> None:
    root = f"/tmp/k9-{uuid.uuid4().hex[:8]}"
    data_dir = tmp_path / "data"
    service = ServiceProcess(subprocess_config(data_dir, templates={"default": _template(vm, root)}), tmp_path)
    service.start()
    try:
        with service.client("alice") as alice:
            kept = create(alice, ttl=300)
            execute(alice, kept["id"], "echo persisted > file.txt")
            stateless = create(alice, ttl=300, labels={"role": "stateless"})
            doomed = create(alice, ttl=2)
        (data_dir / "state" / f"{stateless['id']}.json").unlink()  # as if killed before writing it
        service.kill()
        wait_until_expired(doomed)  # while nobody runs
        service.start()
        with service.client("alice") as alice:
            listed = {s["id"]: s for s in alice.get("/v1/sandboxes").json()["sandboxes"]}
            assert set(listed) == {kept["id"], stateless["id"]}
            assert listed[stateless["id"]]["labels"] == {"role": "stateless"}  # from its record
            assert execute(alice, kept["id"], "cat file.txt")["output"] == "persisted\n"
            assert alice.get(f"/v1/sandboxes/{doomed['id']}").status_code == 404
            assert _on_vm(vm, f"test -d {doomed['workdir']} && echo yes || echo gone") == "gone\n"
            for sandbox_id in (kept["id"], stateless["id"]):
                assert alice.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204
        assert _on_vm(vm, f"ls -A {root}").split() == []
    finally:
        service.stop()


def test_a_host_down_at_start_leaves_the_rest_serving_and_its_workspaces_come_back(vm: SSHVM, tmp_path: Path) -> None:
    """A template whose host cannot be reached when the service starts does not stop it: the
    other templates serve, that host's sandboxes answer 503 and keep their records (nothing is
    dropped on a guess), and a sweep after the host is back adopts them."""
    template = _template(vm, f"/tmp/down-{uuid.uuid4().hex[:8]}")
    template["hosts"][0]["connect_timeout"] = 2
    settings = settings_for(tmp_path, templates={"default": LocalTemplate(default_timeout=30), "vm": template})
    with running(settings) as first, first.client("alice") as alice:
        kept = create(alice, template="vm", ttl=600)
        execute(alice, kept["id"], "echo kept > file.txt")
    vm.docker.pause()
    try:
        with running(settings) as second, second.client("alice") as alice, second.client("bob") as bob:
            local = create(alice)
            assert execute(alice, local["id"], "echo up")["output"] == "up\n"
            down = alice.get(f"/v1/sandboxes/{kept['id']}")
            assert (down.status_code, down.json()["error"]) == (503, "backend_unavailable"), down.text
            assert bob.get(f"/v1/sandboxes/{kept['id']}").status_code == 404  # still only alice's
            vm.docker.unpause()
            deadline = time.monotonic() + 60
            while alice.get(f"/v1/sandboxes/{kept['id']}").status_code != 200:
                assert time.monotonic() < deadline, "the workspace was not adopted once its host was back"
                second.sweep()
            assert execute(alice, kept["id"], "cat file.txt")["output"] == "kept\n"
            assert alice.delete(f"/v1/sandboxes/{kept['id']}").status_code == 204
    finally:
        vm.docker.reload()
        if vm.docker.status == "paused":
            vm.docker.unpause()


@pytest.fixture(scope="module")
def remote(service: Running) -> Iterator[RemoteSandbox]:
    with SandboxClient(service.url, KEYS["alice"]) as sandbox_client, sandbox_client.create("default") as sb:
        yield sb


class TestRemoteSandboxOverSSH(SandboxConformance):
    """The client's protocol over an SSH-backed service answers as every other backend."""

    @pytest.fixture
    def backend(self, remote: RemoteSandbox) -> RemoteSandbox:
        return remote

    @pytest.fixture
    def base_dir(self, remote: RemoteSandbox) -> str:
        assert remote.workdir is not None
        return remote.workdir


SIMPLE_TREE = (
    "mkdir -p d/e && printf 'vm\\n' > d/f && chmod 640 d/f && ln -s d/f link && : > empty"
    " && head -c 300000 /dev/urandom > d/e/blob && for i in 1 2 3 4 5; do echo $i > d/e/s$i; done && echo ok"
)


def test_a_snapshot_restores_into_a_new_workspace_through_one_helper_command(
    client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = create(client)["id"]
    made = execute(client, source, SIMPLE_TREE)
    assert made["output"] == "ok\n", made
    snapshot = _snapshot(client, source)
    counts = counting_restore(monkeypatch)
    restored = create(client, snapshot=snapshot["id"])["id"]
    try:
        assert counts == [1]
        assert _listing(client, restored) == _listing(client, source)
    finally:
        for sandbox_id in (source, restored):
            client.delete(f"/v1/sandboxes/{sandbox_id}")
