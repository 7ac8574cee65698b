"""The E2B API's wire pieces on their own: Connect envelopes as the SDK frames them, hostile
request bodies refused with Connect's codes, and envd access tokens that name one tenant's one
sandbox and cannot be bent to another."""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
import subprocess
from pathlib import Path

import pytest
from fastapi.routing import APIRoute
from pydantic import SecretStr
from service_harness import settings_for
from starlette.routing import Match

from sandboxes import _scripts
from sandboxes.local import LocalTemplate
from sandboxes.server.app import create_app
from sandboxes.server.e2b import filesystem
from sandboxes.server.e2b.connect import ConnectError, end_of_stream, envelope, read_envelope
from sandboxes.server.e2b.tokens import SECRET_FILE, E2BSettings, TokenSigner, signing_secret


def test_an_envelope_is_a_flag_a_big_endian_length_and_json() -> None:
    framed = envelope({"event": {"start": {"pid": 7}}})
    flags, length = struct.unpack(">BI", framed[:5])
    assert (flags, length, json.loads(framed[5:])) == (0, len(framed) - 5, {"event": {"start": {"pid": 7}}})
    assert read_envelope(framed) == {"event": {"start": {"pid": 7}}}


def test_the_end_of_a_stream_has_flag_two_and_carries_the_error() -> None:
    assert end_of_stream() == b"\x02\x00\x00\x00\x02{}"
    ended = end_of_stream(ConnectError("deadline_exceeded", "too slow"))
    assert ended[0] == 2
    assert json.loads(ended[5:]) == {"error": {"code": "deadline_exceeded", "message": "too slow"}}


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"", "invalid_argument"),
        (b"\x00\x00\x00", "invalid_argument"),
        (b"\x01\x00\x00\x00\x02{}", "unimplemented"),  # compressed
        (b"\x00\x00\x00\x00\x09{}", "invalid_argument"),  # a length longer than the body
        (b"\x00\x00\x00\x00\x01{}", "invalid_argument"),  # a length shorter than the body
        (b"\x00\x00\x00\x00\x02[]", "invalid_argument"),
        (b"\x00\x00\x00\x00\x02\xff\xfe", "invalid_argument"),
    ],
)
def test_a_malformed_request_is_refused_with_connects_code(body: bytes, code: str) -> None:
    with pytest.raises(ConnectError) as refused:
        read_envelope(body)
    assert refused.value.code == code


def test_a_token_names_its_tenant_for_its_sandbox_only() -> None:
    signer = TokenSigner(SecretStr("s3cret"))
    token = signer.token("alice", "sbx1")
    assert signer.tenant_of(token, "sbx1") == "alice"
    assert signer.tenant_of(token, "sbx2") is None
    bob = signer.token("bob", "sbx1").split(".")[0]
    assert signer.tenant_of(f"{bob}.{token.split('.')[1]}", "sbx1") is None  # the MAC binds the tenant
    assert TokenSigner(SecretStr("other")).tenant_of(token, "sbx1") is None
    assert TokenSigner(None).tenant_of(token, "sbx1") is None  # a random secret accepts none of these
    for garbage in ("", ".", "@@@.x", "YWxpY2U", "YWxpY2U.é"):
        assert signer.tenant_of(garbage, "sbx1") is None


def test_the_default_secret_is_made_once_in_the_data_directory_readable_by_its_owner_only(tmp_path: Path) -> None:
    unset = E2BSettings(token_secret=None)
    first = signing_secret(unset, tmp_path / "data")
    assert signing_secret(unset, tmp_path / "data").get_secret_value() == first.get_secret_value()
    made = tmp_path / "data" / SECRET_FILE
    assert stat.S_IMODE(made.stat().st_mode) == 0o600
    assert sorted(path.name for path in made.parent.iterdir()) == [SECRET_FILE]  # no temporary left
    assert len(first.get_secret_value()) == 64
    assert signing_secret(unset, tmp_path / "other").get_secret_value() != first.get_secret_value()
    token = TokenSigner(first).token("alice", "sbx1")
    assert TokenSigner(signing_secret(unset, tmp_path / "data")).tenant_of(token, "sbx1") == "alice"


def test_an_explicit_secret_wins_and_a_secret_others_may_read_is_refused(tmp_path: Path) -> None:
    shared = E2BSettings(token_secret=SecretStr("shared-by-every-replica"))
    assert signing_secret(shared, tmp_path).get_secret_value() == "shared-by-every-replica"
    assert not (tmp_path / SECRET_FILE).exists()
    signing_secret(E2BSettings(token_secret=None), tmp_path)
    os.chmod(tmp_path / SECRET_FILE, 0o644)
    with pytest.raises(RuntimeError, match="may be read by others"):
        signing_secret(E2BSettings(token_secret=None), tmp_path)
    os.chmod(tmp_path / SECRET_FILE, 0o600)
    (tmp_path / SECRET_FILE).write_text("short")
    with pytest.raises(RuntimeError, match="holds no secret"):
        signing_secret(E2BSettings(token_secret=None), tmp_path)


@pytest.mark.parametrize(
    "output",
    ["", "81a4 5 1700000000\n", "zz 5 1700000000 0 0 a b\n", "81a4 5 " + "9" * 400 + " 0 0 a b\n", "81a4 x 1 0 0 a b"],
)
def test_a_malformed_stat_from_the_sandbox_is_an_internal_error(output: str) -> None:
    with pytest.raises(ConnectError) as refused:
        filesystem._one("/f", output)
    assert refused.value.code == "internal"


def test_a_listing_keeps_only_records_framed_as_the_script_frames_them() -> None:
    listed = filesystem._listing("/d", "41ed 4096 1700000000 1000 1000 user user\n./a\0garbage\0")
    assert [(entry["path"], entry["type"], entry["permissions"]) for entry in listed] == [
        ("/d/a", "FILE_TYPE_DIRECTORY", "drwxr-xr-x")
    ]


@pytest.mark.parametrize("batch_fails", [False, True], ids=["batched", "one-by-one"])
def test_the_listing_script_frames_every_entry_even_when_a_batch_stat_fails(tmp_path: Path, batch_fails: bool) -> None:
    """The ``ListDir`` script on the host's ``sh``: one ``stat`` per batch, or (a batch's
    ``stat`` short of an entry, as when one vanished) one per entry; names are never syntax."""
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    names = ["plain", "new\nline", "$(touch pwned)", "sub/inner"]
    for name in names:
        (root / name).write_text("x")
    env = dict(os.environ)
    if batch_fails:
        fake = tmp_path / "bin"
        fake.mkdir()
        real = shutil.which("stat")
        (fake / "stat").write_text(f'#!/bin/sh\n[ "$#" -gt 4 ] && exit 1\nexec {real} "$@"\n')
        (fake / "stat").chmod(0o755)
        env["PATH"] = f"{fake}:{env['PATH']}"
    command = _scripts.command(filesystem.LIST, str(root), "2")
    done = subprocess.run(["sh", "-c", command], capture_output=True, env=env, check=True, timeout=30)
    listed = filesystem._listing("/d", done.stdout.decode())
    assert sorted(entry["path"] for entry in listed) == sorted(f"/d/{name}" for name in [*names, "sub"])
    assert not (root / "pwned").exists()


@pytest.mark.parametrize(
    ("method", "path", "endpoint"),
    [
        ("POST", "/e2b/envd/process.Process/Start", "start"),
        ("GET", "/e2b/envd/files", "read_file"),
        ("POST", "/e2b/envd/files", "write_files"),
        ("POST", "/e2b/envd/filesystem.Filesystem/ListDir", "list_dir"),
        ("POST", "/e2b/envd/filesystem.Filesystem/Stat", "stat_entry"),
        ("POST", "/e2b/envd/process.Process/Nope", "not_served"),
    ],
)
def test_the_hot_envd_routes_are_matched_before_the_documented_ones(
    tmp_path: Path, method: str, path: str, endpoint: str
) -> None:
    """The envd routes of nearly every SDK call come right behind the service's own fast paths
    (each request is matched against the table's routes in order), and each path still reaches
    the route it did; the others stay behind the service's routes."""
    app = create_app(settings_for(tmp_path, owner="wire", templates={"default": LocalTemplate()}))
    table = app.router.routes
    documented = next(i for i, r in enumerate(table) if isinstance(r, APIRoute) and r.path.startswith("/v1/"))
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}
    index, route = next((i, r) for i, r in enumerate(table) if r.matches(scope)[0] == Match.FULL)
    assert isinstance(route, APIRoute)
    assert route.endpoint.__name__ == endpoint
    assert (index < documented) == (endpoint != "not_served"), (index, documented)
