"""Over real HTTP, local and Docker backends: hostile archives. ``PUT /archive`` must not write
through symlinks the archive makes, nor outside what the sandbox user may write; a sparse or
compressed archive may not expand beyond a bound on the service host's disk (and a legitimate
sparse one arrives intact); ``GET /archive`` gives only what the sandbox user may read."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import Running, create, error_of, execute, running, settings_for
from support import SESSION_OWNER

from sandboxes.docker import DockerTemplate

EXPANSION = 16 << 20
"""The services' ``max_archive_expansion`` here."""


def _tar(*members: tuple[str, bytes | str | None]) -> bytes:
    """Members in order: bytes is a file, a str a symlink to it, None a directory."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, what in members:
            info = tarfile.TarInfo(name)
            if what is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            elif isinstance(what, str):
                info.type, info.linkname = tarfile.SYMTYPE, what
                archive.addfile(info)
            else:
                info.size = len(what)
                archive.addfile(info, io.BytesIO(what))
    return buffer.getvalue()


def _sparse_tar(tmp_path: Path, hole: int, data: bytes = b"end\n") -> bytes:
    """A GNU sparse tar (made by GNU tar) of one file: ``hole`` zero bytes, then ``data``."""
    source = tmp_path / "sparse-src"
    source.mkdir(exist_ok=True)
    sparse = source / "sparse.bin"
    with open(sparse, "wb") as fh:
        fh.seek(hole)
        fh.write(data)
    subprocess.run(
        ["tar", "--format=gnu", "--sparse", "-cf", str(tmp_path / "sparse.tar"), "-C", str(source), "sparse.bin"],
        check=True,
    )
    return (tmp_path / "sparse.tar").read_bytes()


def _put(client: httpx.Client, sandbox: dict[str, Any], path: str, content: bytes) -> httpx.Response:
    return client.put(f"/v1/sandboxes/{sandbox['id']}/archive", params={"path": path}, content=content)


# ---------------------------------------------------------------------- local


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    settings = settings_for(
        tmp_path_factory.mktemp("archive"), max_archive_members=1000, max_archive_expansion=EXPANSION
    )
    with running(settings) as svc:
        yield svc


@pytest.fixture(scope="module")
def local_client(local: Running) -> Iterator[httpx.Client]:
    with local.client("alice") as client:
        yield client


@pytest.fixture(scope="module")
def local_sandbox(local_client: httpx.Client) -> Iterator[dict[str, Any]]:
    sandbox = create(local_client)
    yield sandbox
    local_client.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_a_jails_own_tmp_is_archived_by_its_exec_helper(
    local_client: httpx.Client, local_sandbox: dict[str, Any]
) -> None:
    """A local jail's ``/tmp`` is its own, not the host's: its archive is made in the jail, as a
    container's is, with the same answers (a missing path 404)."""
    sandbox_id = local_sandbox["id"]
    made = execute(
        local_client, sandbox_id, "mkdir -p /tmp/kept/s && printf hi > /tmp/kept/s/f && ln -s f /tmp/kept/s/l"
    )
    assert made["exit_code"] == 0, made
    url = f"/v1/sandboxes/{sandbox_id}/archive"
    tree = local_client.get(url, params={"path": "/tmp/kept"})
    assert tree.status_code == 200, tree.text[:200]
    with tarfile.open(fileobj=io.BytesIO(tree.content)) as archive:
        members = {m.name: m for m in archive.getmembers()}
        assert set(members) == {"kept", "kept/s", "kept/s/f", "kept/s/l"}
        assert members["kept/s/l"].linkname == "f"
        extracted = archive.extractfile("kept/s/f")
        assert extracted is not None
        assert extracted.read() == b"hi"
    missing = local_client.get(url, params={"path": "/tmp/missing"})
    assert (missing.status_code, error_of(missing)) == (404, "file_not_found")


BAD_LINKS = [
    ("absolute", [("l", "/usr/bin"), ("keep", b"x")]),
    ("escaping", [("d", None), ("d/l", "../../.."), ("keep", b"x")]),
    ("through an earlier link", [("l", "sub"), ("l/env", b"#!/bin/sh\n")]),
    ("through a link, deeper", [("a", None), ("a/l", "."), ("a/l/b/c", b"x")]),
]


@pytest.mark.parametrize("members", [m for _, m in BAD_LINKS], ids=[n for n, _ in BAD_LINKS])
def test_symlink_members_that_lead_elsewhere_are_refused(
    local_client: httpx.Client, local_sandbox: dict[str, Any], members: list[tuple[str, Any]]
) -> None:
    root = local_sandbox["workdir"]
    response = _put(local_client, local_sandbox, f"{root}/links", _tar(*members))
    assert (response.status_code, error_of(response)) == (422, "invalid_path"), response.text


def test_symlinks_inside_the_archive_are_kept(local_client: httpx.Client, local_sandbox: dict[str, Any]) -> None:
    root = local_sandbox["workdir"]
    ok = _tar(("d", None), ("d/f", b"hi"), ("d/l", "f"), ("up", "d/../d/f"), ("l2", "d"), ("l2", b"now a file"))
    response = _put(local_client, local_sandbox, f"{root}/kept", ok)
    assert response.status_code == 204, response.text
    check = execute(local_client, local_sandbox["id"], "cd kept && cat d/l up l2 && readlink d/l")
    assert check["output"] == "hihinow a filef\n"


def test_too_many_members_is_413(local_client: httpx.Client, local_sandbox: dict[str, Any]) -> None:
    many = _tar(*[(f"m/{index}", b"") for index in range(1001)])
    response = _put(local_client, local_sandbox, f"{local_sandbox['workdir']}/many", many)
    assert (response.status_code, error_of(response)) == (413, "too_large"), response.text
    assert "1000 members" in response.json()["message"]
    fits = _tar(*[(f"m/{index}", b"") for index in range(999)])
    assert _put(local_client, local_sandbox, f"{local_sandbox['workdir']}/fits", fits).status_code == 204


def test_sparse_archive_may_not_expand_beyond_the_bound(
    local_client: httpx.Client,
    local_sandbox: dict[str, Any],
    tmp_path: Path,
) -> None:
    bomb = _sparse_tar(tmp_path, 4 * EXPANSION)
    assert len(bomb) < 64 << 10
    started = time.monotonic()
    response = _put(local_client, local_sandbox, f"{local_sandbox['workdir']}/bomb", bomb)
    assert (response.status_code, error_of(response)) == (413, "too_large"), response.text
    assert "beyond its own size" in response.json()["message"]
    assert time.monotonic() - started < 10
    # what was spooled or written before the refusal is within the bound
    written = execute(local_client, local_sandbox["id"], "du -sb bomb 2>/dev/null | cut -f1 || echo 0")["output"]
    assert int(written.strip() or 0) <= EXPANSION + (1 << 20)


def test_compressed_archive_may_not_expand_beyond_the_bound(
    local_client: httpx.Client, local_sandbox: dict[str, Any]
) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:bz2") as archive:
        info = tarfile.TarInfo("zeros")
        info.size = 4 * EXPANSION
        archive.addfile(info, io.BytesIO(bytes(info.size)))
    assert len(buffer.getvalue()) < 64 << 10
    response = _put(local_client, local_sandbox, f"{local_sandbox['workdir']}/zeros", buffer.getvalue())
    assert (response.status_code, error_of(response)) == (413, "too_large"), response.text


def test_a_legitimate_sparse_archive_arrives_intact(
    local_client: httpx.Client, local_sandbox: dict[str, Any], tmp_path: Path
) -> None:
    response = _put(local_client, local_sandbox, f"{local_sandbox['workdir']}/sp", _sparse_tar(tmp_path, 1 << 20))
    assert response.status_code == 204, response.text
    check = execute(
        local_client,
        local_sandbox["id"],
        "wc -c < sp/sparse.bin; tail -c 4 sp/sparse.bin; head -c 4096 sp/sparse.bin | tr -d '\\0' | wc -c",
    )
    assert check["output"].split() == [str((1 << 20) + 4), "end", "0"]


def test_an_archive_cut_short_leaves_the_file_it_would_replace(
    local_client: httpx.Client, local_sandbox: dict[str, Any]
) -> None:
    """A client killed halfway through an upload: the body ends inside a member. The file that
    member would replace must stay whole, not be unlinked and half rewritten."""
    workdir = local_sandbox["workdir"]
    assert execute(local_client, local_sandbox["id"], "printf original > kept.txt")["exit_code"] == 0
    whole = _tar(("kept.txt", b"n" * (1 << 20)))
    cut = whole[: 512 + (1 << 19)]  # the header and half the content
    response = _put(local_client, local_sandbox, workdir, cut)
    assert response.status_code == 422, response.text
    assert execute(local_client, local_sandbox["id"], "cat kept.txt")["output"] == "original"
    assert execute(local_client, local_sandbox["id"], "ls -A | grep -c sandboxes-write")["output"] == "0\n"


# ---------------------------------------------------------------------- docker


@pytest.fixture(scope="module")
def docker_service(
    docker_client: Any, runtime_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    template = DockerTemplate(
        backend="docker",
        image=runtime_image,
        cpus=0.5,
        memory="256m",
        labels={"io.sandboxes.test-session": SESSION_OWNER},
    )
    settings = settings_for(
        tmp_path_factory.mktemp("archive-docker"),
        owner=SESSION_OWNER,
        templates={"default": template},
        max_archive_expansion=EXPANSION,
    )
    with running(settings, docker_client=docker_client) as svc:
        yield svc


@pytest.fixture(scope="module")
def docker_client_http(docker_service: Running) -> Iterator[httpx.Client]:
    with docker_service.client("alice") as client:
        yield client


@pytest.fixture(scope="module")
def container(docker_client_http: httpx.Client) -> Iterator[dict[str, Any]]:
    sandbox = create(docker_client_http)
    yield sandbox
    docker_client_http.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_docker_archive_cannot_replace_files_of_the_read_only_root(
    docker_client_http: httpx.Client, container: dict[str, Any]
) -> None:
    client, sandbox = docker_client_http, container
    before = execute(client, sandbox["id"], "md5sum /usr/bin/env /etc/passwd")["output"]
    through_link = _put(client, sandbox, "/workspace", _tar(("l", "/usr/bin"), ("l/env", b"#!/bin/sh\necho pwned\n")))
    assert (through_link.status_code, error_of(through_link)) == (422, "invalid_path"), through_link.text
    relative = _put(client, sandbox, "/workspace", _tar(("r", "../usr/bin"), ("r/env", b"#!/bin/sh\necho pwned\n")))
    assert (relative.status_code, error_of(relative)) == (422, "invalid_path"), relative.text
    into_etc = _put(client, sandbox, "/etc", _tar(("passwd", b"root::0:0::/root:/bin/sh\n")))
    assert (into_etc.status_code, error_of(into_etc)) == (403, "permission_denied"), into_etc.text
    assert "docker" not in into_etc.text.lower()
    # a directory the sandbox made a link to the root's: refused the same way
    execute(client, sandbox["id"], "ln -sfn /usr/bin /workspace/bin-link")
    into_link = _put(client, sandbox, "/workspace/bin-link", _tar(("env", b"#!/bin/sh\necho pwned\n")))
    assert (into_link.status_code, error_of(into_link)) == (403, "permission_denied"), into_link.text
    assert execute(client, sandbox["id"], "md5sum /usr/bin/env /etc/passwd")["output"] == before


def test_docker_archive_reads_only_what_the_sandbox_user_may(
    docker_client_http: httpx.Client, container: dict[str, Any]
) -> None:
    client, sandbox = docker_client_http, container
    url = f"/v1/sandboxes/{sandbox['id']}/archive"
    shadow = client.get(url, params={"path": "/etc/shadow"})
    assert (shadow.status_code, error_of(shadow)) == (403, "permission_denied"), shadow.text[:200]
    whole = client.get(url, params={"path": "/etc"})
    assert whole.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(whole.content)) as archive:
        names = archive.getnames()
    assert "etc/passwd" in names
    assert "etc/shadow" not in names
    missing = client.get(url, params={"path": "/workspace/missing"})
    assert (missing.status_code, error_of(missing)) == (404, "file_not_found")
    execute(client, sandbox["id"], "mkdir -p /workspace/t/s && echo hi > /workspace/t/s/f && ln -s f /workspace/t/s/l")
    tree = client.get(url, params={"path": "/workspace/t"})
    with tarfile.open(fileobj=io.BytesIO(tree.content)) as archive:
        members = {m.name: m for m in archive.getmembers()}
        assert set(members) == {"t", "t/s", "t/s/f", "t/s/l"}
        assert members["t/s/l"].linkname == "f"
        extracted = archive.extractfile("t/s/f")
        assert extracted is not None
        assert extracted.read() == b"hi\n"


def test_docker_sparse_archive_arrives_intact_and_a_bomb_is_refused(
    docker_client_http: httpx.Client, container: dict[str, Any], tmp_path: Path
) -> None:
    client, sandbox = docker_client_http, container
    ok = _put(client, sandbox, "/workspace/sp", _sparse_tar(tmp_path, 1 << 20))
    assert ok.status_code == 204, ok.text
    check = execute(client, sandbox["id"], "wc -c < sp/sparse.bin; tail -c 4 sp/sparse.bin")
    assert check["output"].split() == [str((1 << 20) + 4), "end"]
    bomb = _put(client, sandbox, "/workspace/bomb", _sparse_tar(tmp_path, 4 * EXPANSION))
    assert (bomb.status_code, error_of(bomb)) == (413, "too_large"), bomb.text


def test_docker_archive_does_not_follow_the_sandboxs_own_symlinks(
    docker_client_http: httpx.Client, container: dict[str, Any]
) -> None:
    """The archive is clean; the sandbox made ``sub -> /etc`` beforehand. Extracting as root
    (the daemon's ``put_archive``) wrote ``/etc/evil`` into the read-only root."""
    client, sandbox = docker_client_http, container
    execute(client, sandbox["id"], "ln -sfn /etc /workspace/sub && ln -sfn /usr/bin /workspace/bin")
    for member in ("sub/evil", "bin/evil"):
        response = _put(client, sandbox, "/workspace", _tar((member, b"pwned")))
        assert (response.status_code, error_of(response)) == (403, "permission_denied"), response.text
    assert execute(client, sandbox["id"], "ls /etc/evil /usr/bin/evil 2>&1; true")["output"].count("No such file") == 2


def test_docker_archive_extracts_where_the_sandbox_user_may_write(
    docker_client_http: httpx.Client, container: dict[str, Any]
) -> None:
    """A tmpfs under the read-only root (``/tmp``) takes an archive, big members included, owned
    by the sandbox user; a symlink the sandbox made to a root-owned file is no way in."""
    client, sandbox = docker_client_http, container
    big = bytes(range(256)) * (40 << 10)  # 10 MiB
    execute(client, sandbox["id"], "ln -sfn /etc/passwd /tmp/victim")
    response = _put(client, sandbox, "/tmp/in", _tar(("d", None), ("d/big.bin", big), ("d/l", "big.bin")))
    assert response.status_code == 204, response.text
    response = _put(client, sandbox, "/tmp", _tar(("victim", b"mine")))  # written as the sandbox user
    assert (response.status_code, error_of(response)) == (403, "permission_denied"), response.text
    check = execute(
        client, sandbox["id"], "stat -c '%U %s' /tmp/in/d/big.bin; readlink /tmp/in/d/l; md5sum < /tmp/in/d/big.bin"
    )
    lines = check["output"].splitlines()
    assert lines[:2] == [f"sandbox {len(big)}", "big.bin"]
    assert lines[2].split()[0] == hashlib.md5(big).hexdigest()
    assert "root:" in execute(client, sandbox["id"], "head -1 /etc/passwd")["output"]
