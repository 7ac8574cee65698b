"""Removing a sandbox's directory tree, whatever its commands did to it."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["remove_tree"]


def remove_tree(path: Path) -> None:
    """``rm -rf`` that also gets through directories a sandbox made unreadable (chmod 000).
    Missing is fine."""

    def unlock(function: Callable[..., Any], name: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(name), stat.S_IRWXU)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, stat.S_IRWXU)
        with contextlib.suppress(FileNotFoundError):
            if function in (os.rmdir, os.unlink):
                function(name)
            else:  # could not open or list it: retry the whole subtree now that it is ours again
                shutil.rmtree(name, ignore_errors=True)

    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        try:
            shutil.rmtree(path, onerror=unlock)
        except RecursionError:  # Python < 3.13 recurses per level: a sandbox may nest deeper
            _remove_deep(path)


def _remove_deep(path: Path) -> None:
    """The same with coreutils, which walk trees of any depth (fts) and never follow a link
    inside: first make every directory ours to list and empty, then remove."""
    subprocess.run(["chmod", "-R", "u+rwx", "--", str(path)], check=False, capture_output=True)
    done = subprocess.run(["rm", "-rf", "--", str(path)], check=False, capture_output=True)
    if done.returncode != 0 and path.exists():
        raise OSError(f"could not remove {path}: {done.stderr.decode(errors='replace')[:500]}")
