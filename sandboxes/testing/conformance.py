"""The conformance suite every backend, ours or a third party's, runs.

Subclass `BackendConformance` (file operations) or `SandboxConformance` (adds ``execute``) in a
test module and provide a ``backend`` fixture; override ``base_dir`` when the backend's
namespace is not empty at ``/`` (a sandbox: a writable directory such as ``/workspace``).
Each test works in its own fresh directory ``root`` under ``base_dir``, so an expensive
backend can be class- or module-scoped::

    class TestMine(SandboxConformance):
        @pytest.fixture(scope="class")
        def backend(self):
            with MySandbox() as sandbox:
                yield sandbox

        @pytest.fixture
        def base_dir(self):
            return "/workspace"
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from sandboxes import protocol as p
from sandboxes.semantics import EDIT_MAX_BYTES, MAX_BINARY_READ_BYTES
from sandboxes.testing._answers import grep_matches, listed_entries, whole_text
from sandboxes.testing.corpus import BINARY_SAMPLES
from sandboxes.testing.grep_conformance import GrepBounds
from sandboxes.testing.hostile_conformance import BAD_PATHS, HostileInputs
from sandboxes.testing.transfer_conformance import BatchTransfers

__all__ = ["BAD_PATHS", "BackendConformance"]


class BackendConformance(GrepBounds, BatchTransfers, HostileInputs):
    """File-operation behaviour shared by every backend (deepagents 0.7 semantics)."""

    large_file_bytes = 12 << 20
    """Size of the large-file round trip; at least 10 MiB."""

    @pytest.fixture
    def backend(self) -> p.BackendProtocol:
        raise NotImplementedError("subclasses provide a `backend` fixture")

    @pytest.fixture
    def base_dir(self) -> str:
        return "/"

    @pytest.fixture
    def root(self, base_dir: str) -> str:
        """A fresh directory path, not created until a test writes below it."""
        return f"{base_dir.rstrip('/')}/conf-{uuid.uuid4().hex[:10]}"

    # ------------------------------------------------------------------ write / read

    def test_write_then_read(self, backend: p.BackendProtocol, root: str) -> None:
        path = f"{root}/hello.txt"
        written = backend.write(path, "Hello\nWorld\n")
        assert written == p.WriteResult(path=path)
        result = backend.read(path)
        assert result.error is None
        assert result.file_data is not None
        assert result.file_data.content == "Hello\nWorld\n"
        assert result.file_data.encoding == "utf-8"
        assert (result.total_lines, result.start_line, result.end_line, result.next_offset) == (2, 1, 2, None)

    def test_write_overwrites(self, backend: p.BackendProtocol, root: str) -> None:
        path = f"{root}/f.txt"
        backend.write(path, "first version, longer")
        assert backend.write(path, "second").error is None
        assert whole_text(backend, path) == "second"

    def test_write_creates_parents_and_normalises_path(self, backend: p.BackendProtocol, root: str) -> None:
        result = backend.write(f"{root}//deep/./nested//dir/f.txt", "x")
        assert result.path == f"{root}/deep/nested/dir/f.txt"
        assert whole_text(backend, f"{root}/deep/nested/dir/f.txt") == "x"

    def test_write_onto_directory_is_refused(self, backend: p.BackendProtocol, root: str) -> None:
        backend.write(f"{root}/d/f.txt", "x")
        assert backend.write(f"{root}/d", "y").error == p.IS_DIRECTORY
        assert whole_text(backend, f"{root}/d/f.txt") == "x"

    def test_write_below_a_file_is_refused(self, backend: p.BackendProtocol, root: str) -> None:
        backend.write(f"{root}/file", "x")
        assert backend.write(f"{root}/file/child.txt", "y").error == p.NOT_A_DIRECTORY
        assert whole_text(backend, f"{root}/file") == "x"

    def test_empty_and_whitespace_files(self, backend: p.BackendProtocol, root: str) -> None:
        backend.write(f"{root}/empty", "")
        backend.write(f"{root}/blank", "\n\n\n")
        empty = backend.read(f"{root}/empty")
        assert empty.error is None
        assert empty.file_data is not None
        assert (empty.file_data.content, empty.file_data.encoding) == ("", "utf-8")
        assert whole_text(backend, f"{root}/blank") == "\n\n\n"

    def test_read_missing_and_directory(self, backend: p.BackendProtocol, root: str) -> None:
        assert backend.read(f"{root}/missing.txt").error == p.FILE_NOT_FOUND
        backend.write(f"{root}/d/f", "x")
        assert backend.read(f"{root}/d").error == p.IS_DIRECTORY
        assert backend.read(f"{root}/d/f/below").error == p.NOT_A_DIRECTORY

    def test_read_pagination(self, backend: p.BackendProtocol, root: str) -> None:
        path = f"{root}/lines.txt"
        backend.write(path, "".join(f"line {i}\n" for i in range(1, 11)))
        window = backend.read(path, offset=2, limit=3)
        assert window.file_data is not None
        assert window.file_data.content == "line 3\nline 4\nline 5\n"
        assert (window.total_lines, window.start_line, window.end_line, window.next_offset) == (10, 3, 5, 5)
        last = backend.read(path, offset=8, limit=100)
        assert last.file_data is not None
        assert last.file_data.content == "line 9\nline 10\n"
        assert last.next_offset is None
        negative = backend.read(path, offset=-5, limit=1)
        assert negative.start_line == 1

    def test_read_zero_limit_and_offset_past_end(self, backend: p.BackendProtocol, root: str) -> None:
        path = f"{root}/three.txt"
        backend.write(path, "a\nb\nc")
        zero = backend.read(path, limit=0)
        assert zero.no_lines_requested
        assert zero.file_data is not None
        assert zero.file_data.content == ""
        assert backend.read(path, offset=3).error == p.OFFSET_OUT_OF_RANGE
        assert backend.read(path, offset=100).error == p.OFFSET_OUT_OF_RANGE

    def test_read_shows_crlf_as_lf(self, backend: p.BackendProtocol, root: str) -> None:
        path = f"{root}/dos.txt"
        backend.upload_files([(path, b"one\r\ntwo\r\nthree")])
        result = backend.read(path)
        assert result.file_data is not None
        assert result.file_data.content == "one\ntwo\nthree"
        assert result.total_lines == 3

    def test_unicode_content_roundtrip(self, backend: p.BackendProtocol, root: str) -> None:
        content = "héllo wörld\n日本語\n🦀 emoji\n\u200b zero-width\n"
        backend.write(f"{root}/u.txt", content)
        assert whole_text(backend, f"{root}/u.txt") == content
        assert backend.download_files([f"{root}/u.txt"])[0].content == content.encode()

    @pytest.mark.parametrize("sample", BINARY_SAMPLES, ids=range(len(BINARY_SAMPLES)))
    def test_binary_read_is_base64(self, backend: p.BackendProtocol, root: str, sample: bytes) -> None:
        path = f"{root}/blob.bin"
        assert backend.upload_files([(path, sample)]) == [p.FileUploadResponse(path)]
        result = backend.read(path)
        assert result.file_data is not None
        assert result.file_data.encoding == "base64"
        assert base64.b64decode(result.file_data.content) == sample
        assert backend.download_files([path])[0].content == sample

    def test_media_extension_reads_as_base64(self, backend: p.BackendProtocol, root: str) -> None:
        backend.upload_files([(f"{root}/img.png", b"not really a png")])
        result = backend.read(f"{root}/img.png")
        assert result.file_data is not None
        assert result.file_data.encoding == "base64"

    def test_binary_over_preview_cap_is_refused_by_read(self, backend: p.BackendProtocol, root: str) -> None:
        blob = bytes(range(256)) * (MAX_BINARY_READ_BYTES // 256 + 1)
        backend.upload_files([(f"{root}/big.bin", blob)])
        result = backend.read(f"{root}/big.bin")
        assert result.error == p.FILE_TOO_LARGE
        assert result.file_data is None
        assert backend.download_files([f"{root}/big.bin"])[0].content == blob

    @pytest.mark.slow
    def test_large_file_roundtrip(self, backend: p.BackendProtocol, root: str) -> None:
        line = b"0123456789abcdef" * 4 + b"\n"
        blob = line * (self.large_file_bytes // len(line) + 1)
        path = f"{root}/large.txt"
        assert backend.upload_files([(path, blob)])[0].error is None
        assert backend.download_files([path])[0].content == blob
        total = blob.count(b"\n")
        tail = backend.read(path, offset=total - 2, limit=10)
        assert tail.file_data is not None
        assert tail.file_data.content == (line * 2).decode()
        assert tail.total_lines == total
        binary = bytes(range(256)) * (self.large_file_bytes // 256)
        assert backend.upload_files([(f"{root}/large.bin", binary)])[0].error is None
        got = backend.download_files([f"{root}/large.bin"])[0]
        assert got.content == binary, (got.error, got.message, None if got.content is None else len(got.content))

    # ------------------------------------------------------------------ edit

    def test_edit_single_occurrence(self, backend: p.BackendProtocol, root: str) -> None:
        path = f"{root}/e.txt"
        backend.write(path, "Hello world\nGoodbye world\n")
        assert backend.edit(path, "Goodbye", "Farewell") == p.EditResult(path=path, occurrences=1)
        assert whole_text(backend, path) == "Hello world\nFarewell world\n"

    def test_edit_errors(self, backend: p.BackendProtocol, root: str) -> None:
        path = f"{root}/e.txt"
        backend.write(path, "a b a")
        assert backend.edit(path, "zzz", "y").error == p.STRING_NOT_FOUND
        many = backend.edit(path, "a", "y")
        assert many.error == p.MULTIPLE_OCCURRENCES
        assert many.message is not None
        assert "2" in many.message
        assert backend.edit(path, "", "y").error == p.INVALID_ARGUMENT
        assert backend.edit(f"{root}/missing", "a", "b").error == p.FILE_NOT_FOUND
        assert whole_text(backend, path) == "a b a"

    def test_edit_replace_all(self, backend: p.BackendProtocol, root: str) -> None:
        path = f"{root}/e.txt"
        backend.write(path, "x.x.x")
        assert backend.edit(path, "x", "yy", replace_all=True).occurrences == 3
        assert whole_text(backend, path) == "yy.yy.yy"

    def test_edit_of_a_file_over_the_bound_is_refused(self, backend: p.BackendProtocol, root: str) -> None:
        """Past `EDIT_MAX_BYTES` a file is ``file_too_large`` for ``edit`` (not pulled whole),
        and left as it was."""
        path = f"{root}/big.txt"
        line = b"0123456789abcdef" * 4 + b"\n"
        big = line * (EDIT_MAX_BYTES // len(line)) + b"x" * (EDIT_MAX_BYTES % len(line)) + b"y"
        assert len(big) == EDIT_MAX_BYTES + 1
        assert backend.upload_files([(path, big)]) == [p.FileUploadResponse(path)]
        refused = backend.edit(path, "xy", "z")
        assert (refused.error, refused.occurrences) == (p.FILE_TOO_LARGE, None), refused
        assert refused.message is not None
        assert path in refused.message
        assert backend.download_files([path])[0].content == big

    def test_an_edit_that_would_grow_a_file_past_the_bound_is_refused(
        self, backend: p.BackendProtocol, root: str
    ) -> None:
        path = f"{root}/grows.txt"
        backend.write(path, "a" * 1000 + "\n")
        grown = backend.edit(path, "a", "b" * (EDIT_MAX_BYTES // 1000 + 1), replace_all=True)
        assert grown.error == p.FILE_TOO_LARGE, grown
        assert whole_text(backend, path) == "a" * 1000 + "\n"

    def test_edit_is_literal_and_multiline(self, backend: p.BackendProtocol, root: str) -> None:
        path = f"{root}/e.txt"
        content = "a = re.sub(r'\\d+$', '$1', s)  # (.*)\nsecond line\nthird\n"
        backend.write(path, content)
        result = backend.edit(path, "r'\\d+$', '$1'", "r'[a-z]*', '\\\\0'")
        assert result.error is None
        assert backend.edit(path, "second line\nthird", "2nd\n3rd").occurrences == 1
        assert whole_text(backend, path) == "a = re.sub(r'[a-z]*', '\\\\0', s)  # (.*)\n2nd\n3rd\n"

    def test_edit_keeps_crlf_files_crlf(self, backend: p.BackendProtocol, root: str) -> None:
        path = f"{root}/dos.txt"
        backend.upload_files([(path, b"one\r\ntwo\r\nthree\r\n")])
        assert backend.edit(path, "one\ntwo", "uno\ndos").error is None
        assert backend.download_files([path])[0].content == b"uno\r\ndos\r\nthree\r\n"

    def test_edit_binary_is_refused(self, backend: p.BackendProtocol, root: str) -> None:
        backend.upload_files([(f"{root}/b.bin", b"\xff\xfeab")])
        assert backend.edit(f"{root}/b.bin", "ab", "cd").error == p.NOT_A_TEXT_FILE
        assert backend.download_files([f"{root}/b.bin"])[0].content == b"\xff\xfeab"

    # ------------------------------------------------------------------ delete

    def test_delete_file_and_directory(self, backend: p.BackendProtocol, root: str) -> None:
        backend.write(f"{root}/keep.txt", "k")
        backend.write(f"{root}/gone.txt", "g")
        backend.write(f"{root}/tree/a/b.txt", "b")
        assert backend.delete(f"{root}/gone.txt") == p.DeleteResult(path=f"{root}/gone.txt")
        assert backend.delete(f"{root}/tree") == p.DeleteResult(path=f"{root}/tree")
        assert [e.path for e in listed_entries(backend, root)] == [f"{root}/keep.txt"]
        assert backend.delete(f"{root}/gone.txt").error == p.FILE_NOT_FOUND
        assert backend.delete("/").error == p.INVALID_PATH

    def test_delete_last_file_keeps_directory(self, backend: p.BackendProtocol, root: str) -> None:
        backend.write(f"{root}/d/only.txt", "x")
        backend.delete(f"{root}/d/only.txt")
        assert backend.ls(f"{root}/d") == p.LsResult(entries=[])
        assert [e.path for e in listed_entries(backend, root)] == [f"{root}/d/"]

    # ------------------------------------------------------------------ ls

    def test_ls_shape(self, backend: p.BackendProtocol, root: str) -> None:
        backend.write(f"{root}/b.txt", "bb")
        backend.write(f"{root}/a.txt", "a")
        backend.write(f"{root}/.hidden", "h")
        backend.write(f"{root}/sub/inner.txt", "i")
        entries = listed_entries(backend, root)
        assert [(e.path, e.is_dir) for e in entries] == [
            (f"{root}/.hidden", False),
            (f"{root}/a.txt", False),
            (f"{root}/b.txt", False),
            (f"{root}/sub/", True),
        ]
        assert entries[2].size == 2
        assert all(e.modified_at for e in entries if not e.is_dir)
        assert listed_entries(backend, f"{root}/") == entries

    def test_ls_errors(self, backend: p.BackendProtocol, root: str) -> None:
        assert backend.ls(f"{root}/missing").error == p.FILE_NOT_FOUND
        backend.write(f"{root}/f.txt", "x")
        assert backend.ls(f"{root}/f.txt").error == p.NOT_A_DIRECTORY

    def test_ls_many_entries(self, backend: p.BackendProtocol, root: str) -> None:
        files = [(f"{root}/many/file_{i:03d}.txt", b"%d" % i) for i in range(150)]
        assert all(r.error is None for r in backend.upload_files(files))
        entries = listed_entries(backend, f"{root}/many")
        assert [e.path for e in entries] == [path for path, _ in files]
        assert [e.size for e in entries] == [len(content) for _, content in files]

    # ------------------------------------------------------------------ grep

    def test_grep_literal_with_line_numbers(self, backend: p.BackendProtocol, root: str) -> None:
        backend.write(f"{root}/a.py", "x = 1\nprint(x)\n# TODO: fix (.*)\n")
        backend.write(f"{root}/sub/b.txt", "TODO once\nnothing\nTODO twice\n")
        result = backend.grep("TODO", root)
        assert result == p.GrepResult(
            matches=[
                p.GrepMatch(f"{root}/a.py", 3, "# TODO: fix (.*)"),
                p.GrepMatch(f"{root}/sub/b.txt", 1, "TODO once"),
                p.GrepMatch(f"{root}/sub/b.txt", 3, "TODO twice"),
            ]
        )
        assert [m.line for m in grep_matches(backend.grep("(.*)", root))] == [3]
        assert grep_matches(backend.grep("todo", root)) == []

    def test_grep_glob_filter_and_max_count(self, backend: p.BackendProtocol, root: str) -> None:
        for name in ("a.py", "b.txt", "src/c.py", "src/deep/d.py"):
            backend.write(f"{root}/{name}", "needle\nneedle\n")
        assert {m.path for m in grep_matches(backend.grep("needle", root, glob="*.py"))} == {
            f"{root}/a.py",
            f"{root}/src/c.py",
            f"{root}/src/deep/d.py",
        }
        assert {m.path for m in grep_matches(backend.grep("needle", root, glob="src/**/*.py"))} == {
            f"{root}/src/c.py",
            f"{root}/src/deep/d.py",
        }
        capped = backend.grep("needle", root, max_count=3)
        assert capped.truncated
        assert len(grep_matches(capped)) == 3
        exact = backend.grep("needle", root, glob="*.txt", max_count=2)
        assert not exact.truncated
        assert len(grep_matches(exact)) == 2

    def test_grep_edge_cases(self, backend: p.BackendProtocol, root: str) -> None:
        backend.write(f"{root}/f.txt", "-e starts with dash\nütf-8 ✓\nsecond\n")
        backend.upload_files([(f"{root}/bin.dat", b"needle\x00needle")])
        assert [m.line for m in grep_matches(backend.grep("-e", root))] == [1]
        assert [m.text for m in grep_matches(backend.grep("✓", root))] == ["ütf-8 ✓"]
        assert grep_matches(backend.grep("needle", root)) == []
        assert grep_matches(backend.grep("starts\nsecond", root)) == []
        assert [m.path for m in grep_matches(backend.grep("second", f"{root}/f.txt"))] == [f"{root}/f.txt"]
        assert backend.grep("x", f"{root}/missing").error == p.FILE_NOT_FOUND

    # ------------------------------------------------------------------ glob

    def test_glob_semantics(self, backend: p.BackendProtocol, root: str) -> None:
        for name in ("top.py", "src/app/main.py", "src/app/util.txt", ".github/ci.yml", "data/x1.csv", "data/x2.csv"):
            backend.write(f"{root}/{name}", "x")

        def found(pattern: str) -> list[str]:
            result = backend.glob(pattern, root)
            assert result.error is None, result
            assert result.matches is not None
            assert all(not m.is_dir for m in result.matches)
            return [m.path for m in result.matches]

        assert found("*.py") == [f"{root}/src/app/main.py", f"{root}/top.py"]
        assert found("/*.py") == [f"{root}/top.py"]
        assert found("src/**/*.py") == [f"{root}/src/app/main.py"]
        assert found("*.{py,txt}") == [f"{root}/src/app/main.py", f"{root}/src/app/util.txt", f"{root}/top.py"]
        assert found("data/x?.csv") == [f"{root}/data/x1.csv", f"{root}/data/x2.csv"]
        assert found("data/x[!1].csv") == [f"{root}/data/x2.csv"]
        assert found("*.yml") == [f"{root}/.github/ci.yml"]
        assert found("**/*.yml") == []
        assert found("*.rs") == []
        assert found("app") == []  # directories never match

    def test_glob_errors(self, backend: p.BackendProtocol, root: str) -> None:
        backend.write(f"{root}/f.txt", "x")
        assert backend.glob("../*", root).error == p.INVALID_ARGUMENT
        assert backend.glob("*", f"{root}/missing").error == p.FILE_NOT_FOUND

    # ------------------------------------------------------------------ concurrency & async

    def test_concurrent_operations(self, backend: p.BackendProtocol, root: str) -> None:
        def worker(i: int) -> tuple[bytes | None, list[str | None]]:
            path = f"{root}/conc/{i}.txt"
            written = backend.write(path, f"worker {i}\n" * 100)
            edited = backend.edit(path, f"worker {i}\n", f"done {i}\n", replace_all=True)
            downloaded = backend.download_files([path])[0]
            errors = [f"{r.error}: {r.message}" if r.error else None for r in (written, edited, downloaded)]
            return downloaded.content, errors

        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(worker, range(24)))
        wrong = {i: errors for i, (content, errors) in enumerate(results) if content != f"done {i}\n".encode() * 100}
        assert not wrong, (
            f"workers whose file is not what they wrote and edited (write, edit, download errors): {wrong}"
        )

    def test_async_twins(self, backend: p.BackendProtocol, root: str) -> None:
        async def scenario() -> None:
            paths = [f"{root}/async/{i}.txt" for i in range(10)]
            writes = await asyncio.gather(*(backend.awrite(path, f"v{i}") for i, path in enumerate(paths)))
            assert [w.path for w in writes] == paths
            assert (await backend.aedit(paths[0], "v0", "edited")).occurrences == 1
            reads = await asyncio.gather(*(backend.aread(path) for path in paths))
            assert [r.file_data.content if r.file_data else None for r in reads] == ["edited"] + [
                f"v{i}" for i in range(1, 10)
            ]
            assert len((await backend.als(f"{root}/async")).entries or []) == 10
            assert len((await backend.agrep("v", f"{root}/async")).matches or []) == 9
            assert len((await backend.aglob("*.txt", f"{root}/async")).matches or []) == 10
            up = await backend.aupload_files([(f"{root}/async/up", b"\x00up")])
            assert up == [p.FileUploadResponse(f"{root}/async/up")]
            down = await backend.adownload_files([f"{root}/async/up"])
            assert down[0].content == b"\x00up"
            assert (await backend.adelete(f"{root}/async")).error is None
            assert (await backend.aread(paths[1])).error == p.FILE_NOT_FOUND

        asyncio.run(scenario())

    def test_a_write_that_succeeds_reads_back_wherever_it_was_aimed(
        self, backend: p.BackendProtocol, root: str
    ) -> None:
        """Nothing lost, ever: a write answers success only if the bytes are there to read, also
        outside the writable area (a sandbox whose ``/`` is a throwaway tmpfs must refuse)."""
        tag = uuid.uuid4().hex[:10]
        targets = (f"{root}/kept.txt", f"/conf-top-{tag}/kept.txt", f"/opt/conf-{tag}/kept.txt")
        for path in targets:
            content = f"kept at {path}\n"
            written = backend.write(path, content)
            if written.error is not None:
                assert written.error == p.PERMISSION_DENIED, (path, written)
                assert backend.download_files([path])[0].error is not None, path
                continue
            try:
                assert whole_text(backend, path) == content, path
                [uploaded] = backend.upload_files([(path, content.encode() * 2)])
                assert uploaded.error is None, (path, uploaded)
                assert backend.download_files([path])[0].content == content.encode() * 2, path
                assert path in [entry.path for entry in listed_entries(backend, path.rsplit("/", 1)[0])], path
            finally:
                if not path.startswith(root):
                    backend.delete(path)
                    backend.delete(path.rsplit("/", 1)[0])
        [upload] = backend.upload_files([(f"/conf-up-{tag}/x.bin", b"\x00x")])
        if upload.error is None:
            assert backend.download_files([f"/conf-up-{tag}/x.bin"])[0].content == b"\x00x"
            backend.delete(f"/conf-up-{tag}/x.bin")
            backend.delete(f"/conf-up-{tag}")
        else:
            assert upload.error == p.PERMISSION_DENIED, upload
