"""Batches of uploads and downloads every backend must answer file by file, in order
(`BatchTransfers`, part of `BackendConformance`), whichever transport moves each file."""

from __future__ import annotations

from sandboxes import protocol as p
from sandboxes.testing._answers import listed_entries

__all__ = ["BatchTransfers"]


class BatchTransfers:
    """Per-file batch answers; the ``backend`` and ``root`` fixtures are `BackendConformance`'s."""

    def test_batches_keep_order_and_report_per_file(self, backend: p.BackendProtocol, root: str) -> None:
        backend.write(f"{root}/dir/x", "x")
        backend.write(f"{root}/file", "f")
        uploads = backend.upload_files(
            [
                (f"{root}/ok1", b"1"),
                ("relative.txt", b"r"),
                (f"{root}/dir", b"onto a dir"),
                (f"{root}/file/below", b"below a file"),
                (f"{root}/new/dir/ok2", b"2"),
            ]
        )
        assert [(u.path, u.error) for u in uploads] == [
            (f"{root}/ok1", None),
            ("relative.txt", p.INVALID_PATH),
            (f"{root}/dir", p.IS_DIRECTORY),
            (f"{root}/file/below", p.NOT_A_DIRECTORY),
            (f"{root}/new/dir/ok2", None),
        ]
        downloads = backend.download_files(
            [f"{root}/new/dir/ok2", f"{root}/missing", "../x", f"{root}/dir", f"{root}/ok1"]
        )
        assert [(d.path, d.content, d.error) for d in downloads] == [
            (f"{root}/new/dir/ok2", b"2", None),
            (f"{root}/missing", None, p.FILE_NOT_FOUND),
            ("../x", None, p.INVALID_PATH),
            (f"{root}/dir", None, p.IS_DIRECTORY),
            (f"{root}/ok1", b"1", None),
        ]
        assert backend.upload_files([]) == []
        assert backend.download_files([]) == []

    def test_large_files_in_batches_report_per_file(self, backend: p.BackendProtocol, root: str) -> None:
        """Backends may move big files by another transport (tar, SFTP); the answers must not change."""
        big = bytes(range(256)) * (3 << 12)  # 3 MiB
        backend.write(f"{root}/dir/x", "x")
        backend.write(f"{root}/file", "f")
        uploads = backend.upload_files(
            [
                (f"{root}/dir", big),
                (f"{root}/small", b"s"),
                (f"{root}/file/below", big),
                (f"{root}/new/deep/big.bin", big),
                ("relative", big),
            ]
        )
        assert [(u.path, u.error) for u in uploads] == [
            (f"{root}/dir", p.IS_DIRECTORY),
            (f"{root}/small", None),
            (f"{root}/file/below", p.NOT_A_DIRECTORY),
            (f"{root}/new/deep/big.bin", None),
            ("relative", p.INVALID_PATH),
        ]
        downloads = backend.download_files([f"{root}/new/deep/big.bin", f"{root}/dir", f"{root}/small", f"{root}/nope"])
        assert [(d.content, d.error) for d in downloads] == [
            (big, None),
            (None, p.IS_DIRECTORY),
            (b"s", None),
            (None, p.FILE_NOT_FOUND),
        ]
        assert backend.edit(f"{root}/small", "s", "t").error is None
        assert [e.path for e in listed_entries(backend, f"{root}/new/deep")] == [f"{root}/new/deep/big.bin"]

    def test_batch_of_many_files(self, backend: p.BackendProtocol, root: str) -> None:
        files = [(f"{root}/batch/{i}/f{i}.bin", bytes([i]) * (i * 100)) for i in range(60)]
        assert all(r.error is None for r in backend.upload_files(files))
        downloaded = backend.download_files([path for path, _ in files])
        assert [(d.path, d.content) for d in downloaded] == files
