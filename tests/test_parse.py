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
    """Only a ``!`` starting a line is a status: one after content on the same line is content,
    which the decoder drops (as it drops any character outside base64), not the end of one
    file and the start of the next."""
    forged = "YWJj!ZGVm\n!0\n"
    assert _parse.downloads(forged, 1) == [(0, b"abcdef")]
    with pytest.raises(_parse.ScriptFailed, match="answered 1 of 2"):
        _parse.downloads(forged, 2)


def test_a_status_that_is_not_a_number_is_an_unknown_failure() -> None:
    assert _parse.downloads("YWJj\n!x\n!\n", 2) == [(-1, None), (-1, None)]


HOSTILE_NUMBERS = ["²", "٣", "9" * 5000, "-", "--5", "9" * 20]
"""Numbers no script prints: a superscript (``str.isdigit`` says yes, ``int`` says no), an
Arabic-Indic digit, more digits than ``int`` takes (4,300) or than any status, size or time
has, signs where none belong."""


def test_a_read_is_the_helpers_raw_bytes_or_the_scripts_base64() -> None:
    every = bytes(range(256)) * 3
    assert _parse.file_bytes("\0" + every.decode("latin-1")) == every
    assert _parse.file_bytes("\0") == b""
    assert _parse.file_bytes(base64.encodebytes(every).decode()) == every
    assert _parse.file_bytes("") == b""
    with pytest.raises(_parse.ScriptFailed) as failed:
        _parse.file_bytes("\0ab\u0100")  # a character that is no byte
    assert failed.value.code == p.BACKEND_ERROR


def _raw(*files: tuple[int, bytes]) -> str:
    """A helper's native download answer (`sandboxes._helper._reads.download_parts`), as the
    client keeps it: one character per byte."""
    return "\0" + "".join(f"{status} {len(data)}\n" + data.decode("latin-1") for status, data in files)


def test_a_raw_download_answers_each_file_exactly() -> None:
    every = bytes(range(256)) * 3
    lookalikes = b"0 3\n\0!0\n\xff\n7 0\n"  # what a header, a status or the marker look like
    output = _raw((0, every), (10, b""), (0, lookalikes), (17, b""), (0, b""))
    assert _parse.downloads(output, 5) == [(0, every), (10, None), (0, lookalikes), (17, None), (0, b"")]


@pytest.mark.parametrize(
    "output",
    [
        "\0",  # no file at all
        "\0" + "0 4\nabc",  # a length past the end
        "\0" + "0 3\nabcd",  # bytes left over
        "\0" + "0 3\nabc0 0\n",  # one file too many
        "\0" + "0 3 1\nabc",  # a header of three fields
        "\0" + "0\nabc",  # of one
        "\0" + "0 " + "9" * 5000 + "\n",  # a header with no end in sight
        "\0" + "0 3\nab\u0100",  # a character that is no byte
        *("\0" + f"0 {n}\nabc" for n in HOSTILE_NUMBERS),
        *("\0" + f"{n} 3\nabc" for n in HOSTILE_NUMBERS),
    ],
)
def test_a_corrupt_raw_download_fails_the_whole_batch(output: str) -> None:
    """Where the sandbox's lengths cannot be trusted, no file after the fault can be found: the
    batch fails as a corrupt transfer, never guessing where the next file starts."""
    with pytest.raises(_parse.ScriptFailed) as failed:
        _parse.downloads(output, 1)
    assert failed.value.code == p.BACKEND_ERROR


@pytest.mark.parametrize("number", HOSTILE_NUMBERS)
def test_a_hostile_download_status_is_an_unknown_failure(number: str) -> None:
    assert _parse.downloads(f"YWJj\n!{number}\n", 1) == [(-1, None)]


@pytest.mark.parametrize("number", HOSTILE_NUMBERS)
def test_a_hostile_upload_status_is_not_counted(number: str) -> None:
    with pytest.raises(_parse.ScriptFailed, match="answered 1 of 2"):
        _parse.upload_statuses(f"0\n{number}\n", 2)


HOSTILE_STATS = [*(f"{n} 1700000000" for n in HOSTILE_NUMBERS), *(f"5 {n}" for n in HOSTILE_NUMBERS)]


@pytest.mark.parametrize("stats", [*HOSTILE_STATS, "5 99999999999999999"])
def test_a_hostile_size_or_time_in_a_listing_leaves_both_unknown(stats: str) -> None:
    """The last: a time past the calendar's end (year 3 billion)."""
    (entry,) = _parse.ls_entries(f"fname\x00{stats}\n", "/d")
    assert (entry.path, entry.size, entry.modified_at) == ("/d/name", None, None)


def test_a_listing_keeps_a_time_before_1970() -> None:
    (entry,) = _parse.ls_entries("fname\x0042 -86400\n", "/d")
    assert (entry.size, entry.modified_at) == (42, "1969-12-31T00:00:00+00:00")


@pytest.mark.parametrize("number", HOSTILE_NUMBERS)
def test_a_grep_line_with_a_hostile_line_number_is_no_match(number: str) -> None:
    assert _parse.grep_matches(f"=Z\n/d/f\x00{number}:text\n/d/f\x007:ok\n") == [p.GrepMatch("/d/f", 7, "ok")]
    anchored = f"/d/f\x00\n/d/f:{number}:text\n/d/f:7:ok\n"
    assert _parse.grep_matches(anchored) == [p.GrepMatch("/d/f", 7, "ok")]


def test_every_int64_is_a_number() -> None:
    """A job's times are nanoseconds since the epoch: 19 digits, which must still be read."""
    assert _parse.natural("9223372036854775807") == 2**63 - 1
    assert _parse.natural("0") == 0


def test_a_binary_line_busybox_prints_is_dropped_and_the_other_matches_kept() -> None:
    """busybox ``grep`` prints a binary file's matching lines, NULs and all (GNU ``grep`` skips
    the file): the names still end at the first NUL-newline, not the last NUL."""
    output = "/d/a\x00/d/b.txt\x00\n/d/a:1:text\n/d/a:2:\x00\n/d/b.txt:1:a\n/d/a:3:x\x00y\n"
    assert _parse.grep_matches(output) == [p.GrepMatch("/d/b.txt", 1, "a")]  # all of /d/a dropped


def test_names_with_newlines_and_no_candidates() -> None:
    output = "/d/x\n:1:\x00/d/y\x00\n/d/x\n:1::2:hit\n/d/y:3:\n"
    assert _parse.grep_matches(output) == [p.GrepMatch("/d/x\n:1:", 2, "hit"), p.GrepMatch("/d/y", 3, "")]
    assert _parse.grep_matches("\n") == []
    assert _parse.grep_matches("") == []


def test_a_cut_in_the_names_is_not_taken_for_their_end() -> None:
    """`OutputBuffer.text` keeps a long output's two ends around a marker line: a cut right
    after a name's NUL must not end the names there (what follows the newline is the marker)."""
    names = "".join(f"/d/f{i}\x00" for i in range(100))
    cut = names[:361] + "\n... [999 bytes of output truncated] ...\n" + names[-200:]
    output = cut + "\n" + "".join(f"/d/f{i}:1:hit\n" for i in range(95, 100))
    assert [m.path for m in _parse.grep_matches(output)] == [f"/d/f{i}" for i in range(95, 100)]
