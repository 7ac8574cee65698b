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


def test_the_main_suite_runs_on_xdist_workers_and_the_long_silent_one_apart() -> None:
    """The main pass spreads over pytest-xdist workers, one scope (module or class) per worker
    so that its fixtures start once; the long_silent pass, mostly waiting, stays one process."""
    script = (ROOT / ".ci" / "run").read_text()
    main, silent = [], []
    for line in _pytest_lines(script):
        (silent if "-m long_silent" in line else main).append(line)
    assert (len(main), len(silent)) == (1, 1), _pytest_lines(script)
    assert re.search(r"(^|\s)-n \S+", main[0]), main[0]
    assert "--dist loadscope" in main[0], main[0]
    assert '-m "not long_silent"' in main[0], main[0]
    assert " -n " not in silent[0], silent[0]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^\s*"pytest-xdist>=', pyproject, re.MULTILINE), "pytest-xdist is not in the dev extras"
