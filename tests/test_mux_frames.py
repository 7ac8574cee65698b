"""The exec helper's frame kinds are spelled once (`sandboxes._helper.frames`), and both the helper
and its client (`sandboxes._mux`) use them by name."""

from __future__ import annotations

import ast
from pathlib import Path

from sandboxes import _helper, _mux
from sandboxes._helper import frames
from sandboxes._mux import _frames

_SENDERS = {"send", "_send", "pack"}
"""Calls whose first argument is a frame's kind: the helper's `send`, the client's ``_send`` and
``HEADER.pack``."""


def _literal_kinds(path: Path) -> list[str]:
    """Where ``path`` spells a frame kind as a bytes literal: the first argument of a send, or
    what a ``kind`` is compared with."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        literals: list[ast.expr] = []
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in _SENDERS:
                literals = [node.args[0]]
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "kind":
            literals = list(node.comparators)
        found += [
            f"{path.name}:{literal.lineno}: {literal.value!r}"
            for literal in literals
            if isinstance(literal, ast.Constant) and isinstance(literal.value, bytes)
        ]
    return found


def test_no_side_spells_a_frame_kind_as_a_literal() -> None:
    here = [Path(_helper.__file__).parent, Path(_mux.__file__).parent]
    paths = [path for folder in here for path in sorted(folder.glob("*.py")) if path.name != "frames.py"]
    assert len(paths) > 10
    assert [found for path in paths for found in _literal_kinds(path)] == []


def test_a_literal_kind_is_caught(tmp_path: Path) -> None:
    """The check above can fail: a send and a comparison spelled with literals are found."""
    module = tmp_path / "module.py"
    module.write_text('send(b"O", 1, b"x")\nif kind == b"K":\n    pass\nsend(OUTPUT, 1)\n', encoding="utf-8")
    assert _literal_kinds(module) == ["module.py:1: b'O'", "module.py:2: b'K'"]


def test_the_kinds_are_one_byte_each_and_both_sides_agree() -> None:
    client, helper = frames.CLIENT_KINDS, frames.HELPER_KINDS
    assert len(set(client)) == len(client) == 9  # RESIZE, a terminal's (`_pty`); GRANT, a relay's
    assert len(set(helper)) == len(helper) == 8
    assert set(client) & set(helper) == set(frames.GRANT)  # a relay's grants go both ways
    assert frozenset(helper) == _frames._KINDS
    assert _frames.HEADER is frames.HEADER
