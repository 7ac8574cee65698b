"""The exec helper runs on whatever python3 a sandbox has, as old as 3.6 (`sandboxes._helper`).
No Python 3.6 interpreter can be installed on this machine (PyPI has none, and Debian's oldest
reachable suite ships 3.9), so the shipped modules are checked by ``vermin``, which knows in which
version each syntax feature and standard-library name appeared. The few newer names it uses are
behind a guard (``posix_spawn``: 3.8, else Popen, which `test_mux`'s ``popen`` variant runs;
``pidfd_open``: 3.9, else kill(2)), each marked ``# novermin`` where it is used. vermin ignores
annotations, so those that Python evaluates are checked apart: only names, ``None`` or quoted types."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from sandboxes import _helper
from sandboxes._mux._shipped import HELPER_SOURCES, SERVER_SOURCE

EVERY_LINE = "\n".join([SERVER_SOURCE, *HELPER_SOURCES.values()])
"""Every module of the helper, its importer (`_boot`) and the file ops it imports lazily included."""


def _vermin(source: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "helper.py"
    script.write_text(source, encoding="utf-8")
    argv = [
        sys.executable,
        "-c",
        "import sys, vermin; sys.exit(vermin.main())",
        "-t=3.6-",
        "--violations",
        "--no-tips",
        str(script),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def test_the_shipped_helper_needs_nothing_newer_than_python_3_6(tmp_path: Path) -> None:
    result = _vermin(EVERY_LINE, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Target versions not met" not in result.stdout


def test_every_file_of_the_helper_is_shipped_so_checked() -> None:
    """A module of the helper left out of `sandboxes._mux._shipped` would escape the checks here,
    and fail in a sandbox only when it is first imported."""
    here = Path(_helper.__file__).parent
    files = sorted(here.glob("*.py"))
    assert {path.stem for path in files} >= {"__init__", "_boot", "_server", "_command", "_spawn", "_reap", "_files"}
    for path in files:
        assert HELPER_SOURCES[path.stem] == path.read_text(encoding="utf-8"), f"{path.name} is not shipped"
    assert sorted(HELPER_SOURCES) == sorted(path.stem for path in files)


def test_a_newer_name_in_the_helper_is_caught(tmp_path: Path) -> None:
    """The check above can fail: one unguarded 3.7 name (``time.monotonic_ns``) is reported."""
    for name in ("_server", "_files"):  # a module imported at the start, one imported later
        shipped = HELPER_SOURCES[name]
        result = _vermin(EVERY_LINE.replace(shipped, shipped + "\nstarted = time.monotonic_ns()\n"), tmp_path)
        assert result.returncode != 0
        assert "time.monotonic_ns" in result.stdout


def _unevaluable_annotations(source: str) -> list[str]:
    """Annotations Python 3.6-3.8 would fail to evaluate where they are evaluated (a function's
    at its ``def``, a module's or class's variable's at its assignment; a local variable's
    never is): anything but a quoted one, a plain name or a dotted name. vermin does not look at
    annotations (``dict[str, int]`` passes it as 3.0), and a helper that dies at a ``def`` dies
    at start-up."""
    tree = ast.parse(source)
    scopes = [tree, *(node for node in ast.walk(tree) if isinstance(node, ast.ClassDef))]
    evaluated = [node for scope in scopes for node in scope.body if isinstance(node, ast.AnnAssign)]
    found = []
    for node in [*ast.walk(tree), *evaluated]:
        annotations = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
            annotations = [argument.annotation for argument in every if argument is not None]
            annotations.append(node.returns)
        elif isinstance(node, ast.AnnAssign) and node in evaluated:
            annotations = [node.annotation]
        for annotation in annotations:
            if annotation is None or isinstance(annotation, ast.Name | ast.Attribute):
                continue
            if isinstance(annotation, ast.Constant) and (annotation.value is None or isinstance(annotation.value, str)):
                continue
            found.append(f"line {annotation.lineno}: {ast.unparse(annotation)}")
    return found


def test_the_helper_annotates_only_with_names_or_quoted_types() -> None:
    assert _unevaluable_annotations(EVERY_LINE) == []


def test_an_unquoted_generic_annotation_is_caught() -> None:
    """The check above can fail: ``list[int]`` raises TypeError at the ``def`` before 3.9, and
    at a module-level assignment; not in a function's body, which is never evaluated."""
    assert _unevaluable_annotations(HELPER_SOURCES["_server"] + "\ndef f(x: list[int]) -> None:\n    pass\n") != []
    assert _unevaluable_annotations(HELPER_SOURCES["_server"] + "\nseen: set[int] = set()\n") != []
    assert _unevaluable_annotations(HELPER_SOURCES["_server"] + "\ndef g():\n    seen: set[int] = set()\n") == []
