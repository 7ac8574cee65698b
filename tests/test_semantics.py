"""`sandboxes.semantics.read_window`: every read is paginated, whatever the file holds, in time
linear in the file and memory of the window."""

from __future__ import annotations

from sandboxes import protocol as p
from sandboxes.semantics import EDIT_MAX_BYTES, Replacement, read_window, replace_text


def test_a_file_of_only_newlines_is_paginated() -> None:
    result = read_window("/f", b"\n" * 100_000, 0, 10)
    assert result.file_data is not None
    assert result.file_data.content == "\n" * 10
    assert (result.total_lines, result.start_line, result.end_line, result.next_offset) == (100_000, 1, 10, 10)


def test_whitespace_past_its_end_is_out_of_range_and_empty_is_empty() -> None:
    assert read_window("/f", b" \n \n", 5, 10).error == p.OFFSET_OUT_OF_RANGE
    empty = read_window("/f", b"", 0, 10)
    assert empty.file_data is not None
    assert empty.file_data.content == ""


def test_lines_end_where_splitlines_ends_them() -> None:
    text = "a\r\nb\rc\x85d\u2028e\nf"
    for offset in range(7):
        for limit in range(1, 7):
            lines = text.splitlines(keepends=True)
            result = read_window("/f", text.encode(), offset, limit)
            if offset >= len(lines):
                assert result.error == p.OFFSET_OUT_OF_RANGE
                continue
            expected = "".join(lines[offset : offset + limit]).replace("\r\n", "\n").replace("\r", "\n")
            assert result.file_data is not None
            assert result.file_data.content == expected
            assert result.total_lines == len(lines)


def test_a_prefix_answers_windows_within_its_complete_lines_only() -> None:
    prefix = b"one\ntwo\nthr"
    inside = read_window("/f", prefix, 0, 2, whole=False)
    assert inside.file_data is not None
    assert inside.file_data.content == "one\ntwo\n"
    assert (inside.total_lines, inside.next_offset) == (None, 2)
    beyond = read_window("/f", prefix, 1, 2, whole=False)
    assert beyond.error == p.FILE_TOO_LARGE
    assert beyond.message is not None
    assert "sed -n" in beyond.message
    assert read_window("/f", b"a\n\x00", 0, 1, whole=False).error == p.FILE_TOO_LARGE  # binary
    cut = "é\n".encode() * 3
    halved = read_window("/f", cut[:-2], 0, 2, whole=False)  # ends in half a character
    assert halved.file_data is not None
    assert halved.file_data.content == "é\né\n"


def test_an_edit_may_make_a_file_of_the_bound_and_no_more() -> None:
    """The result's size is known before it is made (occurrences times the growth): exactly
    `EDIT_MAX_BYTES` characters is an edit, one more is ``file_too_large``."""
    wide = "c" * (EDIT_MAX_BYTES // 1024)
    exact = replace_text("/f", "a" * 1024, "a", wide, replace_all=True)
    assert isinstance(exact, Replacement)
    assert len(exact.content) == EDIT_MAX_BYTES
    over = replace_text("/f", "a" * 1024 + "b", "a", wide, replace_all=True)
    assert not isinstance(over, Replacement)
    assert over[0] == p.FILE_TOO_LARGE
    assert "larger than" in over[1]
