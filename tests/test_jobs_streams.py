"""Which stream each byte of a recorded command came from (`sandboxes._helper._record`'s runs)
and how `sandboxes.jobs` reads them back: a record names at most `MAX_RUNS` runs, then the
rest is ``merged``; runs the sandbox forged (out of order, unknown tags, too many) are dropped."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from sandboxes._helper import _record
from sandboxes._job_output import MAX_RUNS
from sandboxes.jobs import _parse_poll


def _answer(chunks: list[tuple[int, bytes]], runs: list[str]) -> str:
    """What the RECORD script prints for ``chunks`` and the runs file's lines."""
    lines = ["!j exited 0 2 1 100 10"]
    for at, data in chunks:
        lines += [f"!s {at}", base64.b64encode(data).decode()]
    lines += [f"!r {run}" for run in runs]
    return "\n".join([*lines, "!e", ""])


def test_a_record_names_each_runs_stream_until_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert _record.MAX_RUNS == MAX_RUNS  # what the helper writes, the host reads
    record = _record.Record("ab" * 16, 1 << 20, "marker")
    record.write(b"out1\n")
    record.write(b"err1\n", True)
    record.write(b"err2\n", True)
    record.write(b"out2\n")
    record.end(0, False)
    directory = tmp_path / ".sandboxes-streams" / ("ab" * 16)
    runs = (directory / "runs").read_text().splitlines()
    assert runs == ["0 o", "5 e", "15 o"]
    job = _parse_poll("x", _answer([(0, (directory / "o.h").read_bytes())], runs))
    assert job.pieces() == [(0, b"out1\n", "stdout"), (5, b"err1\nerr2\n", "stderr"), (15, b"out2\n", "stdout")]

    many = _record.Record("cd" * 16, 1 << 20, "marker")
    for i in range(MAX_RUNS + 10):
        many.write(b"x", bool(i % 2))
    many.end(0, False)
    lines = (tmp_path / ".sandboxes-streams" / ("cd" * 16) / "runs").read_text().splitlines()
    assert len(lines) == MAX_RUNS
    assert lines[-1] == f"{MAX_RUNS - 1} m"
    assert os.path.getsize(tmp_path / ".sandboxes-streams" / ("cd" * 16) / "o.h") == MAX_RUNS + 10


def test_forged_runs_are_dropped() -> None:
    forged = ["0 o", "zz e", "3 q", "2 e", "2 o", "1 e e", "-1 o", "6 e"]
    job = _parse_poll("x", _answer([(0, b"abcdefgh")], forged))
    assert job.runs == ((0, "stdout"), (2, "stderr"), (6, "stderr"))
    assert job.pieces() == [(0, b"ab", "stdout"), (2, b"cdef", "stderr"), (6, b"gh", "stderr")]
    endless = _parse_poll("x", _answer([(0, b"ab")], [f"{i} {'oe'[i % 2]}" for i in range(3 * MAX_RUNS)]))
    assert len(endless.runs) == MAX_RUNS  # the most a record writes, and not one more kept
    unnamed = _parse_poll("x", _answer([(5, b"ab")], []))
    assert unnamed.pieces() == [(5, b"ab", "merged")]
