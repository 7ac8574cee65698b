"""CompositeBackend's grep and glob across routes: searches rooted below ``/``, glob patterns
relative to the search root, their residuals for each route, a grep cap over the merged total,
failures, and a differential test against one flat StateBackend holding the same files."""

from __future__ import annotations

from composite_support import CountingState, paths_of, without_times
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandboxes import protocol as p
from sandboxes.composite import CompositeBackend, _route_patterns
from sandboxes.state import StateBackend

# ---------------------------------------------------------------------- grep / glob


def test_search_rooted_below_slash_finds_routes_nested_under_it() -> None:
    composite = CompositeBackend(StateBackend(), {"/data/cache": StateBackend()})
    composite.write("/data/top.py", "needle")
    composite.write("/data/cache/a.py", "needle")
    composite.write("/data/cache/deep/b.py", "needle")
    composite.write("/other/c.py", "needle")
    expected = ["/data/cache/a.py", "/data/cache/deep/b.py", "/data/top.py"]
    assert paths_of(composite.grep("needle", "/data").matches) == expected
    assert paths_of(composite.glob("*.py", "/data").matches) == expected
    assert paths_of(composite.glob("**/*.py", "/data").matches) == expected
    assert paths_of(composite.glob("cache/*.py", "/data").matches) == ["/data/cache/a.py"]
    assert paths_of(composite.glob("/*.py", "/data").matches) == ["/data/top.py"]
    assert paths_of(composite.grep("needle", "/data", glob="cache/**/*.py").matches) == expected[:2]
    assert paths_of(composite.grep("needle", "/data/cache").matches) == expected[:2]


def test_search_root_that_exists_only_through_a_mount() -> None:
    composite = CompositeBackend(StateBackend(), {"/a/b/c": StateBackend()})
    composite.write("/a/b/c/f.txt", "needle")
    assert paths_of(composite.grep("needle", "/a").matches) == ["/a/b/c/f.txt"]
    assert paths_of(composite.glob("b/c/*.txt", "/a").matches) == ["/a/b/c/f.txt"]
    assert composite.grep("needle", "/nowhere").error == p.FILE_NOT_FOUND
    assert composite.glob("*", "/a/b/c/missing").error == p.FILE_NOT_FOUND


def test_glob_patterns_are_relative_to_the_search_root_across_mounts() -> None:
    composite = CompositeBackend(StateBackend(), {"/src/vendor": StateBackend(), "/.cfg": StateBackend()})
    for path in ("/src/main.py", "/src/vendor/lib.py", "/src/vendor/.hidden/x.py", "/.cfg/settings.yml", "/top.yml"):
        composite.write(path, "x")

    def found(pattern: str, root: str = "/") -> list[str]:
        return paths_of(composite.glob(pattern, root).matches)

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
    assert paths_of(result.matches) == ["/b/routed.txt", "/c.txt"]
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
    assert paths_of(result.matches) == ["/a/b/nested.txt", "/a/c.txt"]
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
    assert paths_of(composite.grep("x", "/ok.txt").matches) == ["/ok.txt"]


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
    assert without_times(composite.ls(root)) == without_times(flat.ls(root))
