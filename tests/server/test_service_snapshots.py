"""Snapshots through the service, backend-neutral: a tree of every kind (binary, empty, names
with bytes that are not UTF-8, symbolic links, modes, a thousand small files) comes back exactly
in a sandbox created from its snapshot, on the local jail, from Docker to the local jail and
back; a truncated, edited or forged snapshot is refused, naming the files, and no sandbox is left;
snapshots are the tenant's, listed, deleted and counted against its bytes."""

from __future__ import annotations

import base64
import io
import json
import re
import tarfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import Running, create, execute, running, settings_for
from support import HAS_BWRAP, SESSION_OWNER, needs

from sandboxes.docker import DockerTemplate
from sandboxes.local import LocalTemplate
from sandboxes.server.backends import ProviderBackend
from sandboxes.server.settings import TenantPolicy

CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}

MAKE_TREE = r"""
set -e
head -c 70000 /dev/urandom > blob.bin
: > empty
printf 'EDIT-ME-%0200d\n' 0 > edit-target.txt
mkdir -p 'odd dir/sub' many
printf x > "$(printf 'odd\377\001name')"
printf y > "$(printf 'new\nline')"
printf 'private\n' > secret && chmod 600 secret
printf '#!/bin/sh\necho run\n' > tool.sh && chmod 755 tool.sh
printf 'group\n' > 'odd dir/sub/shared' && chmod 640 'odd dir/sub/shared'
chmod 750 'odd dir'
ln -s blob.bin link-to-blob
ln -s '../tool.sh' 'odd dir/up-link'
i=0; while [ $i -lt "$SMALL_FILES" ]; do printf "$i" > many/f$i; i=$((i + 1)); done
"""

LISTING = r"""
import hashlib, json, os, stat, sys
out = []
for top, dirs, files in os.walk(b".", followlinks=False):
    for name in dirs + files:
        path = os.path.join(top, name)
        info = os.lstat(path)
        entry = {"path": path.hex(), "mode": stat.S_IMODE(info.st_mode)}
        if stat.S_ISLNK(info.st_mode):
            entry.update(type="link", target=os.readlink(path).hex())
        elif stat.S_ISDIR(info.st_mode):
            entry.update(type="dir", mode=entry["mode"] | 0o700)
        else:
            with open(path, "rb") as fh:
                entry.update(type="file", sha256=hashlib.sha256(fh.read()).hexdigest(), size=info.st_size)
        out.append(entry)
print(json.dumps(sorted(out, key=lambda e: e["path"])))
"""
"""Every entry under the working directory, names as hex (any byte), as a sandbox sees it."""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    needs(HAS_BWRAP, "bubblewrap is not installed")
    owner = f"{SESSION_OWNER}-snap-{uuid.uuid4().hex[:6]}"
    templates: dict[str, Any] = {"default": LocalTemplate(default_timeout=60)}
    settings = settings_for(
        tmp_path_factory.mktemp("snap"),
        owner=owner,
        templates=templates,
        tenants={"bob": TenantPolicy(max_snapshot_bytes=20_000)},
    )
    with running(settings) as svc:
        yield svc


@pytest.fixture
def client(service: Running) -> Iterator[httpx.Client]:
    with service.client("alice") as client:
        yield client


def _listing(client: httpx.Client, sandbox_id: str) -> list[dict[str, Any]]:
    stdin = base64.b64encode(LISTING.encode()).decode()
    result = execute(client, sandbox_id, "python3 -", stdin_b64=stdin)
    assert result["exit_code"] == 0, result
    listed: list[dict[str, Any]] = json.loads(result["output"])
    return listed


def _made(client: httpx.Client, template: str = "default", small_files: int = 1000) -> str:
    """A sandbox with the tree of every kind; ``small_files``: how many (a container's restore
    puts each through three commands of its own: fewer there)."""
    sandbox_id = create(client, template=template)["id"]
    made = execute(client, sandbox_id, MAKE_TREE, env={"SMALL_FILES": str(small_files)})
    assert made["exit_code"] == 0, made
    return sandbox_id


def _snapshot(client: httpx.Client, sandbox_id: str) -> dict[str, Any]:
    response = client.post(f"/v1/sandboxes/{sandbox_id}/snapshots", json={})
    assert response.status_code == 201, response.text
    taken: dict[str, Any] = response.json()
    return taken


def _restored(client: httpx.Client, snapshot_id: str, template: str = "default") -> str:
    return create(client, template=template, snapshot=snapshot_id)["id"]


def _store(service: Running) -> Path:
    return Path(service.registry.snapshots.directory)


def test_every_kind_of_file_comes_back_exactly(service: Running, client: httpx.Client) -> None:
    source = _made(client)
    snapshot = _snapshot(client, source)
    assert snapshot["files"] >= 1010
    assert snapshot["paths"] == [client.get(f"/v1/sandboxes/{source}").json()["workdir"]]
    restored = _restored(client, snapshot["id"])
    expected = _listing(client, source)
    assert len(expected) >= 1010
    assert _listing(client, restored) == expected
    listed = [item["id"] for item in client.get("/v1/snapshots").json()["snapshots"]]
    assert snapshot["id"] in listed
    assert client.get(f"/v1/snapshots/{snapshot['id']}").json()["bytes"] == snapshot["bytes"]


def test_a_truncated_snapshot_is_refused_naming_the_files(service: Running, client: httpx.Client) -> None:
    snapshot = _snapshot(client, _made(client))
    tar = next(_store(service).glob(f"*/{snapshot['id']}/0.tar"))
    tar.write_bytes(tar.read_bytes()[: tar.stat().st_size // 2])
    before = len(client.get("/v1/sandboxes").json()["sandboxes"])
    refused = client.post("/v1/sandboxes", json={"snapshot": snapshot["id"]})
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert body["error"] == "snapshot_mismatch"
    assert re.search(r"\d+ entries differ: many/f\d+: missing; many/f\d+: missing", body["message"]), body
    assert len(client.get("/v1/sandboxes").json()["sandboxes"]) == before


def test_an_edited_snapshot_is_refused_naming_the_file(service: Running, client: httpx.Client) -> None:
    snapshot = _snapshot(client, _made(client))
    tar = next(_store(service).glob(f"*/{snapshot['id']}/0.tar"))
    data = tar.read_bytes()
    tar.write_bytes(data.replace(b"EDIT-ME-", b"EDITED!-", 1))
    refused = client.post("/v1/sandboxes", json={"snapshot": snapshot["id"]})
    assert refused.status_code == 422, refused.text
    assert refused.json()["message"].count(": sha256 differ") == 1
    assert "edit-target.txt: sha256 differ" in refused.json()["message"]


def test_a_member_the_manifest_does_not_name_is_refused(service: Running, client: httpx.Client) -> None:
    source = _made(client, small_files=3)
    snapshot = _snapshot(client, source)
    assert client.delete(f"/v1/sandboxes/{source}").status_code == 204
    tar_path = next(_store(service).glob(f"*/{snapshot['id']}/0.tar"))
    forged = io.BytesIO()
    with tarfile.open(tar_path) as kept, tarfile.open(fileobj=forged, mode="w", format=tarfile.PAX_FORMAT) as out:
        for member in kept:
            out.addfile(member, kept.extractfile(member) if member.isreg() else None)
        planted = tarfile.TarInfo("planted.sh")
        planted.size, planted.mode = 5, 0o755
        out.addfile(planted, io.BytesIO(b"evil\n"))
    tar_path.write_bytes(forged.getvalue())
    before = len(client.get("/v1/sandboxes").json()["sandboxes"])
    refused = client.post("/v1/sandboxes", json={"snapshot": snapshot["id"]})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"] == "snapshot_mismatch"
    assert "planted.sh: not in the manifest" in refused.json()["message"]
    assert len(client.get("/v1/sandboxes").json()["sandboxes"]) == before


def test_a_local_snapshot_and_restore_are_one_pass_each(
    service: Running, client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local jail's snapshot is written by its exec helper as it reads the files, and a
    restore is verified as it is written, so neither asks the sandbox for an archive (a tar
    spooled, then read again; a restored tree archived again to compare)."""
    source = _made(client, small_files=3)
    asked: list[str] = []
    monkeypatch.setattr(ProviderBackend, "open_archive", lambda _self, _sandbox, path: asked.append(path))
    restored = _restored(client, _snapshot(client, source)["id"])
    assert asked == []
    assert _listing(client, restored) == _listing(client, source)
    for sandbox_id in (source, restored):
        assert client.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204


def test_a_local_snapshot_of_proc_holds_what_its_pseudo_files_read(service: Running, client: httpx.Client) -> None:
    """A local jail's snapshot is made inside it, as a container's: its ``/proc`` is reachable,
    and a pseudo-file, whose size says 0 bytes, is kept as a read of it gives it, the same bytes
    the sandbox's own ``cat`` reads."""
    sandbox_id = create(client)["id"]
    top = "/proc/sys/kernel/random"
    response = client.post(f"/v1/sandboxes/{sandbox_id}/snapshots", json={"workspace": False, "paths": [top]})
    assert response.status_code == 201, response.text
    tar_path = next(_store(service).glob(f"*/{response.json()['id']}/0.tar"))
    with tarfile.open(tar_path) as kept:
        members = {member.name: member for member in kept}
        poolsize = kept.extractfile(members["poolsize"])
        assert poolsize is not None
        held = poolsize.read()
    read = execute(client, sandbox_id, f"cat {top}/poolsize")
    assert read["exit_code"] == 0, read
    assert held == read["output"].encode()
    assert held.strip().isdigit()
    assert members["boot_id"].size == 37  # a uuid and its newline, where its size says 0
    assert client.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204


def test_a_local_snapshot_of_the_jails_tmp_comes_back_in_a_new_sandboxs_tmp(client: httpx.Client) -> None:
    """A path outside a local sandbox's root (its jail's own ``/tmp``, which the host holds
    elsewhere) is kept and restored by the jail's exec helper, as a container's is."""
    source = create(client)["id"]
    made = execute(client, source, "mkdir -p /tmp/kept/sub && printf kept > /tmp/kept/sub/f && ln -s sub/f /tmp/kept/l")
    assert made["exit_code"] == 0, made
    response = client.post(f"/v1/sandboxes/{source}/snapshots", json={"workspace": False, "paths": ["/tmp/kept"]})
    assert response.status_code == 201, response.text
    assert response.json()["files"] == 3, response.json()  # sub, sub/f and l
    restored = _restored(client, response.json()["id"])
    read = execute(client, restored, "cat /tmp/kept/l && readlink /tmp/kept/l")
    assert read["output"] == "keptsub/f\n", read
    for sandbox_id in (source, restored):
        assert client.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204


def test_snapshots_are_the_tenants_own_and_count_against_its_bytes(service: Running, client: httpx.Client) -> None:
    snapshot = _snapshot(client, _made(client))
    with service.client("bob") as bob:
        assert bob.get(f"/v1/snapshots/{snapshot['id']}").status_code == 404
        assert bob.delete(f"/v1/snapshots/{snapshot['id']}").status_code == 404
        assert bob.post("/v1/sandboxes", json={"snapshot": snapshot["id"]}).status_code == 404
        big = _made(bob)
        over = bob.post(f"/v1/sandboxes/{big}/snapshots", json={})
        assert (over.status_code, over.json()["error"]) == (403, "quota_exceeded")
        assert bob.get("/v1/snapshots").json()["snapshots"] == []
        assert not any(p.name.startswith(".tmp-") for p in _store(service).glob("*/*"))
    assert client.delete(f"/v1/snapshots/{snapshot['id']}").status_code == 204
    assert client.get(f"/v1/snapshots/{snapshot['id']}").status_code == 404


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory, docker_client: Any, runtime_image: str) -> Iterator[Running]:
    needs(HAS_BWRAP, "bubblewrap is not installed")
    owner = f"{SESSION_OWNER}-snapx-{uuid.uuid4().hex[:6]}"
    docker = DockerTemplate(backend="docker", image=runtime_image, cpus=0.5, memory="256m", labels=CLEANUP)
    templates: dict[str, Any] = {"default": LocalTemplate(default_timeout=60), "docker": docker}
    settings = settings_for(tmp_path_factory.mktemp("snapx"), owner=owner, templates=templates)
    with running(settings, docker_client=docker_client) as svc:
        yield svc


def test_a_docker_snapshot_restores_on_the_local_jail_and_back(mixed: Running) -> None:
    with mixed.client("alice") as client:
        on_docker = _made(client, "docker", small_files=50)
        expected = _listing(client, on_docker)
        on_local = _restored(client, _snapshot(client, on_docker)["id"], "default")
        assert _listing(client, on_local) == expected
        back = _restored(client, _snapshot(client, on_local)["id"], "docker")
        assert _listing(client, back) == expected


def test_snapshots_taken_at_once_are_all_kept_within_the_quota(service: Running, client: httpx.Client) -> None:
    source = _made(client, small_files=10)
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: client.post(f"/v1/sandboxes/{source}/snapshots", json={}), range(3)))
    assert [answer.status_code for answer in answers] == [201, 201, 201], [answer.text for answer in answers]
    for answer in answers:
        assert client.delete(f"/v1/snapshots/{answer.json()['id']}").status_code == 204
