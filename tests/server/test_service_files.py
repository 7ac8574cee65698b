"""Over real HTTP: every file operation route, and tar archives in and out (round trip,
streaming of large content, confinement to the sandbox's root)."""

from __future__ import annotations

import base64
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import Running, create, error_of, execute, running, settings_for


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with running(settings_for(tmp_path_factory.mktemp("files"))) as svc:
        yield svc


@pytest.fixture(scope="module")
def client(service: Running) -> Iterator[httpx.Client]:
    with service.client("alice") as client:
        yield client


@pytest.fixture
def sandbox(client: httpx.Client) -> Iterator[dict[str, Any]]:
    created = create(client)
    yield created
    client.delete(f"/v1/sandboxes/{created['id']}")


def _op(client: httpx.Client, sandbox: dict[str, Any], op: str, **body: Any) -> Any:
    response = client.post(f"/v1/sandboxes/{sandbox['id']}/files/{op}", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_every_file_operation(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    root = sandbox["workdir"]
    assert _op(client, sandbox, "write", file_path=f"{root}/src/a.py", content="alpha\nbeta\n") == {
        "error": None,
        "message": None,
        "path": f"{root}/src/a.py",
    }
    assert _op(client, sandbox, "write", file_path=f"{root}/src/a.py", content="x")["error"] is None
    read = _op(client, sandbox, "read", file_path=f"{root}/src/a.py")
    assert read["file_data"]["content"] == "x"
    _op(client, sandbox, "write", file_path=f"{root}/src/a.py", content="alpha\nbeta\nalpha\n")
    window = _op(client, sandbox, "read", file_path=f"{root}/src/a.py", offset=1, limit=1)
    assert window["file_data"]["content"] == "beta\n"
    assert (window["start_line"], window["end_line"], window["next_offset"]) == (2, 2, 2)
    edit = _op(client, sandbox, "edit", file_path=f"{root}/src/a.py", old_string="alpha", new_string="gamma")
    assert edit["error"] == "multiple_occurrences"
    edit = _op(
        client, sandbox, "edit", file_path=f"{root}/src/a.py", old_string="alpha", new_string="gamma", replace_all=True
    )
    assert (edit["error"], edit["occurrences"]) == (None, 2)
    _op(client, sandbox, "write", file_path=f"{root}/src/b.txt", content="gamma ray\n")
    listing = _op(client, sandbox, "ls", path=f"{root}/src")
    assert [(e["path"], e["is_dir"]) for e in listing["entries"]] == [
        (f"{root}/src/a.py", False),
        (f"{root}/src/b.txt", False),
    ]
    assert listing["entries"][0]["size"] == len("gamma\nbeta\ngamma\n")
    top = _op(client, sandbox, "ls", path=root)
    assert [(e["path"], e["is_dir"], e["size"]) for e in top["entries"]] == [(f"{root}/src/", True, 0)]
    glob = _op(client, sandbox, "glob", pattern="**/*.py", path=root)
    assert glob["matches"] == [{"path": f"{root}/src/a.py", "is_dir": False, "size": None, "modified_at": None}]
    grep = _op(client, sandbox, "grep", pattern="gamma", path=root)
    assert [(m["path"], m["line"], m["text"]) for m in grep["matches"]] == [
        (f"{root}/src/a.py", 1, "gamma"),
        (f"{root}/src/a.py", 3, "gamma"),
        (f"{root}/src/b.txt", 1, "gamma ray"),
    ]
    only_txt = _op(client, sandbox, "grep", pattern="gamma", path=root, glob="*.txt")
    assert [m["path"] for m in only_txt["matches"]] == [f"{root}/src/b.txt"]
    binary = bytes(range(256))
    upload = _op(
        client,
        sandbox,
        "upload",
        files=[
            {"path": f"{root}/bin/blob", "content_b64": base64.b64encode(binary).decode()},
            {"path": "relative", "content_b64": ""},
        ],
    )
    assert upload == [
        {"path": f"{root}/bin/blob", "error": None, "message": None},
        {"path": "relative", "error": "invalid_path", "message": upload[1]["message"]},
    ]
    download = _op(client, sandbox, "download", paths=[f"{root}/bin/blob", f"{root}/missing"])
    assert base64.b64decode(download[0]["content_b64"]) == binary
    assert (download[1]["content_b64"], download[1]["error"]) == (None, "file_not_found")
    assert _op(client, sandbox, "read", file_path=f"{root}/bin/blob")["file_data"]["encoding"] == "base64"
    assert _op(client, sandbox, "delete", file_path=f"{root}/src")["error"] is None
    assert _op(client, sandbox, "ls", path=f"{root}/src")["error"] == "file_not_found"
    # commands see what the file routes wrote
    assert execute(client, sandbox["id"], f"wc -c < {root}/bin/blob")["output"].strip() == "256"


def test_file_errors_are_answers_not_http_failures(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    root = sandbox["workdir"]
    assert _op(client, sandbox, "read", file_path=f"{root}/nope")["error"] == "file_not_found"
    assert _op(client, sandbox, "read", file_path="not/absolute")["error"] == "invalid_path"
    assert _op(client, sandbox, "delete", file_path="/")["error"] == "invalid_path"
    _op(client, sandbox, "write", file_path=f"{root}/f", content="x")
    assert _op(client, sandbox, "write", file_path=f"{root}/f/g", content="x")["error"] == "not_a_directory"


def test_file_request_validation(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    response = client.post(f"/v1/sandboxes/{sandbox['id']}/files/read", json={"path": "/x"})
    assert response.status_code == 422
    assert error_of(response) == "invalid_request"
    upload = {"files": [{"path": f"{sandbox['workdir']}/x", "content_b64": "***"}]}
    response = client.post(f"/v1/sandboxes/{sandbox['id']}/files/upload", json=upload)
    assert response.status_code == 422
    assert error_of(response) == "invalid_request"


# ---------------------------------------------------------------------- archives


def _members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return {member.name: member for member in archive.getmembers()}


def test_archive_round_trip(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    root, sandbox_id = sandbox["workdir"], sandbox["id"]
    big = os.urandom(3 << 20)
    execute(client, sandbox_id, "mkdir -p tree/sub/empty && printf 'hi' > tree/a.txt && ln -s a.txt tree/link")
    client.post(
        f"/v1/sandboxes/{sandbox_id}/files/upload",
        json={"files": [{"path": f"{root}/tree/sub/big.bin", "content_b64": base64.b64encode(big).decode()}]},
    )
    response = client.get(f"/v1/sandboxes/{sandbox_id}/archive", params={"path": f"{root}/tree"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-tar"
    members = _members(response.content)
    assert set(members) == {"tree", "tree/a.txt", "tree/link", "tree/sub", "tree/sub/empty", "tree/sub/big.bin"}
    assert members["tree/link"].issym()
    assert members["tree/link"].linkname == "a.txt"
    assert members["tree/sub/big.bin"].size == len(big)
    assert members["tree/a.txt"].uid == 1000

    put = client.put(f"/v1/sandboxes/{sandbox_id}/archive", params={"path": f"{root}/copy"}, content=response.content)
    assert put.status_code == 204, put.text
    check = execute(client, sandbox_id, "cmp tree/sub/big.bin copy/tree/sub/big.bin && cat copy/tree/link")
    assert check["exit_code"] == 0, check
    assert check["output"] == "hi"
    assert execute(client, sandbox_id, "test -d copy/tree/sub/empty && readlink copy/tree/link")["output"] == "a.txt\n"
    # the sandbox user owns (and may change) what was extracted
    assert execute(client, sandbox_id, "echo more >> copy/tree/a.txt && rm -r copy")["exit_code"] == 0


def test_archive_of_a_single_file_and_streamed_upload(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    root, sandbox_id = sandbox["workdir"], sandbox["id"]
    client.post(f"/v1/sandboxes/{sandbox_id}/files/write", json={"file_path": f"{root}/one.txt", "content": "1"})
    response = client.get(f"/v1/sandboxes/{sandbox_id}/archive", params={"path": f"{root}/one.txt"})
    assert list(_members(response.content)) == ["one.txt"]
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w:gz") as archive:
        for index in range(50):
            data = f"file {index}\n".encode() * 1000
            info = tarfile.TarInfo(f"many/f{index}.txt")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    blob = payload.getvalue()
    chunks = (blob[i : i + 4096] for i in range(0, len(blob), 4096))  # chunked transfer, gzip
    put = client.put(f"/v1/sandboxes/{sandbox_id}/archive", params={"path": f"{root}/in"}, content=chunks)
    assert put.status_code == 204, put.text
    assert execute(client, sandbox_id, "ls in/many | wc -l")["output"].strip() == "50"
    assert execute(client, sandbox_id, "head -1 in/many/f7.txt")["output"] == "file 7\n"


def test_archive_errors(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    root, sandbox_id = sandbox["workdir"], sandbox["id"]
    url = f"/v1/sandboxes/{sandbox_id}/archive"
    missing = client.get(url, params={"path": f"{root}/missing"})
    assert (missing.status_code, error_of(missing)) == (404, "file_not_found")
    outside = client.get(url, params={"path": "/etc"})  # the jail's own, made in it as a container's is
    assert outside.status_code == 200, outside.text
    assert "etc" in _members(outside.content)
    relative = client.get(url, params={"path": "etc"})
    assert (relative.status_code, error_of(relative)) == (422, "invalid_path")
    garbage = client.put(url, params={"path": root}, content=b"this is not a tar" * 100)
    assert (garbage.status_code, error_of(garbage)) == (422, "invalid_request")


def test_archives_leave_out_what_has_no_content(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    """A FIFO asked for is refused without being opened; inside a tree it is left out."""
    root, sandbox_id = sandbox["workdir"], sandbox["id"]
    url = f"/v1/sandboxes/{sandbox_id}/archive"
    made = execute(client, sandbox_id, "mkdir -p pipes/sub && mkfifo pipes/fifo pipes/sub/fifo && echo x > pipes/sub/f")
    assert made["exit_code"] == 0, made
    alone = client.get(url, params={"path": f"{root}/pipes/fifo"})
    assert (alone.status_code, error_of(alone)) == (422, "invalid_path")
    assert set(_members(client.get(url, params={"path": f"{root}/pipes"}).content)) == {
        "pipes",
        "pipes/sub",
        "pipes/sub/f",
    }


def test_archive_of_a_deep_tree(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    """Deeper than the recursion limit: the walk holds one directory open, not a frame and a
    descriptor per level (``os.fwalk`` before answered a broken stream here)."""
    root, sandbox_id = sandbox["workdir"], sandbox["id"]
    deep = "d/" * 1200
    try:
        written = _op(client, sandbox, "write", file_path=f"{root}/{deep}bottom.txt", content="bottom")
        assert written["error"] is None, written
        response = client.get(f"/v1/sandboxes/{sandbox_id}/archive", params={"path": f"{root}/d"})
        assert response.status_code == 200
        members = _members(response.content)
        assert len(members) == 1201
        bottom = members[f"{deep}bottom.txt"]
        assert bottom.isfile()
        assert bottom.size == len("bottom")
    finally:  # rm is not recursion-bound; removing the sandbox's root (shutil.rmtree) is
        execute(client, sandbox_id, "rm -rf d")


def _evil_tar(name: str, data: bytes = b"pwned", kind: bytes = tarfile.REGTYPE, link: str = "") -> bytes:
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, link
        info.size = len(data) if kind == tarfile.REGTYPE else 0
        archive.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return payload.getvalue()


def test_archives_cannot_reach_outside_the_sandbox(
    client: httpx.Client, sandbox: dict[str, Any], tmp_path: Path
) -> None:
    root, sandbox_id = sandbox["workdir"], sandbox["id"]
    url = f"/v1/sandboxes/{sandbox_id}/archive"
    target = tmp_path / "outside"
    target.mkdir()
    (target / "secret").write_text("host secret")
    # a symlink made inside the sandbox, pointing at a host directory
    execute(client, sandbox_id, f"ln -s {target} escape && ln -s {target}/secret escape-file")
    through_link = client.put(url, params={"path": root}, content=_evil_tar("escape/planted"))
    assert through_link.status_code == 422
    assert error_of(through_link) == "invalid_path"
    into_link = client.put(url, params={"path": f"{root}/escape"}, content=_evil_tar("planted"))
    assert into_link.status_code == 422
    dotdot = client.put(url, params={"path": root}, content=_evil_tar("../../planted"))
    assert (dotdot.status_code, error_of(dotdot)) == (422, "invalid_path")
    absolute = client.put(url, params={"path": root}, content=_evil_tar(f"{target}/planted"))
    assert (absolute.status_code, error_of(absolute)) == (422, "invalid_path")
    device = client.put(url, params={"path": root}, content=_evil_tar("dev", kind=tarfile.CHRTYPE))
    assert (device.status_code, error_of(device)) == (422, "invalid_request")
    overwrite = client.put(url, params={"path": root}, content=_evil_tar("escape-file"))
    assert overwrite.status_code == 204  # replaces the link itself, never writes through it
    assert list(target.iterdir()) == [target / "secret"]
    assert (target / "secret").read_text() == "host secret"
    # reading: the link is archived as a link, its target is never read
    read_link = client.get(url, params={"path": f"{root}/escape"})
    assert (read_link.status_code, error_of(read_link)) == (422, "invalid_path")
    whole = _members(client.get(url, params={"path": root}).content)
    assert whole[f"{Path(root).name}/escape"].issym()
    assert not any("secret" in name for name in whole)
