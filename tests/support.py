"""What test modules share besides fixtures, importable by a name of its own: ``conftest`` is not
one (pytest imports every directory's conftest.py under that same name, so ``from conftest
import ...`` finds whichever was loaded last)."""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

__all__ = [
    "FORKING_TREES",
    "HAS_BWRAP",
    "IN_CI",
    "RETAKE_PIDS",
    "SESSION_OWNER",
    "assert_one_kill_ends_forking_trees",
    "needs",
]

IN_CI = os.environ.get("CI") == "true"
"""Set by .ci/run, where every dependency is installed: a missing one fails, never skips."""
HAS_BWRAP = shutil.which("bwrap") is not None
SESSION_OWNER = f"pytest-{uuid.uuid4().hex[:8]}"
"""Owner label of every sandbox this session creates; the session sweeps exactly these."""


def needs(ready: bool, reason: str) -> None:
    """A precondition of a test: skipped on a developer's machine that lacks it, a failure in CI,
    where every test must run (a silent skip there would hide a missing install step).

    As a mark, for a test, a class or a module (``pytestmark``), checked when each test sets up
    (tests/conftest.py): ``@pytest.mark.needs(HAS_BWRAP, "bubblewrap is not installed")``.
    Never `pytest.skip`, ``skipif`` or ``importorskip`` for a dependency: they skip in CI too."""
    if not ready:
        if IN_CI:
            pytest.fail(f"CI must run this test: {reason}")
        pytest.skip(reason, allow_module_level=True)  # from a test, a fixture or a module's import


FORKING_TREES = (
    'f=\'i=0; while [ $i -lt 4000 ]; do sleep 60 & i=$((i + 1)); done; wait\'; sh -c "$f" & setsid sh -c "$f" & wait'
)
"""Two trees that keep forking for seconds, one of them out of the session (``setsid``);
bounded, so that a failed kill cannot take a shared machine's pids for long."""


RETAKE_PIDS = """
import os, time
end = time.monotonic() + 300
while time.monotonic() < end:
    try:
        child = os.fork()
    except OSError:
        time.sleep(0.002)
        continue
    if child == 0:
        time.sleep(max(0.0, end - time.monotonic()))
        os._exit(0)
"""
"""Python that takes every pid its sandbox may have for 5 minutes and keeps them: it forks again
whenever a fork fails, so a pid that frees up is taken back within milliseconds."""


def _count(sandbox: Any, script: str) -> int | None:
    """The number ``script`` prints; ``None`` when the sandbox could not even fork to count
    (the trees took every pid it may have: they forked plenty)."""
    output = sandbox.execute(script).output.strip()
    return int(output) if output.isdigit() else None


def assert_one_kill_ends_forking_trees(sandbox: Any, kill: Callable[[str], object]) -> None:
    """Start `FORKING_TREES` in ``sandbox`` under a marker of the caller's (as the service does),
    wait until they have forked, ``kill(marker)`` once: no process may carry the marker after."""
    from sandboxes._kill import MARKER_ENV

    token = uuid.uuid4().hex
    count = f"grep -lsxzF -e '{MARKER_ENV}={token}' /proc/[0-9]*/environ | wc -l"
    runner = threading.Thread(
        target=sandbox.execute, args=(FORKING_TREES,), kwargs={"env": {MARKER_ENV: token}, "timeout": 120}
    )
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while (marked := _count(sandbox, count)) is not None and marked < 50:
            assert time.monotonic() < deadline, "the trees did not start forking"
            time.sleep(0.05)
        kill(token)
        assert (left := _count(sandbox, count)) == 0, f"{left} marked processes left (None: could not count)"
    finally:
        kill(token)
        runner.join(60)
    assert not runner.is_alive(), "the command outlived the kill of its tree"
