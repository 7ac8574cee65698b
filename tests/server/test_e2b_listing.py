"""envd's ``ListDir`` script (`sandboxes.server.e2b.filesystem.LIST`) answers the same entries
whichever ``find`` the sandbox has: GNU's, which prints each entry itself in one process, and
one without ``-printf`` (busybox's), whose entries are stat-ed; run here in a plain shell."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from sandboxes import _scripts
from sandboxes.server.e2b.filesystem import LIST, _listing

NO_PRINTF = (
    'find() { case " $* " in *" -printf "*) echo "find: unrecognized: -printf" >&2; return 1;; esac; '
    'command find "$@"; }\n'
)
"""A ``find`` that refuses ``-printf``, as busybox's does."""


def _listed(root: Path, depth: int, prefix: str = "") -> list[dict[str, object]]:
    script = _scripts.command(LIST, str(root), str(depth))
    done = subprocess.run(["sh", "-c", prefix + script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("=") != bool(prefix), done.stdout[:80]  # which find printed it
    return sorted(_listing(str(root), done.stdout), key=lambda entry: str(entry["path"]))


def test_both_finds_list_the_same_entries(tmp_path: Path) -> None:
    root = tmp_path / "listed"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "sub" / "file.txt").write_text("12345")
    (root / "a b\n'$(x)").write_text("")
    (root / "link").symlink_to("sub/file.txt")
    os.mkfifo(root / "fifo")
    (root / "script.sh").write_text("#!/bin/sh\n")
    (root / "script.sh").chmod(0o750)
    printed = _listed(root, 2)
    assert printed == _listed(root, 2, NO_PRINTF)
    kinds = {Path(str(entry["path"])).name: (entry["type"], entry["permissions"]) for entry in printed}
    assert kinds == {
        "sub": ("FILE_TYPE_DIRECTORY", "drwxr-xr-x"),
        "deeper": ("FILE_TYPE_DIRECTORY", "drwxr-xr-x"),
        "file.txt": ("FILE_TYPE_FILE", "-rw-r--r--"),
        "a b\n'$(x)": ("FILE_TYPE_FILE", "-rw-r--r--"),
        "link": ("FILE_TYPE_SYMLINK", "lrwxrwxrwx"),
        "fifo": ("FILE_TYPE_UNSPECIFIED", "prw-r--r--"),
        "script.sh": ("FILE_TYPE_FILE", "-rwxr-x---"),
    }
    assert [entry["size"] for entry in printed if entry["name"] == "file.txt"] == ["5"]
    assert [Path(str(entry["path"])).name for entry in _listed(root, 1)] == sorted(
        ["a b\n'$(x)", "fifo", "link", "script.sh", "sub"], key=lambda name: str(root / name)
    )
