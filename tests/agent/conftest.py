"""Fixtures of the agent tests: a local provider in a temporary directory."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from agent import LocalProvider


@pytest.fixture
def local_provider(tmp_path: Path) -> LocalProvider:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NotIsolatedWarning where bwrap is missing
        return LocalProvider(tmp_path / "sandboxes")
