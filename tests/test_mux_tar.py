"""The program a snapshot runs in a sandbox (`sandboxes._helper._tar`): a file's member is exactly
the bytes read of it, never what its size said. Run here as the sandbox runs it (``python3 -I -S
-c`` its shipped text) for pseudo-files, whose size says 0 bytes or a page; run in-process for a
file that changes between its ``fstat`` and its reads (the change made by the ``fstat`` itself,
so it comes at that point every time): one that ends within what is held is its member exactly,
one that grows or shrinks past it is refused ``file_changed`` naming it, its member whole."""

from __future__ import annotations

import binascii
import io
import os
import subprocess
import sys
import tarfile
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import needs

from sandboxes._helper import _tar
from sandboxes._mux import PYTHON_FLAGS
from sandboxes._mux._shipped import program

HELD = 1 << 20
"""What the program holds of a file at most (`_tar.HELD`; checked below, not read from it, so that
these tests run against a program without it, which trusted a file's size)."""
Change = Callable[[], None]
THP = Path("/sys/kernel/mm/transparent_hugepage/khugepaged")
"""Files of ``/sys`` whose size says a page, each holding a number and a newline."""


def _lines(answer: bytes) -> list[list[bytes]]:
    return [line.split(b" ") for line in answer.splitlines()]


def _members(data: bytes, *, ended: bool = True) -> dict[str, bytes]:
    """Every file member of ``data`` by name, each read as long as its header says, none cut
    short; ``ended``: the tar's end follows them, else they fill ``data`` to its last byte."""
    members = {}
    with tarfile.open(fileobj=io.BytesIO(data + bytes(1024)), mode="r:") as tar:
        for member in tar:
            content = tar.extractfile(member)
            members[member.name] = b"" if content is None else content.read()
        assert tar.offset + 1024 <= len(data) if ended else tar.offset == len(data)
    assert not data[tar.offset :].strip(b"\0")
    return members


def test_pseudo_files_are_what_a_read_gives() -> None:
    """``/proc`` says 0 bytes, ``/sys`` a page: each member is what a read gives, neither empty
    nor padded with zeros to the page."""
    needs(THP.is_dir(), f"no {THP}")
    for tree, stable in (("/proc/sys/kernel/random", "boot_id"), (str(THP), "pages_to_scan")):
        argv = [sys.executable, *PYTHON_FLAGS, "-c", program("_tar"), tree, "100"]
        done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        members = _members(done.stdout)
        read = Path(tree, stable).read_bytes()
        assert os.stat(Path(tree, stable)).st_size != len(read)
        assert members[stable] == read
        answered = {binascii.unhexlify(line[1]).decode(): line for line in _lines(done.stderr) if line[0] == b"M"}
        assert answered[stable][4] == str(len(read)).encode()
        for name, content in members.items():
            assert content.endswith(b"\n"), name
            assert b"\0" not in content, name
            assert answered[name][4] == str(len(content)).encode()


def _run(root: Path, monkeypatch: pytest.MonkeyPatch, change: Callable[[], None]) -> tuple[int, bytes, bytes]:
    """The program's (exit code, stdout, stderr) for ``root``, run in-process, ``change`` made
    right after it ``fstat``s the file it opened, before its first read of it."""
    changes = [change]

    def fstat(fd: int) -> os.stat_result:
        found = os.fstat(fd)
        while changes:
            changes.pop()()
        return found

    class Shim:
        def __getattr__(self, name: str) -> Any:
            return fstat if name == "fstat" else getattr(os, name)

    monkeypatch.setattr(_tar, "os", Shim())
    stdout, stderr = io.BytesIO(), io.BytesIO()
    monkeypatch.setattr(sys, "stdout", types.SimpleNamespace(buffer=stdout))
    monkeypatch.setattr(sys, "stderr", types.SimpleNamespace(buffer=stderr))
    code = _tar.main([str(root), "10"])
    assert not changes
    return code, stdout.getvalue(), stderr.getvalue()


def _appended(path: Path, data: bytes) -> Callable[[], None]:
    def append() -> None:
        with open(path, "ab") as file:
            file.write(data)

    return append


def _truncated(path: Path, size: int) -> Callable[[], None]:
    return lambda: os.truncate(path, size)


def test_a_file_that_changes_within_what_is_held_is_its_bytes_as_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    grown, shrunk = tmp_path / "grown", tmp_path / "shrunk"
    grown.mkdir()
    shrunk.mkdir()
    (grown / "f").write_bytes(b"a" * 100)
    (shrunk / "f").write_bytes(os.urandom(HELD * 3))
    for root, change in ((grown, _appended(grown / "f", b"b" * 50)), (shrunk, _truncated(shrunk / "f", 100))):
        code, data, answer = _run(root, monkeypatch, change)
        assert code == 0, answer
        content = (root / "f").read_bytes()
        assert len(content) in (150, 100)
        assert _members(data) == {"f": content}
        [entry, end] = _lines(answer)
        assert entry[4] == str(len(content)).encode()
        assert end == [b"K", b"2"]
    assert getattr(_tar, "HELD", HELD) == HELD


def test_a_long_file_that_grows_while_read_is_kept_as_its_size_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An appended log longer than what is held: its member is the bytes it held when first seen."""
    (tmp_path / "f").write_bytes(before := os.urandom(HELD * 3))
    code, data, answer = _run(tmp_path, monkeypatch, _appended(tmp_path / "f", b"x" * 10))
    assert code == 0, answer
    assert _members(data) == {"f": before}
    [entry, end] = _lines(answer)
    assert entry[4] == str(HELD * 3).encode()
    assert end == [b"K", b"2"]


@pytest.mark.parametrize(
    ("size", "change", "said"),
    [
        (100, lambda f: _appended(f, b"x" * HELD), b"its size said 100 bytes, a read gave more than 1048576"),
        (HELD * 3, lambda f: _truncated(f, HELD * 2), b"it shrank while it was read: 2097152 of the"),
    ],
    ids=["grew-past-what-is-held", "shrank"],
)
def test_a_file_that_changes_past_what_is_held_is_refused_its_member_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int, change: Callable[[Path], Change], said: bytes
) -> None:
    (tmp_path / "f").write_bytes(os.urandom(size))
    before = (tmp_path / "f").read_bytes()
    code, data, answer = _run(tmp_path, monkeypatch, change(tmp_path / "f"))
    assert code == 1
    [[kind, error, where, message]] = _lines(answer)
    assert (kind, error, binascii.unhexlify(where)) == (b"E", b"file_changed", b"f")
    assert said in binascii.unhexlify(message)
    members = _members(data, ended=False)
    if size > HELD:  # streamed: its member is whole, the bytes its size said
        kept = (tmp_path / "f").read_bytes()[:size]
        assert members == {"f": kept + bytes(size - len(kept))}
        assert members["f"][: len(kept)] == before[: len(kept)]
    else:  # refused before its header
        assert members == {}
