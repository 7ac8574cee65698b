"""Docstrings and comments state invariants: a timing figure is a measurement of one machine on
one day, and lives in benchmarks/README.md beside the benchmark that measures it; a story of what
the code did before lives in the commit that changed it.

Every module of ``sandboxes`` and ``agent`` is checked, except those listed in `NOT_YET`."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["sandboxes", "agent"]
NOT_YET: list[str] = []
"""Modules being split or rewritten elsewhere as this check grew: reviewed once that work lands."""
TIMING = re.compile(
    r"~\s?\d"
    r"|\b\d+(?:[.,]\d+)?\s?(?:ms|µs|us|ns)\b"
    r"|\b\d+(?:\.\d+)?\s?[KMG]iB/s\b"
    r"|\b\d+(?:\.\d+)?\s?x (?:faster|slower)\b|\btimes (?:faster|slower)\b"
    r"|\b\d+(?:\.\d+)?\s?% (?:of (?:the |its )?(?:\w+'s )?(?:CPU|time)|more|less|faster|slower)\b"
    r"|\b(?:took|costs?) (?:~|about )?\d"
)
"""A measured duration or speed: ``~2.5 ms``, ``40 µs``, ``~70``, ``415 MiB/s``, ``1.9x faster``,
``4% of the service's CPU``, ``took 43 s``."""
STORY = re.compile(
    r"\blast session\b|\btoday's code\b|\bbefore this (?:change|fix|commit)\b|\bused to (?:be|take|cost)\b"
)
"""A before/now story: ``used to take``, ``before this change``, ``last session``."""


def _modules() -> list[Path]:
    skipped = [ROOT / name for name in NOT_YET]
    found: list[Path] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if not any(path == skip or skip in path.parents for skip in skipped):
                found.append(path)
    return found


def _docstrings(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Every docstring of a module: its own, its classes' and functions', and the string
    statements that document an attribute or a constant."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for statement in body:
            value = statement.value if isinstance(statement, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                yield statement.lineno, value.value


def _comments(source: str) -> Iterator[tuple[int, str]]:
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def _prose(source: str, where: str) -> Iterator[tuple[int, str]]:
    yield from _docstrings(ast.parse(source, where))
    yield from _comments(source)


@pytest.mark.parametrize("module", _modules(), ids=lambda path: str(path.relative_to(ROOT)))
def test_docstrings_carry_no_timing_figure_or_story(module: Path) -> None:
    where = str(module.relative_to(ROOT))
    found = [
        f"line {line}: {match.group()!r}"
        for line, text in _prose(module.read_text(), where)
        for pattern in (TIMING, STORY)
        for match in pattern.finditer(text)
    ]
    assert not found, (
        f"{where} states timings or stories in docstrings or comments (figures go to "
        f"benchmarks/README.md, stories to the commit message): {found}"
    )


def test_every_package_is_checked() -> None:
    checked = {str(path.relative_to(ROOT)) for path in _modules()}
    assert {
        "agent/graph.py",
        "sandboxes/_helper/_loop.py",
        "sandboxes/base.py",
        "sandboxes/server/e2b/envd.py",
    } <= checked
    assert checked == {str(path.relative_to(ROOT)) for package in PACKAGES for path in (ROOT / package).rglob("*.py")}


def test_the_pattern_finds_a_figure() -> None:
    assert TIMING.search("listing it cost ~2.5 ms")
    assert TIMING.search("about 40 µs a call")
    assert TIMING.search("held 64 MiB uploads to 260 MiB/s")
    assert TIMING.search("~4% of the service's CPU")
    assert TIMING.search("answered a timeout after it took 43 s")
    assert TIMING.search("several times faster than walking the dataclasses")
    assert not TIMING.search("a budget of 0.1 s and 8 MiB, 15 s to acknowledge")
    assert not TIMING.search("at 85% of the model's context keep its last 10%")
    assert not TIMING.search("0x1f, 64 KiB frames, waits 5 s")


def test_the_pattern_finds_a_story() -> None:
    assert STORY.search("the loop used to take a lock per call")
    assert STORY.search("before this change every command forked twice")
    assert not STORY.search("the client's WSClient is only used to open the websocket")
