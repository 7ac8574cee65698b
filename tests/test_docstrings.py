"""Docstrings state invariants: a timing figure is a measurement of one machine on one day, and
lives in benchmarks/README.md beside the benchmark that measures it, not in the code.

The modules checked are those whose docstrings have been reviewed; add a module here once its
figures have moved."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REVIEWED = [
    "sandboxes/composite.py",
    "sandboxes/filesystem.py",
    "sandboxes/semantics.py",
    "sandboxes/_parse.py",
    "sandboxes/_pool.py",
    "sandboxes/state.py",
    "sandboxes/_beneath.py",
    "sandboxes/cli",
    "sandboxes/integrations",
    "sandboxes/kubernetes/_pods.py",
    "sandboxes/ssh/_users.py",
    "sandboxes/local/_limits.py",
    "sandboxes/local/_jail.py",
]
TIMING = re.compile(r"~\s?\d|\b\d+(?:[.,]\d+)?\s?(?:ms|µs|us|ns)\b")
"""A measured duration: ``~2.5 ms``, ``40 µs``, ``~70``."""


def _modules() -> list[Path]:
    found: list[Path] = []
    for name in REVIEWED:
        path = ROOT / name
        found += sorted(path.rglob("*.py")) if path.is_dir() else [path]
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


@pytest.mark.parametrize("module", _modules(), ids=lambda path: str(path.relative_to(ROOT)))
def test_docstrings_carry_no_timing_figure(module: Path) -> None:
    tree = ast.parse(module.read_text(), str(module))
    figures = [f"line {line}: {match.group()!r}" for line, text in _docstrings(tree) for match in TIMING.finditer(text)]
    where = module.relative_to(ROOT)
    assert not figures, f"{where} states timings in docstrings (move them to benchmarks/README.md): {figures}"


def test_the_pattern_finds_a_figure() -> None:
    assert TIMING.search("listing it cost ~2.5 ms")
    assert TIMING.search("about 40 µs a call")
    assert not TIMING.search("a budget of 0.1 s and 8 MiB, 15 s to acknowledge")
