"""StateBackend: the conformance suite, plus what only an in-memory backend can promise."""

from __future__ import annotations

import pytest

from sandboxes import protocol as p
from sandboxes.state import StateBackend
from sandboxes.testing import BackendConformance


class TestStateConformance(BackendConformance):
    @pytest.fixture
    def backend(self) -> StateBackend:
        return StateBackend()


def test_files_snapshot_roundtrips_into_a_new_backend() -> None:
    first = StateBackend()
    first.write("/a/b.txt", "text")
    first.upload_files([("/bin", b"\x00\xff")])
    second = StateBackend(first.files)
    assert second.download_files(["/a/b.txt", "/bin"]) == [
        p.FileDownloadResponse("/a/b.txt", b"text"),
        p.FileDownloadResponse("/bin", b"\x00\xff"),
    ]
    assert second.files["/bin"].encoding == "base64"


def test_instances_never_share_storage() -> None:
    one, two = StateBackend(), StateBackend()
    one.write("/x", "1")
    assert two.read("/x").error == p.FILE_NOT_FOUND


def test_edit_keeps_created_at_and_moves_modified_at() -> None:
    backend = StateBackend()
    backend.write("/f", "old")
    before = backend.files["/f"]
    backend.edit("/f", "old", "new")
    after = backend.files["/f"]
    assert after.created_at == before.created_at
    assert after.modified_at is not None
    assert before.modified_at is not None
    assert after.modified_at >= before.modified_at
