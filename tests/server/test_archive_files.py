"""An archive extracted from a file on disk (a snapshot's tar in the store) is read in place,
not as a stream, and held to the same bounds as one arriving over HTTP: a sparse or compressed
archive may not expand beyond ``max_expansion`` past the file's size, a symbolic link may not
lead out, and a truncated file is refused as unreadable."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from sandboxes.server.archive import extract_local
from sandboxes.server.errors import ServiceError

EXPANSION = 1 << 20


def _extract(root: Path, archive: Path) -> None:
    with open(archive, "rb") as stored:
        extract_local(str(root), str(root / "dest"), stored, max_bytes=1 << 30, max_expansion=EXPANSION)


def _refusal(root: Path, archive: Path) -> ServiceError:
    with pytest.raises(ServiceError) as refused:
        _extract(root, archive)
    return refused.value


@pytest.fixture
def root(tmp_path: Path) -> Path:
    made = tmp_path / "root"
    made.mkdir()
    return made


def test_a_sparse_file_may_not_expand_beyond_the_bound(root: Path, tmp_path: Path) -> None:
    source = tmp_path / "sparse.bin"
    with open(source, "wb") as fh:
        fh.seek(8 * EXPANSION)
        fh.write(b"end\n")
    bomb = tmp_path / "sparse.tar"
    subprocess.run(["tar", "--format=gnu", "--sparse", "-cf", str(bomb), "-C", str(tmp_path), "sparse.bin"], check=True)
    assert bomb.stat().st_size < 64 << 10
    refused = _refusal(root, bomb)
    assert (refused.code, "beyond its own size" in refused.message) == ("too_large", True)


def test_a_compressed_file_may_not_expand_beyond_the_bound(root: Path, tmp_path: Path) -> None:
    bomb = tmp_path / "zeros.tar.bz2"
    with tarfile.open(bomb, mode="w:bz2") as archive:
        info = tarfile.TarInfo("zeros")
        info.size = 8 * EXPANSION
        archive.addfile(info, io.BytesIO(bytes(info.size)))
    assert _refusal(root, bomb).code == "too_large"


def test_a_link_out_and_a_truncated_file_are_refused(root: Path, tmp_path: Path) -> None:
    escaping = tmp_path / "escaping.tar"
    with tarfile.open(escaping, mode="w") as archive:
        link = tarfile.TarInfo("out")
        link.type, link.linkname = tarfile.SYMTYPE, "../../etc"
        archive.addfile(link)
    assert _refusal(root, escaping).code == "invalid_path"
    whole = tmp_path / "whole.tar"
    with tarfile.open(whole, mode="w") as archive:
        info = tarfile.TarInfo("data.bin")
        info.size = 100_000
        archive.addfile(info, io.BytesIO(bytes(info.size)))
    cut = tmp_path / "cut.tar"
    cut.write_bytes(whole.read_bytes()[:50_000])
    assert _refusal(root, cut).code == "invalid_request"
    assert not (root / "dest" / "data.bin").exists()
    _extract(root, whole)
    assert (root / "dest" / "data.bin").stat().st_size == 100_000
