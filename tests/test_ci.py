"""CI never skips for a missing dependency: `support.needs` fails a test in CI, and ``.ci/run``
(what CI runs) tells it that it is in CI. Without the second, every missing install step in CI
was a silent skip again."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_NEEDY = """
from support import needs

def test_needs_what_is_missing():
    needs(False, "a dependency this machine lacks")
"""


def _run_needy(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_needy.py").write_text(_NEEDY)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(ROOT / "tests")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "test_needy.py"]
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("ci", "outcome"), [(None, "1 skipped"), ("true", "1 failed")], ids=["developer", "ci"])
def test_a_missing_precondition_skips_only_outside_ci(tmp_path: Path, ci: str | None, outcome: str) -> None:
    done = _run_needy(tmp_path, ci)
    assert outcome in done.stdout, done.stdout + done.stderr


def test_the_ci_entry_point_says_it_is_ci_before_running_the_tests() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    before_pytest = script[: script.index(".venv/bin/pytest")]
    assert re.search(r"^export CI=true$", before_pytest, re.MULTILINE), ".ci/run runs pytest without CI=true"


def _pytest_lines(script: str) -> list[str]:
    """Each pytest command of ``script``, its continuation lines joined."""
    joined = script.replace("\\\n", " ").replace("|\n", "| ")
    return [line.strip() for line in joined.splitlines() if line.lstrip().startswith(".venv/bin/pytest")]


def test_the_main_suite_runs_on_xdist_workers_and_the_long_silent_and_alone_ones_apart() -> None:
    """The main pass spreads over pytest-xdist workers, one scope (module or class) per worker
    so that its fixtures start once; the long_silent pass, mostly waiting, and the alone pass,
    which measures the machine's CPU, each stay one process."""
    script = (ROOT / ".ci" / "run").read_text()
    passes: dict[str, list[str]] = {"main": [], "long_silent": [], "alone": []}
    for line in _pytest_lines(script):
        name = "long_silent" if "-m long_silent" in line else "alone" if '-m "alone' in line else "main"
        passes[name].append(line)
    assert {name: len(lines) for name, lines in passes.items()} == {"main": 1, "long_silent": 1, "alone": 1}, passes
    [main], [silent], [alone] = passes["main"], passes["long_silent"], passes["alone"]
    assert re.search(r"(^|\s)-n \S+", main), main
    assert "--dist loadscope" in main, main
    assert '-m "not long_silent and not alone"' in main, main
    assert '-m "alone and not long_silent"' in alone, alone
    for one_process in (silent, alone):
        assert " -n " not in one_process, one_process
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^\s*"pytest-xdist>=', pyproject, re.MULTILINE), "pytest-xdist is not in the dev extras"
    assert re.search(r'^\s*"alone: ', pyproject, re.MULTILINE), "the alone marker is not registered"
