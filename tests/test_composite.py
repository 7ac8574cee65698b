"""CompositeBackend: construction, routing by longest prefix (mount points, delete, ls merging,
batched transfers), the deepagents composite bugs we must not have, and the conformance suite
inside and outside a route."""

from __future__ import annotations

import pytest
from composite_support import CountingState, paths_of, text_of, without_times

from sandboxes import protocol as p
from sandboxes.composite import CompositeBackend
from sandboxes.state import StateBackend
from sandboxes.testing import BackendConformance

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
    assert paths_of(composite.glob("*.txt").matches) == ["/memories/a.txt"]
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
    assert paths_of(composite.ls("/a").entries) == ["/a/b/", "/a/bc/", "/a/x"]
    assert paths_of(composite.glob("**", "/").matches) == ["/a/b/y", "/a/bc/z", "/a/x"]
    assert paths_of(composite.grep("", "/a").matches) == ["/a/b/y", "/a/bc/z", "/a/x"]


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
    assert paths_of(composite.ls("/data").entries) == ["/data/cache/"]
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
    assert paths_of(composite.glob("**", "/data").matches) == ["/data/mem/keep", "/data/other"]
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
    assert paths_of(composite.ls("/data").entries) == ["/data/cache/", "/data/x"]


def test_regression_3436_3743_ls_paths_are_prefixed_exactly_once() -> None:
    composite = CompositeBackend(StateBackend(), {"/memories": StateBackend()})
    composite.write("/memories/top.txt", "t")
    composite.write("/memories/sub/inner.txt", "i")
    composite.write("/memories/sub/deeper/x.txt", "x")
    for listing in (composite.ls("/memories"), composite.ls("/memories/")):
        assert paths_of(listing.entries) == ["/memories/sub/", "/memories/top.txt"]
    assert paths_of(composite.ls("/memories/sub").entries) == ["/memories/sub/deeper/", "/memories/sub/inner.txt"]
    for path in paths_of(composite.glob("**", "/memories").matches) + paths_of(composite.grep("", "/").matches):
        assert path.count("memories") == 1, path


def test_default_content_under_a_route_is_shadowed() -> None:
    default = StateBackend({"/mem/hidden.txt": p.FileData("needle"), "/mem/d/h.txt": p.FileData("needle")})
    default.write("/visible.txt", "needle")
    composite = CompositeBackend(default, {"/mem": StateBackend()})
    composite.write("/mem/real.txt", "needle")
    assert paths_of(composite.ls("/").entries) == ["/mem/", "/visible.txt"]
    assert paths_of(composite.ls("/mem").entries) == ["/mem/real.txt"]
    assert paths_of(composite.glob("**/*.txt").matches) == ["/mem/real.txt", "/visible.txt"]
    assert paths_of(composite.grep("needle").matches) == ["/mem/real.txt", "/visible.txt"]
    assert composite.read("/mem/hidden.txt").error == p.FILE_NOT_FOUND


def test_ls_errors_pass_through() -> None:
    composite = CompositeBackend(StateBackend(), {"/mem": StateBackend()})
    assert composite.ls("/missing").error == p.FILE_NOT_FOUND
    assert composite.ls("/mem/missing").error == p.FILE_NOT_FOUND
    composite.write("/file", "x")
    assert composite.ls("/file").error == p.NOT_A_DIRECTORY


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
    assert text_of(composite, "/a/x") == "from a"
    assert text_of(composite, "/b/x") == "from b"
    composite.delete("/a/x")
    assert text_of(composite, "/b/x") == "from b"
    assert set(a.files) == set()
    assert set(b.files) == {"/x"}


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
    return [without_times(a) for a in answers]


@pytest.mark.parametrize("written", ["/mem", "/mem/"])
def test_regression_1654_prefix_without_trailing_slash_works_identically(written: str) -> None:
    with_slash = CompositeBackend(StateBackend(), {"/mem/": StateBackend()})
    without_slash = CompositeBackend(StateBackend(), {"/mem": StateBackend()})
    assert _transcript(with_slash, written) == _transcript(without_slash, written)
    assert paths_of(without_slash.ls("/").entries) == ["/mem/"]


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
