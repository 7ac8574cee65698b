"""The exec helper runs on whatever python3 a sandbox has, as old as 3.6 (`sandboxes._mux._server`).
No Python 3.6 interpreter can be installed on this machine (PyPI has none, and Debian's oldest
reachable suite ships 3.9), so the shipped script is checked by ``vermin``, which knows in which
version each syntax feature and standard-library name appeared. The few newer names it uses are
behind a guard (``posix_spawn``: 3.8, else Popen, which `test_mux`'s ``popen`` variant runs;
``pidfd_open``: 3.9, else kill(2)), each marked ``# novermin`` where it is used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sandboxes._mux import SERVER_SOURCE


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
    result = _vermin(SERVER_SOURCE, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Minimum required versions: 3.6" in result.stdout


def test_a_newer_name_in_the_helper_is_caught(tmp_path: Path) -> None:
    """The check above can fail: one unguarded 3.7 name (``time.monotonic_ns``) is reported."""
    result = _vermin(SERVER_SOURCE + "\nstarted = time.monotonic_ns()\n", tmp_path)
    assert result.returncode != 0
    assert "time.monotonic_ns" in result.stdout
