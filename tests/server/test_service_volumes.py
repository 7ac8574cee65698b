"""Tenants' volumes through the service, over the local jail and over Docker: files outlive
the sandbox that wrote them, two sandboxes share one, another tenant can neither see nor
mount it, a mounted volume is not deleted, a read-only mount refuses writes, the quota holds;
through the HTTP API, the client and the CLI. A backend without volumes says why."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from e2b_harness import service_fixture
from service_harness import KEYS, Running, create, execute
from support import SESSION_OWNER

from sandboxes import api
from sandboxes.cli import main as cli_main
from sandboxes.client import SandboxClient
from sandboxes.server.errors import ServiceError
from sandboxes.server.volumes import _volumes_of

CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}


service = service_fixture("vol")


def _volume(client: httpx.Client, **body: Any) -> dict[str, Any]:
    name = f"v{uuid.uuid4().hex[:10]}"
    response = client.post("/v1/volumes", json={"name": name, **body})
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    assert created["name"] == name
    return created


def _mounted(client: httpx.Client, name: str, path: str = "/mnt/data", **mount: Any) -> dict[str, Any]:
    return create(client, volumes=[{"name": name, "path": path, **mount}])


def _delete(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    assert client.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204


def test_files_outlive_the_sandbox_that_wrote_them(service: Running) -> None:
    with service.client() as client:
        volume = _volume(client)
        first = _mounted(client, volume["name"])
        wrote = execute(client, first["id"], "printf 'kept\\n' > /mnt/data/notes.txt && mkdir -p /mnt/data/d && id -u")
        assert wrote["exit_code"] == 0, wrote
        _delete(client, first)
        second = _mounted(client, volume["name"], "/data/again")
        assert execute(client, second["id"], "cat /data/again/notes.txt")["output"] == "kept\n"
        _delete(client, second)
        assert client.delete(f"/v1/volumes/{volume['name']}").status_code == 204


def test_two_sandboxes_share_one_volume_and_a_read_only_mount_refuses_writes(service: Running) -> None:
    with service.client() as client:
        volume = _volume(client)
        writer = _mounted(client, volume["name"])
        reader = _mounted(client, volume["name"], "/mnt/ro", read_only=True)
        assert execute(client, writer["id"], "echo shared > /mnt/data/s.txt")["exit_code"] == 0
        assert execute(client, reader["id"], "cat /mnt/ro/s.txt")["output"] == "shared\n"
        refused = execute(client, reader["id"], "echo no > /mnt/ro/t.txt")
        assert refused["exit_code"] != 0
        assert "Read-only file system" in refused["output"]
        listed = {v["name"]: v for v in client.get("/v1/volumes").json()["volumes"]}
        assert listed[volume["name"]]["mounted_by"] == sorted([writer["id"], reader["id"]])
        _delete(client, writer)
        _delete(client, reader)
        assert client.delete(f"/v1/volumes/{volume['name']}").status_code == 204


def test_another_tenant_can_neither_see_nor_mount_nor_delete_it(service: Running) -> None:
    with service.client() as alice, service.client("bob") as bob:
        volume = _volume(alice)
        assert volume["name"] not in {v["name"] for v in bob.get("/v1/volumes").json()["volumes"]}
        refused = bob.post("/v1/sandboxes", json={"volumes": [{"name": volume["name"], "path": "/mnt/x"}]})
        assert refused.status_code == 404, refused.text  # as a volume that does not exist
        assert refused.json()["error"] == "not_found"
        assert bob.delete(f"/v1/volumes/{volume['name']}").status_code == 404
        same_name = bob.post("/v1/volumes", json={"name": volume["name"]})  # bob's own, apart from alice's
        assert same_name.status_code == 201, same_name.text
        mine = _mounted(bob, volume["name"])
        assert execute(bob, mine["id"], "ls -A /mnt/data")["output"] == ""  # not alice's files
        _delete(bob, mine)
        assert bob.delete(f"/v1/volumes/{volume['name']}").status_code == 204
        assert alice.delete(f"/v1/volumes/{volume['name']}").status_code == 204


def test_a_mounted_volume_is_not_deleted_and_the_quota_holds(service: Running) -> None:
    with service.client() as client:
        volume = _volume(client, size_limit=1 << 20)
        sandbox = _mounted(client, volume["name"])
        refused = client.delete(f"/v1/volumes/{volume['name']}")
        assert refused.status_code == 409, refused.text
        assert sandbox["id"] in refused.json()["message"]
        assert execute(client, sandbox["id"], "echo still > /mnt/data/x && cat /mnt/data/x")["output"] == "still\n"
        _delete(client, sandbox)
        assert client.delete(f"/v1/volumes/{volume['name']}").status_code == 204
        assert client.delete(f"/v1/volumes/{volume['name']}").status_code == 404
        over = client.post("/v1/volumes", json={"name": "huge", "size_limit": 11 << 30})
        assert over.status_code == 403, over.text
        assert over.json()["error"] == "quota_exceeded"
        twice = _volume(client)
        again = client.post("/v1/volumes", json={"name": twice["name"]})
        assert again.status_code == 409, again.text
        for path, status in (("/", 403), ("/mnt/..", 403), ("relative", 422)):
            bad = client.post("/v1/sandboxes", json={"volumes": [{"name": twice["name"], "path": path}]})
            assert bad.status_code == status, (path, bad.text)
        one_path = [{"name": twice["name"], "path": "/mnt/a"}, {"name": twice["name"], "path": "/mnt//a/"}]
        assert client.post("/v1/sandboxes", json={"volumes": one_path}).status_code == 409
        odd = _mounted(client, twice["name"], "/mnt/x/../odd: name")  # normalized; a colon is a name's
        assert execute(client, odd["id"], "echo ok > '/mnt/odd: name/f' && cat '/mnt/odd: name/f'")["output"] == "ok\n"
        _delete(client, odd)
        assert client.delete(f"/v1/volumes/{twice['name']}").status_code == 204


def test_a_volume_is_not_deleted_while_a_sandbox_that_mounts_it_is_being_created(service: Running) -> None:
    """Such a sandbox is held by no one yet: the creation itself holds the volume."""
    with service.client() as client:
        volume = _volume(client)
        with service.registry.volumes.mounting("alice", [volume["name"]]):  # as `Registry.create` does
            refused = client.delete(f"/v1/volumes/{volume['name']}")
            assert refused.status_code == 409, refused.text
            assert "being created" in refused.json()["message"]
        assert client.delete(f"/v1/volumes/{volume['name']}").status_code == 204


def test_the_client_and_the_cli_manage_volumes(service: Running, capsys: pytest.CaptureFixture[str]) -> None:
    name = f"c{uuid.uuid4().hex[:10]}"
    flags = ["--url", service.url, "--api-key", KEYS["alice"]]
    assert cli_main(["volume", "create", name, "--size", "4096", *flags]) == 0
    assert capsys.readouterr().out == f"{name}\n"
    with SandboxClient(service.url, KEYS["alice"]) as client:
        assert {v.name: v.size_limit for v in client.volumes()}[name] == 4096
        with client.create(volumes=[api.VolumeMount(name=name, path="/mnt/c")]) as sandbox:
            assert sandbox.execute("echo via-client > /mnt/c/f && cat /mnt/c/f").output == "via-client\n"
            assert cli_main(["volume", "rm", name, *flags]) == 1  # mounted
            assert "mounted by" in capsys.readouterr().err
        assert cli_main(["volume", "ls", *flags]) == 0
        assert capsys.readouterr().out.startswith(f"{name}  default  ")
        assert cli_main(["volume", "rm", name, *flags]) == 0
        assert name not in {v.name for v in client.volumes()}


def test_a_backend_without_volumes_says_why() -> None:
    backend: Any = SimpleNamespace(provider=object(), template=SimpleNamespace(backend="ssh"))
    with pytest.raises(ServiceError) as refused:
        _volumes_of(backend)
    assert (refused.value.code, refused.value.status) == ("unavailable", 501)
    assert "unavailable on the ssh backend: an SSH sandbox is a pooled user" in refused.value.message
