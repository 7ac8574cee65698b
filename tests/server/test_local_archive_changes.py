"""A local sandbox's files read by the service itself (no jail, so no exec helper to make its
tar): a file's member is exactly the bytes read, as a container's. Each change comes inside the
service's ``fstat`` of the file it opened, before its first read, so at that point every time.
A snapshot keeps a file that shrank to within what is held as it turned out, and refuses one that
shrank below its size ``file_changed`` naming it (`sandboxes._helper._tar`'s rule); ``GET
/archive`` keeps what a read gives and pads a long one that shrank with zeros, as a container's
``tar`` does (`sandboxes._helper._archive`'s rule)."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from sandboxes import _beneath as beneath
from sandboxes.server.archive import open_local_archive, write_local_archive
from sandboxes.server.errors import ServiceError
from sandboxes.server.manifest import Recorder

HELD = 1 << 20
"""What is held of a file at most (`sandboxes._helper._tar.HELD`, checked below)."""


def _changing(monkeypatch: pytest.MonkeyPatch, name: str, change: Callable[[Path], object]) -> list[str]:
    """``change`` made to the file ``name`` once the service has opened it and taken its
    status; the names it was made to (once)."""
    made: list[str] = []
    opened = beneath.open_file

    def open_file(dir_fd: int, leaf: str, flags: int, *, directories: bool = False) -> tuple[int, os.stat_result]:
        fd, info = opened(dir_fd, leaf, flags, directories=directories)
        if leaf == name and not made:
            change(Path(f"/proc/self/fd/{fd}"))
            made.append(leaf)
        return fd, info

    monkeypatch.setattr(beneath, "open_file", open_file)
    return made


def _truncate(size: int) -> Callable[[Path], object]:
    return lambda path: os.truncate(path, size)


def _tree(tmp_path: Path, size: int) -> Path:
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "file").write_bytes(b"x" * size)
    (tmp_path / "tree" / "other").write_bytes(b"other")
    return tmp_path / "tree"


def _snapshot(tmp_path: Path) -> tuple[bytes, Recorder]:
    out, recorder = io.BytesIO(), Recorder("tree", max_members=100)
    write_local_archive(str(tmp_path), str(tmp_path / "tree"), out, uid=1000, gid=1000, transform=recorder)
    return out.getvalue(), recorder


def _got(tmp_path: Path, limit: int = 1 << 30) -> bytes:
    chunks: list[bytes] = []
    open_local_archive(str(tmp_path), str(tmp_path / "tree"), uid=1000, gid=1000, limit=limit)(chunks.append)
    return b"".join(chunks)


def _members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: (tar.extractfile(m) or io.BytesIO()).read() for m in tar if m.isreg()}


def test_held_is_the_programs() -> None:
    from sandboxes._helper import _archive, _tar

    assert HELD == _tar.HELD == _archive.HELD


def test_a_snapshot_refuses_a_long_file_that_shrank_while_it_was_read_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(tmp_path, 3 * HELD)
    made = _changing(monkeypatch, "file", _truncate(2 * HELD))
    with pytest.raises(ServiceError) as refused:
        _snapshot(tmp_path)
    assert made == ["file"]
    assert refused.value.code == "file_changed"
    assert "tree/file: it shrank while it was read" in refused.value.message


def test_a_snapshot_keeps_a_file_that_shrank_within_what_is_held_as_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(tmp_path, 4096)
    made = _changing(monkeypatch, "file", _truncate(10))
    data, recorder = _snapshot(tmp_path)
    assert made == ["file"]
    assert _members(data)["file"] == b"x" * 10
    sizes = {entry.path: entry.size for entry in recorder.entries()}
    assert sizes["file"] == 10
    assert sizes["other"] == 5


def test_a_snapshot_keeps_a_long_file_that_grew_as_first_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tree(tmp_path, 2 * HELD)
    made = _changing(monkeypatch, "file", lambda path: path.open("ab").write(b"y" * 100))
    data, recorder = _snapshot(tmp_path)
    assert made == ["file"]
    assert _members(data)["file"] == b"x" * (2 * HELD)
    assert {entry.path: entry.size for entry in recorder.entries()}["file"] == 2 * HELD


def test_a_snapshot_refuses_a_small_file_that_grew_past_what_is_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(tmp_path, 100)
    made = _changing(monkeypatch, "file", lambda path: path.open("ab").write(b"y" * HELD))
    with pytest.raises(ServiceError) as refused:
        _snapshot(tmp_path)
    assert made == ["file"]
    assert refused.value.code == "file_changed"


def test_get_archive_pads_a_long_file_that_shrank_with_zeros_as_tar_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(tmp_path, 3 * HELD)
    made = _changing(monkeypatch, "file", _truncate(2 * HELD))
    members = _members(_got(tmp_path))
    assert made == ["file"]
    assert members["tree/file"] == b"x" * (2 * HELD) + bytes(HELD)
    assert members["tree/other"] == b"other"


def test_get_archive_keeps_a_small_file_that_shrank_as_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tree(tmp_path, 4096)
    made = _changing(monkeypatch, "file", _truncate(3))
    assert _members(_got(tmp_path))["tree/file"] == b"xxx"
    assert made == ["file"]
