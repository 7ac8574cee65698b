"""`sandboxes._parse`: what the file-op scripts (and the exec helper's native ops, which answer
the same) print, turned into results; every byte of it is the sandbox's, so malformed answers
must fail clearly, never parse into something else."""

from __future__ import annotations

import base64
import os

import pytest

from sandboxes import _parse
from sandboxes import protocol as p


def _file(data: bytes, status: str = "0") -> str:
    return base64.encodebytes(data).decode() + f"!{status}\n"


def test_downloads_answer_each_file_in_order() -> None:
    big, small = os.urandom(1 << 20), b"hi\n"
    output = _file(big) + "!10\n" + _file(small) + "!17\n" + _file(b"")
    assert _parse.downloads(output, 5) == [(0, big), (10, None), (0, small), (17, None), (0, b"")]


def test_the_last_status_may_end_without_a_newline() -> None:
    assert _parse.downloads(_file(b"abc").rstrip("\n"), 1) == [(0, b"abc")]


@pytest.mark.parametrize(
    ("output", "count"),
    [
        ("", 1),  # nothing at all
        ("YWJj\n", 1),  # content, no status
        (_file(b"abc") + "!0\n", 1),  # one status too many
        ("YWJj\n!0\n", 2),  # one short
    ],
)
def test_a_wrong_number_of_answers_fails(output: str, count: int) -> None:
    with pytest.raises(_parse.ScriptFailed) as failed:
        _parse.downloads(output, count)
    assert failed.value.code == p.BACKEND_ERROR


def test_a_bang_inside_a_line_does_not_end_a_file() -> None:
    """Only a ``!`` starting a line is a status: a forged ``!0`` after content on the same line
    is content (which the decoder then refuses), not the end of one file and the start of the
    next."""
    forged = "YWJj!0\nZGVm\n!0\n"
    with pytest.raises(_parse.ScriptFailed, match="corrupt file transfer"):
        _parse.downloads(forged, 1)
    with pytest.raises(_parse.ScriptFailed):  # not two files either
        _parse.downloads(forged, 2)


def test_a_status_that_is_not_a_number_is_an_unknown_failure() -> None:
    assert _parse.downloads("YWJj\n!x\n!\n", 2) == [(-1, None), (-1, None)]
