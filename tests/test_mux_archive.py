"""The program ``GET /archive`` runs in a sandbox (`sandboxes._helper._archive`), run here as the
sandbox runs it (``python3 -I -S -c`` its shipped text): a pseudo-file's member is what a read
gives, however long, within the bound and, once counted past it, its header alone (exit 3); a
big regular file streams whole; a tree keeps its links."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from support import needs

from sandboxes._helper import _archive
from sandboxes._mux import PYTHON_FLAGS
from sandboxes._mux._shipped import program

KALLSYMS = Path("/proc/kallsyms")


def _run(path: str, limit: int) -> subprocess.CompletedProcess[bytes]:
    parent, name = os.path.split(path)
    argv = [sys.executable, *PYTHON_FLAGS, "-c", program("_archive"), parent, name, str(limit)]
    return subprocess.run(argv, capture_output=True, timeout=60, check=False)


def _members(data: bytes) -> dict[str, tuple[tarfile.TarInfo, bytes | None]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {}
        for member in tar.getmembers():
            content = tar.extractfile(member) if member.isreg() else None
            members[member.name] = (member, None if content is None else content.read())
    return members


def test_pseudo_files_are_what_a_read_gives() -> None:
    for path in ["/proc/sys/kernel/random/boot_id", "/proc/cpuinfo", "/sys/devices/system/cpu/online"]:
        said, read = os.stat(path).st_size, Path(path).read_bytes()
        assert said != len(read), path  # a pseudo-file: its size says otherwise
        done = _run(path, 1 << 20)
        assert (done.returncode, done.stderr) == (0, b""), done.stderr
        [(member, content)] = _members(done.stdout).values()
        assert (member.name, member.size, content) == (os.path.basename(path), len(read), read)


def test_a_pseudo_file_longer_than_what_is_held_is_counted_then_read() -> None:
    needs(KALLSYMS.is_file() and len(KALLSYMS.read_bytes()) > _archive.HELD, "no /proc/kallsyms over a MiB")
    read = KALLSYMS.read_bytes()
    done = _run(str(KALLSYMS), len(read) + 1)
    assert (done.returncode, done.stderr) == (0, b""), done.stderr
    assert _members(done.stdout)["kallsyms"][1] == read


@pytest.mark.parametrize(("path", "limit"), [(KALLSYMS, _archive.HELD + 10), (Path("/proc/cpuinfo"), 100)])
def test_a_pseudo_file_counted_past_the_bound_is_its_header_alone(path: Path, limit: int) -> None:
    """Read to the bound + 1 and no further, whether it is longer than what is held or not: the
    header says that size (which the service refuses), no byte follows."""
    needs(path.is_file() and len(path.read_bytes()) > limit, f"no {path} over {limit} bytes")
    done = _run(str(path), limit)
    assert done.returncode == _archive.TOO_LARGE
    assert len(done.stdout) == 512
    header = tarfile.TarInfo.frombuf(done.stdout, "utf-8", "surrogateescape")
    assert (header.name, header.size) == (path.name, limit + 1)


def test_a_tree_streams_whole_with_its_links(tmp_path: Path) -> None:
    big = os.urandom(_archive.HELD * 2 + 3)
    (tmp_path / "t" / "s").mkdir(parents=True)
    (tmp_path / "t" / "s" / "big").write_bytes(big)
    (tmp_path / "t" / "s" / "empty").write_bytes(b"")
    (tmp_path / "t" / "s" / "l").symlink_to("big")
    os.link(tmp_path / "t" / "s" / "big", tmp_path / "t" / "hard")
    done = _run(str(tmp_path / "t"), len(big))
    assert (done.returncode, done.stderr) == (0, b""), done.stderr
    members = _members(done.stdout)
    assert set(members) == {"t", "t/s", "t/s/big", "t/s/empty", "t/s/l", "t/hard"}
    first, second = sorted(["t/s/big", "t/hard"], key=list(members).index)
    assert members[first][1] == big
    assert (members[second][0].islnk(), members[second][0].linkname) == (True, first)
    assert members["t/s/empty"][1] == b""
    assert members["t/s/l"][0].linkname == "big"
