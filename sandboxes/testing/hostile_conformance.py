"""Input every backend must survive unharmed (`HostileInputs`, part of `BackendConformance`):
invalid paths are refused by every operation, hostile and random names and bytes round-trip,
and random operation sequences answer exactly as the in-memory reference backend does."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandboxes import protocol as p
from sandboxes.state import StateBackend
from sandboxes.testing import differential
from sandboxes.testing._answers import grep_matches, listed_entries, whole_text
from sandboxes.testing.corpus import CANARY, HOSTILE_NAMES

__all__ = ["BAD_PATHS", "HostileInputs"]

BAD_PATHS = ("relative/path.txt", "", "/a/../b", "~/x", "/nul\x00byte", "C:\\windows")


class HostileInputs:
    """Hostile, random and differential checks; the ``backend`` and ``root`` fixtures are
    `BackendConformance`'s."""

    @pytest.mark.parametrize("bad", BAD_PATHS, ids=repr)
    def test_invalid_paths_are_refused_everywhere(self, backend: p.BackendProtocol, bad: str) -> None:
        assert backend.ls(bad).error == p.INVALID_PATH
        assert backend.read(bad).error == p.INVALID_PATH
        assert backend.write(bad, "x").error == p.INVALID_PATH
        assert backend.edit(bad, "a", "b").error == p.INVALID_PATH
        assert backend.delete(bad).error == p.INVALID_PATH
        if bad:  # an empty search root means the default root, as in deepagents
            assert backend.grep("x", bad).error == p.INVALID_PATH
            assert backend.glob("*", bad).error == p.INVALID_PATH
        assert backend.upload_files([(bad, b"x")])[0].error == p.INVALID_PATH
        assert backend.download_files([bad])[0].error == p.INVALID_PATH

    def test_hostile_names_survive_every_operation(self, backend: p.BackendProtocol, root: str) -> None:
        for name in HOSTILE_NAMES:
            path = f"{root}/{name}"
            assert backend.write(path, f"content of {name}\n").error is None, name
            assert whole_text(backend, path) == f"content of {name}\n", name
            assert backend.edit(path, "content", "body").error is None, name
        entries = {e.path for e in listed_entries(backend, root)}
        assert entries == {f"{root}/{name}" for name in HOSTILE_NAMES}
        grep = grep_matches(backend.grep("body of", root))
        assert sorted(m.path for m in grep) == sorted(f"{root}/{name}" for name in HOSTILE_NAMES)
        dirname = f"{root}/$(touch {CANARY}) -rf `x`\n"
        assert backend.write(f"{dirname}/-n", "deep").error is None
        assert [m.path for m in grep_matches(backend.grep("deep", dirname))] == [f"{dirname}/-n"]
        assert [m.path for m in backend.glob("-n", root).matches or []] == sorted([f"{dirname}/-n", f"{root}/-n"])
        for name in HOSTILE_NAMES:
            assert backend.delete(f"{root}/{name}").error is None, name
        assert [e.path for e in listed_entries(backend, root)] == [f"{dirname}/"]
        assert backend.read(f"{root}/{CANARY}").error == p.FILE_NOT_FOUND

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        name=st.text(st.characters(exclude_characters="/\x00", exclude_categories=["Cs"]), min_size=1, max_size=40)
        .map(lambda s: s.encode("utf-8")[:200].decode("utf-8", "ignore") or "x")
        .filter(lambda s: s not in (".", "..")),
        content=st.binary(max_size=2048),
    )
    def test_fuzz_names_and_binary_content(
        self, backend: p.BackendProtocol, root: str, name: str, content: bytes
    ) -> None:
        path = f"{root}/fuzz/{name}"
        assert backend.upload_files([(path, content)]) == [p.FileUploadResponse(path)]
        assert backend.download_files([path]) == [p.FileDownloadResponse(path, content)]
        assert path in {e.path for e in listed_entries(backend, f"{root}/fuzz")}
        assert [m.path for m in backend.glob("*", f"{root}/fuzz").matches or []] == (
            [] if name.startswith(".") else [path]
        )
        assert backend.delete(path) == p.DeleteResult(path=path)
        assert listed_entries(backend, f"{root}/fuzz") == []

    # ------------------------------------------------------------------ differential

    differential_examples = 40

    def test_differential_against_state_backend(self, backend: p.BackendProtocol, root: str) -> None:
        """Random operation sequences answer exactly as on the in-memory reference backend."""
        counter = iter(range(1 << 30))

        @settings(max_examples=self.differential_examples, deadline=None, suppress_health_check=list(HealthCheck))
        @given(ops=differential.operations())
        def check(ops: list[tuple[str, tuple[object, ...]]]) -> None:
            case_root = f"{root}/case{next(counter)}"
            reference = StateBackend()
            for step, (method, args) in enumerate(ops):
                expected = differential.comparable(differential.apply(reference, case_root, method, args))
                actual = differential.comparable(differential.apply(backend, case_root, method, args))
                assert actual == expected, f"step {step}: {method}{args!r}"

        check()
