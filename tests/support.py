"""What test modules share besides fixtures, importable by a name of its own: ``conftest`` is not
one (pytest imports every directory's conftest.py under that same name, so ``from conftest
import ...`` finds whichever was loaded last)."""

from __future__ import annotations

import os
import uuid

import pytest

__all__ = ["IN_CI", "SESSION_OWNER", "needs"]

IN_CI = os.environ.get("CI") == "true"
SESSION_OWNER = f"pytest-{uuid.uuid4().hex[:8]}"
"""Owner label of every sandbox this session creates; the session sweeps exactly these."""


def needs(ready: bool, reason: str) -> None:
    """A precondition of a test: skipped on a developer's machine that lacks it, a failure in CI,
    where every test must run (a silent skip there would hide a missing install step)."""
    if not ready:
        if IN_CI:
            pytest.fail(f"CI must run this test: {reason}")
        pytest.skip(reason)
