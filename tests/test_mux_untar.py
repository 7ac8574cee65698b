"""The program a restore runs through the exec helper (`sandboxes._helper._untar`), run here as
the sandbox runs it (``python3 -I -S -c`` its shipped text, the tar on stdin): every member
written and answered with its manifest fields; nothing written through a symbolic link, whoever
made it; a link out of the tree, a member past the bounds, a name too long refused by name."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from support import needs

from sandboxes._mux import PYTHON_FLAGS
from sandboxes._mux._shipped import program


def _tar(*members: tuple[str, str, bytes | str]) -> bytes:
    """A tar of (name, kind, content or link target) members, kind ``f``, ``d`` or ``l``."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind == "d":
                info.type, info.mode = tarfile.DIRTYPE, 0o750
                tar.addfile(info)
            elif kind == "l":
                info.type, info.linkname = tarfile.SYMTYPE, str(data)
                tar.addfile(info)
            else:
                assert isinstance(data, bytes)
                info.size, info.mode = len(data), 0o640
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _untar(dest: Path, data: bytes, *, members: int = 100, size: int = 1 << 20) -> list[list[bytes]]:
    argv = [sys.executable, *PYTHON_FLAGS, "-c", program("_untar"), str(dest), str(members), str(size)]
    done = subprocess.run(argv, input=data, capture_output=True, timeout=60, check=False)
    lines = [line.split(b" ") for line in done.stdout.splitlines()]
    assert done.stderr == b""
    assert (done.returncode == 0) == (lines[-1][0] == b"K"), done
    return lines


def _refusal(lines: list[list[bytes]]) -> tuple[str, str, str]:
    code, path, message = lines[-1][1:]
    assert lines[-1][0] == b"E", lines
    return code.decode(), _text(path), _text(message)


def _text(field: bytes) -> str:
    return "" if field == b"-" else bytes.fromhex(field.decode()).decode()


def test_every_member_is_written_and_answered_with_its_manifest_fields(tmp_path: Path) -> None:
    name = "d/odd\udcffname"  # a name that is not UTF-8
    data = _tar(("d", "d", b""), (name, "f", b"content"), ("d/link", "l", "odd\udcffname"), ("empty", "f", b""))
    lines = _untar(tmp_path / "dest", data)
    assert lines[-1] == [b"K", b"4"]
    answered = {bytes.fromhex(line[1].decode()): line[2:] for line in lines if line[0] == b"M"}
    raw = name.encode("utf-8", "surrogateescape")
    digest = hashlib.sha256(b"content").hexdigest().encode()
    assert answered == {
        b"d": [b"d", b"750", b"0", b"-", b"-"],
        raw: [b"f", b"640", b"7", digest, b"-"],
        b"d/link": [b"l", b"777", b"0", b"-", "odd\udcffname".encode("utf-8", "surrogateescape").hex().encode()],
        b"empty": [b"f", b"640", b"0", hashlib.sha256(b"").hexdigest().encode(), b"-"],
    }
    dest = os.fsencode(tmp_path / "dest")
    assert open(dest + b"/" + raw, "rb").read() == b"content"  # noqa: SIM115 (read once)
    assert os.stat(dest + b"/" + raw).st_mode & 0o777 == 0o640
    assert os.stat(dest + b"/d").st_mode & 0o777 == 0o750
    assert os.readlink(dest + b"/d/link") == "odd\udcffname".encode("utf-8", "surrogateescape")
    assert not [entry for entry in os.listdir(dest + b"/d") if entry.startswith(b".sandboxes-write.")]


def test_a_member_through_a_symbolic_link_the_sandbox_made_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "sub").symlink_to(outside)
    for members in ((("sub/planted", "f", b"x"),), (("sub", "d", b""), ("sub/planted", "f", b"x"))):
        code, path, message = _refusal(_untar(tmp_path / "dest", _tar(*members)))
        assert (code, path) == ("invalid_path", "sub" if len(members) == 2 else "sub/planted")
        assert "symbolic link" in message
    assert list(outside.iterdir()) == []


def test_the_destination_is_not_reached_through_a_symbolic_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    code, _, message = _refusal(_untar(tmp_path / "alias" / "dest", _tar(("f", "f", b"x"))))
    assert code == "invalid_path"
    assert "symbolic link" in message
    assert list((tmp_path / "real").iterdir()) == []


def test_a_member_through_a_link_the_archive_made_is_refused(tmp_path: Path) -> None:
    (tmp_path / "dest").mkdir()
    lines = _untar(tmp_path / "dest", _tar(("a", "d", b""), ("l", "l", "a"), ("l/planted", "f", b"x")))
    assert _refusal(lines)[:2] == ("invalid_path", "l/planted")
    assert list((tmp_path / "dest" / "a").iterdir()) == []


def test_links_out_of_the_tree_and_names_too_long_are_refused(tmp_path: Path) -> None:
    for link in ("/etc/passwd", "../../up"):
        assert _refusal(_untar(tmp_path / "dest", _tar(("d/l", "l", link))))[:2] == ("invalid_path", "d/l")
    code, _, message = _refusal(_untar(tmp_path / "dest", _tar(("x" * 300, "f", b"x"))))
    assert code == "invalid_path"
    assert "255" in message


def test_members_and_bytes_past_their_bounds_are_refused(tmp_path: Path) -> None:
    many = _tar(*((f"f{index}", "f", b"x") for index in range(5)))
    assert _refusal(_untar(tmp_path / "a", many, members=4))[0] == "too_large"
    assert _untar(tmp_path / "b", many, members=5)[-1] == [b"K", b"5"]
    big = _tar(("big", "f", b"y" * 5000))
    code, path, _ = _refusal(_untar(tmp_path / "c", big, size=4999))
    assert (code, path) == ("too_large", "big")
    assert not [entry for entry in os.listdir(tmp_path / "c") if entry != "big"]  # no staged file left


def test_a_truncated_tar_is_refused(tmp_path: Path) -> None:
    data = _tar(("one", "f", b"z" * 20000), ("two", "f", b"w"))
    lines = _untar(tmp_path / "dest", data[:9000])
    assert _refusal(lines)[0] == "invalid_request"
    assert not (tmp_path / "dest" / "one").exists()  # staged, never renamed over its name


def test_a_host_link_on_the_way_to_the_destination_is_followed_a_users_is_not(tmp_path_factory: Any) -> None:
    """As a user: a link in a directory the user may not write (``/home -> var/home`` on a VM)
    cannot be the sandbox's, so the destination is reached through it; one in a directory the
    user may write is refused, as it may be."""
    needs(shutil.which("setpriv") is not None and os.geteuid() == 0, "setpriv, and root to drop to a user")
    base = Path(tempfile.mkdtemp(dir="/var/tmp"))  # a path every user may search, unlike pytest's
    try:
        base.chmod(0o755)
        (base / "var" / "home").mkdir(parents=True)
        (base / "home").symlink_to("var/home")  # relative, as on the host
        os.chown(base / "var" / "home", NOBODY, NOBODY)
        (base / "var" / "home" / "mine").symlink_to(base / "var")
        os.lchown(base / "var" / "home" / "mine", NOBODY, NOBODY)
        done = _untar_as(NOBODY, base / "home" / "dest", _tar(("f", "f", b"x")))
        assert done[-1] == [b"K", b"1"], done
        assert (base / "var" / "home" / "dest" / "f").read_bytes() == b"x"
        code, _, message = _refusal(_untar_as(NOBODY, base / "home" / "mine" / "dest", _tar(("f", "f", b"x"))))
        assert (code, "symbolic link" in message) == ("invalid_path", True)
        assert not (base / "var" / "dest").exists()
    finally:
        shutil.rmtree(base)


NOBODY = 65534


def _untar_as(uid: int, dest: Path, data: bytes) -> list[list[bytes]]:
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    argv = [*drop, "/usr/bin/python3", *PYTHON_FLAGS, "-c", program("_untar"), str(dest), "100", str(1 << 20)]
    done = subprocess.run(argv, input=data, capture_output=True, timeout=60, check=False, cwd="/")
    assert done.stderr == b"", done
    return [line.split(b" ") for line in done.stdout.splitlines()]
