"""What the CompositeBackend test modules share: a StateBackend that records the calls reaching
it, and short ways to read answers."""

from __future__ import annotations

from sandboxes import protocol as p
from sandboxes.state import StateBackend


def paths_of(entries: list[p.FileInfo] | list[p.GrepMatch] | None) -> list[str]:
    assert entries is not None
    return [e.path for e in entries]


class CountingState(StateBackend):
    """A real StateBackend that also records which operations reached it, with which paths."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, object]] = []

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[p.FileUploadResponse]:
        self.calls.append(("upload_files", [path for path, _ in files]))
        return super().upload_files(files)

    def download_files(self, paths: list[str]) -> list[p.FileDownloadResponse]:
        self.calls.append(("download_files", list(paths)))
        return super().download_files(paths)

    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> p.GrepResult:
        self.calls.append(("grep", (path, glob, max_count)))
        return super().grep(pattern, path, glob, max_count=max_count)


def text_of(backend: p.BackendProtocol, path: str) -> str:
    result = backend.read(path)
    assert result.file_data is not None, result
    return result.file_data.content


def without_times(answer: object) -> object:
    if isinstance(answer, p.LsResult):
        return answer.error, answer.message, [(e.path, e.is_dir, e.size) for e in answer.entries or []]
    return answer
