"""CompositeBackend: routing, merging, the deepagents composite bugs we must not have, and the
conformance suite over three composites."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandboxes import protocol as p
from sandboxes.composite import CompositeBackend, CompositeSandbox, _route_patterns
from sandboxes.local import LocalSandbox
from sandboxes.state import StateBackend
from sandboxes.testing import BackendConformance, SandboxConformance


def _paths(entries: list[p.FileInfo] | list[p.GrepMatch] | None) -> list[str]:
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


class AsyncOnlyState(StateBackend):
    """Answers only through its async twins, so a composite that falls back to running its own
    sync methods in a thread (instead of awaiting the routed backend) fails loudly. Searches
    wait for each other at a barrier: sequential awaiting would never get past it."""

    def __init__(self, barrier: asyncio.Barrier | None = None) -> None:
        super().__init__()
        self.sync_allowed = True
        self.barrier = barrier

    def _sync(self) -> None:
        if not self.sync_allowed:
            raise AssertionError("the composite called a sync method from an async twin")

    def ls(self, path: str) -> p.LsResult:
        self._sync()
        return super().ls(path)

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> p.ReadResult:
        self._sync()
        return super().read(file_path, offset, limit)

    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> p.GrepResult:
        self._sync()
        return super().grep(pattern, path, glob, max_count=max_count)

    def glob(self, pattern: str, path: str | None = None) -> p.GlobResult:
        self._sync()
        return super().glob(pattern, path)

    async def als(self, path: str) -> p.LsResult:
        return StateBackend.ls(self, path)

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> p.ReadResult:
        return StateBackend.read(self, file_path, offset, limit)

    async def agrep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> p.GrepResult:
        if self.barrier is not None:
            await self.barrier.wait()
        return StateBackend.grep(self, pattern, path, glob, max_count=max_count)

    async def aglob(self, pattern: str, path: str | None = None) -> p.GlobResult:
        if self.barrier is not None:
            await self.barrier.wait()
        return StateBackend.glob(self, pattern, path)


# ---------------------------------------------------------------------- construction


@pytest.mark.parametrize(
    ("routes", "message"),
    [
        ({"mem": StateBackend()}, "absolute"),
        ({"/a/../b": StateBackend()}, r"'\.\.'"),
        ({"": StateBackend()}, "non-empty"),
        ({"/": StateBackend()}, "root"),
        ({"//./": StateBackend()}, "root"),
        ({"/mem": StateBackend(), "/mem/": StateBackend()}, "duplicate"),
        ({"/mem": StateBackend(), "//mem/.": StateBackend()}, "duplicate"),
        ({"~/mem": StateBackend()}, "home"),
    ],
)
def test_regression_2928_unvalidated_prefixes_are_refused(routes: dict[str, p.BackendProtocol], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CompositeBackend(StateBackend(), routes)


def test_route_must_be_a_backend() -> None:
    with pytest.raises(TypeError, match="BackendProtocol"):
        CompositeBackend(StateBackend(), {"/mem": object()})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="BackendProtocol"):
        CompositeBackend(object(), {})  # type: ignore[arg-type]


def test_routes_are_exposed_normalised_and_read_only() -> None:
    mem = StateBackend()
    composite = CompositeBackend(StateBackend(), {"/mem//": mem})
    assert dict(composite.routes) == {"/mem": mem}
    with pytest.raises(TypeError):
        composite.routes["/x"] = mem  # type: ignore[index]


# ---------------------------------------------------------------------- routing


def test_prefix_is_stripped_for_the_routed_backend_and_added_back_once() -> None:
    default, mem = StateBackend(), StateBackend()
    composite = CompositeBackend(default, {"/memories": mem})
    assert composite.write("/memories/a.txt", "hello\n") == p.WriteResult(path="/memories/a.txt")
    assert set(mem.files) == {"/a.txt"}
    assert default.files == {}
    assert composite.edit("/memories/a.txt", "hello", "bye") == p.EditResult(path="/memories/a.txt", occurrences=1)
    read = composite.read("/memories/a.txt")
    assert read.file_data is not None
    assert read.file_data.content == "bye\n"
    assert composite.grep("bye").matches == [p.GrepMatch("/memories/a.txt", 1, "bye")]
    assert _paths(composite.glob("*.txt").matches) == ["/memories/a.txt"]
    assert composite.delete("/memories/a.txt") == p.DeleteResult(path="/memories/a.txt")
    assert mem.files == {}


def test_routing_is_component_wise() -> None:
    default, mem = StateBackend(), StateBackend()
    composite = CompositeBackend(default, {"/memories": mem})
    composite.write("/memoriesX/a", "x")
    composite.write("/memories", "onto the mount")
    assert set(default.files) == {"/memoriesX/a"}
    assert mem.files == {}


def test_longest_prefix_wins_for_nested_routes() -> None:
    default, outer, inner = StateBackend(), StateBackend(), StateBackend()
    composite = CompositeBackend(default, {"/a": outer, "/a/b": inner})
    composite.write("/a/x", "1")
    composite.write("/a/b/y", "2")
    composite.write("/a/bc/z", "3")
    assert set(outer.files) == {"/x", "/bc/z"}
    assert set(inner.files) == {"/y"}
    assert _paths(composite.ls("/a").entries) == ["/a/b/", "/a/bc/", "/a/x"]
    assert _paths(composite.glob("**", "/").matches) == ["/a/b/y", "/a/bc/z", "/a/x"]
    assert _paths(composite.grep("", "/a").matches) == ["/a/b/y", "/a/bc/z", "/a/x"]


def test_error_messages_name_the_callers_path() -> None:
    composite = CompositeBackend(StateBackend(), {"/memories": StateBackend()})
    missing = composite.read("/memories/nope.txt")
    assert missing.error == p.FILE_NOT_FOUND
    assert missing.message == "File '/memories/nope.txt' not found"
    composite.write("/memories/f.txt", "abc")
    not_found = composite.edit("/memories/f.txt", "zzz", "y")
    assert not_found.error == p.STRING_NOT_FOUND
    assert not_found.message is not None
    assert "'/memories/f.txt'" in not_found.message
    assert "'/f.txt'" not in not_found.message
    listing = composite.ls("/memories/f.txt")
    assert (listing.error, listing.message) == (
        p.NOT_A_DIRECTORY,
        "'/memories/f.txt' is not a directory (or a parent is a file)",
    )


def test_invalid_paths_are_answered_like_state_backend() -> None:
    composite = CompositeBackend(StateBackend(), {"/mem": StateBackend()})
    reference = StateBackend()
    for bad in ("relative", "/a/../b", "", "/x\x00"):
        assert composite.read(bad) == reference.read(bad)
        assert composite.write(bad, "x") == reference.write(bad, "x")
        assert composite.ls(bad) == reference.ls(bad)
        assert composite.delete(bad) == reference.delete(bad)
    assert composite.glob("../*") == reference.glob("../*")
    assert composite.grep("x", "/", glob="../*") == reference.grep("x", "/", glob="../*")


def test_mount_points_and_their_parents_are_directories() -> None:
    default = StateBackend()
    composite = CompositeBackend(default, {"/data/cache": StateBackend()})
    for path in ("/data/cache", "/data", "/"):
        assert composite.read(path).error == p.IS_DIRECTORY, path
        assert composite.write(path, "x").error == p.IS_DIRECTORY, path
        assert composite.edit(path, "a", "b").error == p.IS_DIRECTORY, path
        assert composite.upload_files([(path, b"x")])[0].error == p.IS_DIRECTORY, path
        assert composite.download_files([path])[0].error == p.IS_DIRECTORY, path
    assert default.files == {}
    assert composite.ls("/data") == p.LsResult(entries=[p.FileInfo("/data/cache/", True, 0, None)])
    assert composite.ls("/data/cache") == p.LsResult(entries=[])


def test_a_default_file_where_mounts_imply_a_directory_is_hidden() -> None:
    default = StateBackend({"/data": p.FileData("a file in the way")})
    composite = CompositeBackend(default, {"/data/cache": StateBackend()})
    assert composite.ls("/") == p.LsResult(entries=[p.FileInfo("/data/", True, 0, None)])
    assert _paths(composite.ls("/data").entries) == ["/data/cache/"]
    assert composite.read("/data").error == p.IS_DIRECTORY


# ---------------------------------------------------------------------- delete


def test_deleting_a_mount_point_or_its_parent_is_refused() -> None:
    mem = StateBackend()
    composite = CompositeBackend(StateBackend(), {"/data/mem": mem})
    composite.write("/data/mem/keep", "k")
    composite.write("/data/other", "o")
    for path in ("/data/mem", "/data/mem/", "/data"):
        refused = composite.delete(path)
        assert refused.error == p.INVALID_PATH, path
        assert refused.message is not None
        assert "/data/mem" in refused.message
    assert composite.delete("/").error == p.INVALID_PATH
    assert set(mem.files) == {"/keep"}
    assert _paths(composite.glob("**", "/data").matches) == ["/data/mem/keep", "/data/other"]
    assert composite.delete("/data/mem/keep") == p.DeleteResult(path="/data/mem/keep")


# ---------------------------------------------------------------------- ls


def test_ls_root_merges_default_entries_with_mount_points() -> None:
    default = StateBackend()
    composite = CompositeBackend(default, {"/memories/": StateBackend(), "/data/cache": StateBackend()})
    composite.write("/a.txt", "a")
    composite.write("/data/x", "x")
    composite.write("/z/y", "y")
    entries = composite.ls("/").entries
    assert entries is not None
    assert [(e.path, e.is_dir) for e in entries] == [
        ("/a.txt", False),
        ("/data/", True),
        ("/memories/", True),
        ("/z/", True),
    ]
    assert entries[0].size == 1
    assert _paths(composite.ls("/data").entries) == ["/data/cache/", "/data/x"]


def test_regression_3436_3743_ls_paths_are_prefixed_exactly_once() -> None:
    composite = CompositeBackend(StateBackend(), {"/memories": StateBackend()})
    composite.write("/memories/top.txt", "t")
    composite.write("/memories/sub/inner.txt", "i")
    composite.write("/memories/sub/deeper/x.txt", "x")
    for listing in (composite.ls("/memories"), composite.ls("/memories/")):
        assert _paths(listing.entries) == ["/memories/sub/", "/memories/top.txt"]
    assert _paths(composite.ls("/memories/sub").entries) == ["/memories/sub/deeper/", "/memories/sub/inner.txt"]
    for path in _paths(composite.glob("**", "/memories").matches) + _paths(composite.grep("", "/").matches):
        assert path.count("memories") == 1, path


def test_default_content_under_a_route_is_shadowed() -> None:
    default = StateBackend({"/mem/hidden.txt": p.FileData("needle"), "/mem/d/h.txt": p.FileData("needle")})
    default.write("/visible.txt", "needle")
    composite = CompositeBackend(default, {"/mem": StateBackend()})
    composite.write("/mem/real.txt", "needle")
    assert _paths(composite.ls("/").entries) == ["/mem/", "/visible.txt"]
    assert _paths(composite.ls("/mem").entries) == ["/mem/real.txt"]
    assert _paths(composite.glob("**/*.txt").matches) == ["/mem/real.txt", "/visible.txt"]
    assert _paths(composite.grep("needle").matches) == ["/mem/real.txt", "/visible.txt"]
    assert composite.read("/mem/hidden.txt").error == p.FILE_NOT_FOUND


def test_ls_errors_pass_through() -> None:
    composite = CompositeBackend(StateBackend(), {"/mem": StateBackend()})
    assert composite.ls("/missing").error == p.FILE_NOT_FOUND
    assert composite.ls("/mem/missing").error == p.FILE_NOT_FOUND
    composite.write("/file", "x")
    assert composite.ls("/file").error == p.NOT_A_DIRECTORY


# ---------------------------------------------------------------------- grep / glob


def test_search_rooted_below_slash_finds_routes_nested_under_it() -> None:
    composite = CompositeBackend(StateBackend(), {"/data/cache": StateBackend()})
    composite.write("/data/top.py", "needle")
    composite.write("/data/cache/a.py", "needle")
    composite.write("/data/cache/deep/b.py", "needle")
    composite.write("/other/c.py", "needle")
    expected = ["/data/cache/a.py", "/data/cache/deep/b.py", "/data/top.py"]
    assert _paths(composite.grep("needle", "/data").matches) == expected
    assert _paths(composite.glob("*.py", "/data").matches) == expected
    assert _paths(composite.glob("**/*.py", "/data").matches) == expected
    assert _paths(composite.glob("cache/*.py", "/data").matches) == ["/data/cache/a.py"]
    assert _paths(composite.glob("/*.py", "/data").matches) == ["/data/top.py"]
    assert _paths(composite.grep("needle", "/data", glob="cache/**/*.py").matches) == expected[:2]
    assert _paths(composite.grep("needle", "/data/cache").matches) == expected[:2]


def test_search_root_that_exists_only_through_a_mount() -> None:
    composite = CompositeBackend(StateBackend(), {"/a/b/c": StateBackend()})
    composite.write("/a/b/c/f.txt", "needle")
    assert _paths(composite.grep("needle", "/a").matches) == ["/a/b/c/f.txt"]
    assert _paths(composite.glob("b/c/*.txt", "/a").matches) == ["/a/b/c/f.txt"]
    assert composite.grep("needle", "/nowhere").error == p.FILE_NOT_FOUND
    assert composite.glob("*", "/a/b/c/missing").error == p.FILE_NOT_FOUND


def test_glob_patterns_are_relative_to_the_search_root_across_mounts() -> None:
    composite = CompositeBackend(StateBackend(), {"/src/vendor": StateBackend(), "/.cfg": StateBackend()})
    for path in ("/src/main.py", "/src/vendor/lib.py", "/src/vendor/.hidden/x.py", "/.cfg/settings.yml", "/top.yml"):
        composite.write(path, "x")

    def found(pattern: str, root: str = "/") -> list[str]:
        return _paths(composite.glob(pattern, root).matches)

    assert found("src/*/*.py") == ["/src/vendor/lib.py"]
    assert found("src/**/*.py") == ["/src/main.py", "/src/vendor/lib.py"]
    assert found("src/{vendor,x}/.hidden/*.py") == ["/src/vendor/.hidden/x.py"]
    assert found("**/*.yml") == ["/top.yml"]  # `**` does not enter dot-directories
    assert found("*.yml") == ["/.cfg/settings.yml", "/top.yml"]
    assert found(".cfg/*") == ["/.cfg/settings.yml"]
    assert found("vendor/*.py", "/src") == ["/src/vendor/lib.py"]
    assert found("*.py", "/src/vendor") == ["/src/vendor/.hidden/x.py", "/src/vendor/lib.py"]
    assert found("/*.py", "/src/vendor") == ["/src/vendor/lib.py"]


def test_route_patterns_are_residuals_of_the_pattern() -> None:
    assert _route_patterns("*.py", "a/b") == ["*.py"]
    assert _route_patterns("**/*.py", "a/b") == ["/**/*.py"]
    assert _route_patterns("cache/*.py", "cache") == ["/*.py"]
    assert _route_patterns("other/*.py", "cache") == []
    assert _route_patterns("/*.py", "cache") == []
    assert _route_patterns("{a,b}/c/*.py", "b/c") == ["/*.py"]
    assert _route_patterns("**/.h/*", ".h") == ["/*"]  # `**` may not consume a dot-directory
    assert _route_patterns("**/x/**/*.py", "x") == ["/**/x/**/*.py", "/**/*.py"]


def test_grep_max_count_applies_to_the_merged_total() -> None:
    composite = CompositeBackend(StateBackend(), {"/m1": StateBackend(), "/m2": StateBackend()})
    for name in ("/a.txt", "/m1/b.txt", "/m2/c.txt"):
        composite.write(name, "hit\nhit\n")
    capped = composite.grep("hit", max_count=3)
    assert [(m.path, m.line) for m in capped.matches or []] == [("/a.txt", 1), ("/a.txt", 2), ("/m1/b.txt", 1)]
    assert capped.truncated
    exact = composite.grep("hit", max_count=6)
    assert len(exact.matches or []) == 6
    assert not exact.truncated
    assert not composite.grep("hit").truncated


def test_grep_cap_is_not_eaten_by_shadowed_matches() -> None:
    # The default's own (shadowed) files under /b sort before its visible /c: a capped answer
    # from it would hold only shadowed matches.
    default = CountingState()
    default.upload_files([(f"/b/{i}.txt", b"hit\n") for i in range(5)])
    default.write("/c.txt", "hit\n")
    composite = CompositeBackend(default, {"/b": StateBackend()})
    composite.write("/b/routed.txt", "hit\n")
    result = composite.grep("hit", max_count=2)
    assert _paths(result.matches) == ["/b/routed.txt", "/c.txt"]
    assert not result.truncated
    assert [c[1] for c in default.calls if c[0] == "grep"] == [("/", None, 2), ("/", None, None)]


def test_grep_cap_is_not_eaten_by_a_nested_route() -> None:
    # The outer route's own /b (shadowed by the nested route /a/b) sorts before its visible /c.
    outer = CountingState()
    outer.upload_files([(f"/b/{i}.txt", b"hit\n") for i in range(3)])
    outer.write("/c.txt", "hit\n")
    composite = CompositeBackend(StateBackend(), {"/a": outer, "/a/b": StateBackend()})
    composite.write("/a/b/nested.txt", "hit\n")
    result = composite.grep("hit", "/", max_count=2)
    assert _paths(result.matches) == ["/a/b/nested.txt", "/a/c.txt"]
    assert not result.truncated
    assert [c[1] for c in outer.calls if c[0] == "grep"] == [("/", None, 2), ("/", None, None)]
    assert composite.grep("hit", "/", max_count=1).truncated


def test_search_failure_of_any_backend_is_the_answer() -> None:
    class Broken(StateBackend):
        def grep(
            self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
        ) -> p.GrepResult:
            return p.GrepResult(p.UNAVAILABLE, f"backend down while searching '{path}'")

        def glob(self, pattern: str, path: str | None = None) -> p.GlobResult:
            return p.GlobResult(p.UNAVAILABLE, "backend down")

    composite = CompositeBackend(StateBackend(), {"/down": Broken()})
    composite.write("/ok.txt", "x")
    failed = composite.grep("x")
    assert (failed.error, failed.message) == (p.UNAVAILABLE, "backend down while searching '/down'")
    assert composite.glob("*").error == p.UNAVAILABLE
    assert _paths(composite.grep("x", "/ok.txt").matches) == ["/ok.txt"]


# ---------------------------------------------------------------------- upload / download


def test_transfers_make_one_batch_per_backend_and_keep_order() -> None:
    default, mem, cache = CountingState(), CountingState(), CountingState()
    composite = CompositeBackend(default, {"/mem": mem, "/data/cache": cache})
    uploads = composite.upload_files(
        [
            ("/mem/a", b"1"),
            ("/root.txt", b"2"),
            ("relative", b"3"),
            ("/data/cache/b", b"4"),
            ("/mem//c", b"5"),
            ("/data", b"6"),
            ("/mem/a/below", b"7"),
        ]
    )
    assert [(u.path, u.error) for u in uploads] == [
        ("/mem/a", None),
        ("/root.txt", None),
        ("relative", p.INVALID_PATH),
        ("/data/cache/b", None),
        ("/mem//c", None),
        ("/data", p.IS_DIRECTORY),
        ("/mem/a/below", p.NOT_A_DIRECTORY),
    ]
    assert uploads[6].message is not None
    assert "'/mem/a/below'" in uploads[6].message
    assert mem.calls == [("upload_files", ["/a", "/c", "/a/below"])]
    assert default.calls == [("upload_files", ["/root.txt"])]
    assert cache.calls == [("upload_files", ["/b"])]
    downloads = composite.download_files(["/data/cache/b", "/mem/c", "/nope", "/x/../y", "/mem/missing", "/root.txt"])
    assert [(d.path, d.content, d.error) for d in downloads] == [
        ("/data/cache/b", b"4", None),
        ("/mem/c", b"5", None),
        ("/nope", None, p.FILE_NOT_FOUND),
        ("/x/../y", None, p.INVALID_PATH),
        ("/mem/missing", None, p.FILE_NOT_FOUND),
        ("/root.txt", b"2", None),
    ]
    assert downloads[4].message == "File '/mem/missing' not found"
    assert mem.calls[1:] == [("download_files", ["/c", "/missing"])]
    assert default.calls[1:] == [("download_files", ["/nope", "/root.txt"])]
    assert composite.upload_files([]) == []
    assert composite.download_files(["bad"])[0].error == p.INVALID_PATH
    assert len(default.calls) == 2  # neither call reached a backend


# ---------------------------------------------------------------------- deepagents regressions


def test_regression_2884_two_state_routes_are_independent() -> None:
    a, b = StateBackend(), StateBackend()
    composite = CompositeBackend(StateBackend(), {"/a": a, "/b": b})
    composite.write("/a/x", "from a")
    assert composite.read("/b/x").error == p.FILE_NOT_FOUND
    assert composite.ls("/b") == p.LsResult(entries=[])
    composite.write("/b/x", "from b")
    assert _text(composite, "/a/x") == "from a"
    assert _text(composite, "/b/x") == "from b"
    composite.delete("/a/x")
    assert _text(composite, "/b/x") == "from b"
    assert set(a.files) == set()
    assert set(b.files) == {"/x"}


def _text(backend: p.BackendProtocol, path: str) -> str:
    result = backend.read(path)
    assert result.file_data is not None, result
    return result.file_data.content


def _transcript(composite: CompositeBackend, prefix: str) -> list[object]:
    base = prefix.rstrip("/")
    answers: list[object] = [
        composite.write(f"{base}/n/a.txt", "one\ntwo\n"),
        composite.upload_files([(f"{base}/b.bin", b"\x00\x01")]),
        composite.ls("/"),
        composite.ls(base),
        composite.ls(f"{base}/"),
        composite.ls(f"{base}/n"),
        composite.read(f"{base}/n/a.txt").total_lines,
        composite.edit(f"{base}/n/a.txt", "two", "2"),
        composite.grep("2", "/"),
        composite.grep("one", f"{base}/"),
        composite.glob("**/*.txt", "/"),
        composite.glob("*", base),
        composite.download_files([f"{base}/b.bin", f"{base}/missing"]),
        composite.delete(f"{base}/n"),
        composite.delete(base),
    ]
    return [_without_times(a) for a in answers]


def _without_times(answer: object) -> object:
    if isinstance(answer, p.LsResult):
        return answer.error, answer.message, [(e.path, e.is_dir, e.size) for e in answer.entries or []]
    return answer


@pytest.mark.parametrize("written", ["/mem", "/mem/"])
def test_regression_1654_prefix_without_trailing_slash_works_identically(written: str) -> None:
    with_slash = CompositeBackend(StateBackend(), {"/mem/": StateBackend()})
    without_slash = CompositeBackend(StateBackend(), {"/mem": StateBackend()})
    assert _transcript(with_slash, written) == _transcript(without_slash, written)
    assert _paths(without_slash.ls("/").entries) == ["/mem/"]


# ---------------------------------------------------------------------- async


async def test_async_twins_use_the_routed_backends_async_methods() -> None:
    default, mem = AsyncOnlyState(), AsyncOnlyState()
    composite = CompositeBackend(default, {"/mem": mem})
    composite.write("/a.txt", "needle")
    composite.write("/mem/b.txt", "needle")
    default.sync_allowed = mem.sync_allowed = False
    assert _paths((await composite.als("/")).entries) == ["/a.txt", "/mem/"]
    assert _paths((await composite.als("/mem")).entries) == ["/mem/b.txt"]
    read = await composite.aread("/mem/b.txt")
    assert read.file_data is not None
    assert read.file_data.content == "needle"
    default.barrier = mem.barrier = asyncio.Barrier(2)  # both searches must be in flight at once
    grep = await asyncio.wait_for(composite.agrep("needle", "/"), timeout=5)
    assert _paths(grep.matches) == ["/a.txt", "/mem/b.txt"]
    default.barrier = mem.barrier = asyncio.Barrier(2)
    glob = await asyncio.wait_for(composite.aglob("*.txt"), timeout=5)
    assert _paths(glob.matches) == ["/a.txt", "/mem/b.txt"]


async def test_async_fan_out_raises_an_unreachable_backends_error_after_all_calls_finish() -> None:
    class Unreachable(StateBackend):
        async def aglob(self, pattern: str, path: str | None = None) -> p.GlobResult:
            raise ConnectionError("sandbox unreachable")

    class Slow(StateBackend):
        finished = False

        async def aglob(self, pattern: str, path: str | None = None) -> p.GlobResult:
            await asyncio.sleep(0.05)
            Slow.finished = True
            return StateBackend.glob(self, pattern, path)

    composite = CompositeBackend(Slow(), {"/gone": Unreachable()})
    with pytest.raises(ConnectionError, match="unreachable"):
        await composite.aglob("*")
    assert Slow.finished


async def test_async_answers_equal_sync_answers() -> None:
    composite = CompositeBackend(StateBackend(), {"/mem": StateBackend(), "/d/c": StateBackend()})
    assert await composite.awrite("/mem/x.txt", "hi\n") == p.WriteResult(path="/mem/x.txt")
    await composite.aupload_files([("/d/c/z.txt", b"hi\n"), ("/top.txt", b"hi\n")])
    assert await composite.agrep("hi", "/", max_count=3) == composite.grep("hi", "/", max_count=3)
    assert await composite.aglob("**/*.txt", "/d") == composite.glob("**/*.txt", "/d")
    assert await composite.adownload_files(["/d/c/z.txt", "/nope"]) == composite.download_files(["/d/c/z.txt", "/nope"])
    assert await composite.aedit("/mem/x.txt", "hi", "ho") == p.EditResult(path="/mem/x.txt", occurrences=1)
    assert await composite.adelete("/mem") == composite.delete("/mem")
    assert await composite.adelete("/mem/x.txt") == p.DeleteResult(path="/mem/x.txt")


# ---------------------------------------------------------------------- sandbox default


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalSandbox]:
    with LocalSandbox(tmp_path / "root") as sandbox:
        yield sandbox


def test_composite_executes_only_when_the_default_can(local: LocalSandbox) -> None:
    plain = CompositeBackend.create(StateBackend(), {"/mem": StateBackend()})
    assert type(plain) is CompositeBackend
    assert not isinstance(plain, p.SandboxBackendProtocol)
    assert not hasattr(plain, "execute")
    sandbox = CompositeBackend.create(local, {"/mem": StateBackend()})
    assert isinstance(sandbox, CompositeSandbox)
    assert isinstance(sandbox, p.SandboxBackendProtocol)
    assert sandbox.id == local.id
    assert sandbox.execute("echo hi").output == "hi\n"
    assert not isinstance(CompositeBackend(local, {}), p.SandboxBackendProtocol)
    with pytest.raises(TypeError, match="SandboxBackendProtocol"):
        CompositeSandbox(StateBackend(), {})  # type: ignore[arg-type]


async def test_composite_sandbox_async_execute(local: LocalSandbox) -> None:
    sandbox = CompositeBackend.create(local, {})
    result = await sandbox.aexecute('printf %s "$X"', env={"X": "y"})
    assert (result.output, result.exit_code) == ("y", 0)


def test_local_default_with_state_routes(local: LocalSandbox) -> None:
    root = str(local.root)
    mem = StateBackend()
    composite = CompositeBackend.create(local, {f"{root}/mem": mem, "/virtual/notes": StateBackend()})
    composite.write(f"{root}/src/main.py", "needle = 1\n")
    composite.write(f"{root}/mem/note.py", "needle = 2\n")
    composite.write("/virtual/notes/n.py", "needle = 3\n")
    assert set(mem.files) == {"/note.py"}
    assert not (local.root / "mem").exists()
    assert _paths(composite.ls(root).entries) == [f"{root}/mem/", f"{root}/src/"]
    assert _paths(composite.grep("needle", root).matches) == [f"{root}/mem/note.py", f"{root}/src/main.py"]
    assert _paths(composite.glob("**/*.py", root).matches) == [f"{root}/mem/note.py", f"{root}/src/main.py"]
    assert _paths(composite.glob("mem/*.py", root).matches) == [f"{root}/mem/note.py"]
    assert _text(composite, "/virtual/notes/n.py") == "needle = 3\n"
    # Commands see the default's filesystem only.
    listing = composite.execute(f"ls {root}")
    assert listing.output.split() == ["src"]


# ---------------------------------------------------------------------- differential


_TREE = (
    "top.py",
    "a.txt",
    ".dot/x.py",
    "data/top.py",
    "data/cache/k.txt",
    "data/cache/deep/y.py",
    "data/cache/.h/z.py",
    "data/cachex/w.py",
    "mem/k.txt",
    "mem/notes/n.py",
    "mem/inner/k.txt",
    "mem/inner/q.py",
)
_MOUNTS = ("/data/cache", "/mem", "/mem/inner")
_PATTERNS = (
    "*.py",
    "**/*.py",
    "/*.py",
    "**",
    "/**",
    "*",
    "cache/**",
    "data/cache/*.py",
    "data/cache/**/*.py",
    "**/cache/**/*.py",
    "*/cache/*",
    "*/*/.h/*",
    "**/.h/*",
    "{data,mem}/**/*.py",
    "data/{cache,x}/*",
    "?ata/c*/**",
    "[a-m]*/**/*.txt",
    ".*",
    ".dot/*",
    "inner/*",
    "mem/inner/*.py",
    "**/inner/**",
    "notes/../x",
)
_ROOTS = ("/", "/data", "/data/cache", "/data/cache/deep", "/mem", "/mem/inner", "/mem/notes", "/nope", "/a.txt")


def _flat_and_composite(files: list[str]) -> tuple[StateBackend, CompositeBackend]:
    flat = StateBackend()
    composite = CompositeBackend(StateBackend(), {m: StateBackend() for m in _MOUNTS})
    for name in files:
        for backend in (flat, composite):
            assert backend.write(f"/{name}", f"needle in {name}\nneedle again\n").error is None
    return flat, composite


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    files=st.lists(st.sampled_from(_TREE), unique=True).map(
        lambda chosen: sorted(set(chosen) | {"data/cache/k.txt", "mem/k.txt", "mem/inner/k.txt"})
    ),
    pattern=st.sampled_from(_PATTERNS),
    root=st.sampled_from(_ROOTS),
    max_count=st.none() | st.integers(0, 6),
)
def test_composite_searches_answer_like_one_flat_backend(
    files: list[str], pattern: str, root: str, max_count: int | None
) -> None:
    """With a file inside every mount, the composite namespace is an ordinary tree, so every
    search must answer exactly as one StateBackend holding the same files."""
    flat, composite = _flat_and_composite(files)
    assert composite.glob(pattern, root) == flat.glob(pattern, root)
    assert composite.grep("needle", root, glob=pattern, max_count=max_count) == flat.grep(
        "needle", root, glob=pattern, max_count=max_count
    )
    assert composite.grep("again", root, max_count=max_count) == flat.grep("again", root, max_count=max_count)
    assert _without_times(composite.ls(root)) == _without_times(flat.ls(root))


# ---------------------------------------------------------------------- conformance


class TestCompositeConformanceAtRoot(BackendConformance):
    @pytest.fixture
    def backend(self) -> CompositeBackend:
        return CompositeBackend(StateBackend(), {"/mem": StateBackend()})


class TestCompositeConformanceInsideRoute(BackendConformance):
    @pytest.fixture
    def backend(self) -> CompositeBackend:
        return CompositeBackend(StateBackend(), {"/mem": StateBackend()})

    @pytest.fixture
    def base_dir(self) -> str:
        return "/mem"


@pytest.fixture(scope="module")
def local_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSandbox]:
    with LocalSandbox(tmp_path_factory.mktemp("composite-local")) as sandbox:
        yield sandbox


class TestCompositeConformanceOverLocalSandbox(SandboxConformance):
    """Routes live outside the sandbox's directory, so ``root`` is an ordinary empty directory."""

    @pytest.fixture
    def backend(self, local_sandbox: LocalSandbox) -> CompositeSandbox:
        return CompositeBackend.create(local_sandbox, {"/composite-mem": StateBackend()})

    @pytest.fixture
    def base_dir(self, local_sandbox: LocalSandbox) -> str:
        return str(local_sandbox.root)
