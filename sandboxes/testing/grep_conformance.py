"""Greps whose answer every backend must bound (`GrepBounds`, part of `BackendConformance`):
an empty pattern matches every line, and no answer holds more than the caps of
`sandboxes.semantics.finish_grep`, past which it says ``truncated``."""

from __future__ import annotations

from sandboxes import protocol as p
from sandboxes.semantics import GREP_MAX_CHARS, GREP_MAX_MATCHES

__all__ = ["GrepBounds"]


class GrepBounds:
    """Bounded grep answers; the ``backend`` and ``root`` fixtures are `BackendConformance`'s."""

    def test_grep_empty_pattern_matches_every_line(self, backend: p.BackendProtocol, root: str) -> None:
        backend.write(f"{root}/a.txt", "one\n\nthree\n")
        backend.write(f"{root}/sub/b.txt", "no newline at the end")
        assert backend.grep("", root) == p.GrepResult(
            matches=[
                p.GrepMatch(f"{root}/a.txt", 1, "one"),
                p.GrepMatch(f"{root}/a.txt", 2, ""),
                p.GrepMatch(f"{root}/a.txt", 3, "three"),
                p.GrepMatch(f"{root}/sub/b.txt", 1, "no newline at the end"),
            ]
        )

    def test_grep_empty_pattern_from_the_root_is_bounded(self, backend: p.BackendProtocol, root: str) -> None:
        """Every line of every file matches: the answer is never empty, and never past the caps."""
        backend.write(f"{root}/a.txt", "one\n")
        result = backend.grep("", "/")
        matches = _bounded(result)
        assert matches, result
        assert result.truncated or p.GrepMatch(f"{root}/a.txt", 1, "one") in matches
        assert matches == sorted(matches, key=lambda m: (m.path, m.line))

    def test_grep_answer_is_capped_in_count(self, backend: p.BackendProtocol, root: str) -> None:
        path = f"{root}/many.txt"
        backend.write(path, "hit\n" * (GREP_MAX_MATCHES + 5))
        result = backend.grep("hit", root)
        assert result.truncated
        assert _bounded(result) == [p.GrepMatch(path, line, "hit") for line in range(1, GREP_MAX_MATCHES + 1)]
        assert backend.grep("hit", root, max_count=GREP_MAX_MATCHES + 10).truncated  # the cap wins

    def test_grep_answer_is_capped_in_size(self, backend: p.BackendProtocol, root: str) -> None:
        path = f"{root}/wide.txt"
        wide = "x" * (1 << 20)
        lines = GREP_MAX_CHARS // len(wide) + 1
        assert backend.upload_files([(path, f"{wide}\n".encode() * lines)])[0].error is None
        result = backend.grep("x", root)
        assert result.truncated, (result.error, result.message, len(result.matches or []))
        assert _bounded(result) == [p.GrepMatch(path, line, wide) for line in range(1, len(result.matches or []) + 1)]
        assert result.matches


def _bounded(result: p.GrepResult) -> list[p.GrepMatch]:
    """The matches of an answer, checked to be within the caps."""
    assert result.error is None, result
    assert result.matches is not None
    assert len(result.matches) <= GREP_MAX_MATCHES
    assert sum(len(m.path) + len(m.text) for m in result.matches) <= GREP_MAX_CHARS
    return result.matches
