"""Parsing of what the scripts in `sandboxes._scripts` print, and of their exit statuses."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from sandboxes import _scripts as s
from sandboxes import protocol as p
from sandboxes.paths import join
from sandboxes.semantics import GREP_MAX_MATCHES, iso_from_epoch, message_for

_STATUS_CODES: dict[int, p.ErrorCode] = {
    s.EXIT_NOT_FOUND: p.FILE_NOT_FOUND,
    s.EXIT_IS_DIRECTORY: p.IS_DIRECTORY,
    s.EXIT_PERMISSION: p.PERMISSION_DENIED,
    s.EXIT_NOT_A_DIRECTORY: p.NOT_A_DIRECTORY,
    s.EXIT_CHANGED: p.FILE_CHANGED,
    s.EXIT_NO_SPACE: p.NO_SPACE,
    s.EXIT_NOT_REGULAR: p.INVALID_ARGUMENT,
    s.EXIT_TOO_LARGE: p.FILE_TOO_LARGE,
    s.EXIT_SHORT: p.CONNECTION_LOST,
}


class ScriptFailed(Exception):
    """A script ended in a way that is not a file-level answer (timeout, lost sandbox, a shell
    without the tools it needs). Carries the protocol code and a message for the result."""

    def __init__(self, code: p.ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def code_for_status(status: int) -> p.ErrorCode | None:
    return _STATUS_CODES.get(status)


def check(response: p.ExecuteResponse, path: str) -> p.ErrorCode | None:
    """The file-level error a script reported, ``None`` on success; raise `ScriptFailed` for
    anything that is not an answer about the file."""
    if response.error is not None:
        raise ScriptFailed(response.error, response.message or message_for(response.error, path))
    if response.exit_code == 0:
        return None
    if response.exit_code is not None and (code := code_for_status(response.exit_code)) is not None:
        return code
    detail = response.output.strip()[-500:] or "no output"
    raise ScriptFailed(
        p.BACKEND_ERROR,
        f"sandbox shell failed on '{path}' (exit {response.exit_code}): {detail}",
    )


_RAW = "\0"
"""How a helper's native read or download answer starts (`sandboxes._helper._reads.RAW`, its
bytes then kept one character each: `sandboxes._output.OutputBuffer.text`); the script's,
base64, never does."""


def file_bytes(output: str) -> bytes:
    """A read's bytes (`_scripts.READ_FILE`): a helper's raw answer, or the script's base64."""
    if not output.startswith(_RAW):
        return decode_base64(output)
    return _raw_bytes(output[len(_RAW) :])


def _raw_bytes(text: str) -> bytes:
    """The bytes a raw answer's text holds, one per character; a character that is no byte is
    a corrupt transfer."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        raise ScriptFailed(p.BACKEND_ERROR, "corrupt file transfer from sandbox: not bytes") from None


def decode_base64(text: str) -> bytes:
    try:
        return base64.b64decode(text)
    except binascii.Error as exc:
        raise ScriptFailed(p.BACKEND_ERROR, f"corrupt file transfer from sandbox: {exc}") from exc


_MAX_DIGITS = 19
"""A number a sandbox prints (a status, a size, a time, a line number, a job's nanoseconds: all
``int64``) has at most this many digits. The output is the sandbox's, so a number is taken only
as 1-19 ASCII digits: ``int`` refuses 4,300 digits and more and ``str.isdigit`` accepts digits
``int`` refuses (``²``), either of which would escape as a ValueError, not a protocol error."""


def natural(text: str) -> int | None:
    """``text`` as a number when it is 1-19 ASCII digits (see `_MAX_DIGITS`), else None."""
    return int(text) if 0 < len(text) <= _MAX_DIGITS and text.isascii() and text.isdigit() else None


def _iso_time(text: str) -> str | None:
    """Seconds since the epoch (``-`` allowed before them) as ISO 8601; None when not such a
    number or out of the calendar's range."""
    before = text.startswith("-")
    seconds = natural(text[1:] if before else text)
    if seconds is None:
        return None
    try:
        return iso_from_epoch(-seconds if before else seconds)
    except (OverflowError, OSError, ValueError):
        return None


def ls_entries(output: str, directory: str) -> list[p.FileInfo]:
    """Entries from `_scripts.LS`: NUL-terminated ``d``/``f``-tagged names, then stat lines."""
    *records, stats_text = output.split("\x00")
    stats = stats_text.split("\n")
    if stats and stats[-1] == "":
        stats.pop()
    aligned = len(stats) == len(records)
    entries = []
    for index, record in enumerate(records):
        kind, name = record[:1], record[1:]
        size = mtime = None
        if aligned:
            fields = stats[index].split(" ")
            if len(fields) == 2 and (known := natural(fields[0])) is not None and (at := _iso_time(fields[1])):
                size, mtime = known, at
        is_dir = kind == "d"
        path = join(directory, name) + ("/" if is_dir else "")
        entries.append(p.FileInfo(path, is_dir, 0 if is_dir else size, mtime))
    entries.sort(key=lambda e: e.path)
    return entries


_RAW_HEADER = 2 * _MAX_DIGITS + 2  # ``<status> <length>\n`` at most


def downloads(output: str, count: int) -> list[tuple[int, bytes | None]]:
    """``(status, content)`` per file: a helper's raw answer (`_raw_downloads`), or
    `_scripts.DOWNLOAD`'s text (`_base64_downloads`)."""
    if output.startswith(_RAW):
        return _raw_downloads(output, count)
    return _base64_downloads(output, count)


def _raw_downloads(output: str, count: int) -> list[tuple[int, bytes | None]]:
    """From a helper's native download (`sandboxes._helper._reads.download_parts`, its bytes one
    character each: `sandboxes._output.OutputBuffer.text`): per file ``<status> <length>``, a
    newline, and that many bytes. The lengths are the sandbox's word, so a header that is not
    two numbers, a length past the end, a character that is no byte, or anything left over is
    a corrupt transfer, never a guess at where the next file starts."""
    results: list[tuple[int, bytes | None]] = []
    pos = len(_RAW)
    for _ in range(count):
        end = output.find("\n", pos, pos + _RAW_HEADER)
        fields = output[pos:end].split(" ") if end >= 0 else []
        status, length = (natural(fields[0]), natural(fields[1])) if len(fields) == 2 else (None, None)
        if status is None or length is None or end + 1 + length > len(output):
            raise ScriptFailed(p.BACKEND_ERROR, f"corrupt file transfer from sandbox: file {len(results) + 1}")
        pos = end + 1 + length
        results.append((status, _raw_bytes(output[end + 1 : pos]) if status == 0 else None))
    if pos != len(output):
        raise ScriptFailed(p.BACKEND_ERROR, f"sandbox answered more than {count} downloads")
    return results


def _base64_downloads(output: str, count: int) -> list[tuple[int, bytes | None]]:
    """``(status, content)`` per file from `_scripts.DOWNLOAD`: base64 lines, then ``!<status>``.
    A status line is found by its ``!`` (base64 never holds one; one inside a line is content,
    which the decoder drops as it drops any character outside base64), and each file's lines
    are decoded whole, newlines and all, in one call: no Python loop runs per line."""
    results: list[tuple[int, bytes | None]] = []
    start = found = 0
    while (found := output.find("!", found)) >= 0:
        if found > start and output[found - 1] != "\n":  # not at the start of a line
            found += 1
            continue
        end = output.find("\n", found)
        end = len(output) if end < 0 else end
        code = output[found + 1 : end]
        status = natural(code)
        status = -1 if status is None else status
        results.append((status, decode_base64(output[start:found]) if status == 0 else None))
        start = found = end + 1
    if len(results) != count:
        raise ScriptFailed(p.BACKEND_ERROR, f"sandbox answered {len(results)} of {count} downloads")
    return results


def upload_statuses(output: str, count: int) -> list[int]:
    statuses = [status for line in output.split("\n") if (status := natural(line.strip())) is not None]
    if len(statuses) != count:
        raise ScriptFailed(p.BACKEND_ERROR, f"sandbox answered {len(statuses)} of {count} uploads")
    return statuses


def nul_list(output: str) -> list[str]:
    return [item for item in output.split("\x00") if item]


_LINE_NUMBER = re.compile(rf"([0-9]{{1,{_MAX_DIGITS}}}):")

_MAX_NAME = 4096
"""No path the kernel takes is longer (``PATH_MAX`` bytes, so no more characters): a longer
candidate name is none, and a name is looked for no further than this past a line's start."""


class GrepParse(NamedTuple):
    """A grep's matches and whether some were left out (the output was cut, or held more than
    the caller's limit, or cost more to read than its size allows)."""

    matches: list[p.GrepMatch]
    truncated: bool


def grep_matches(output: str) -> list[p.GrepMatch]:
    """Matches from `_scripts.GREP`, in either of its two forms (see `parse_grep`)."""
    return parse_grep(output).matches


def parse_grep(output: str, limit: int = GREP_MAX_MATCHES) -> GrepParse:
    """Matches from `_scripts.GREP`, in either of its two forms, at most ``limit`` + 1 of them,
    in time linear in ``output``. ``truncated`` when the script's cap cut a part
    (`_scripts.GREP_PART_MAX`: its last, unfinished line is dropped) or parsing stopped early."""
    if output.startswith("=Z\n"):
        return _nul_named_matches(output[3:], limit)
    return _candidate_anchored_matches(output, limit)


def _was_cut(part: str) -> bool:
    """Whether the script's ``head -c`` may have cut ``part``: it holds the cap's bytes or more
    (a byte that was not UTF-8 became U+FFFD, three bytes, so this never misses a cut)."""
    return len(part) * 4 >= s.GREP_PART_MAX and len(part.encode("utf-8", "surrogatepass")) >= s.GREP_PART_MAX


def _whole_lines(part: str) -> tuple[str, bool]:
    """``part`` without the unfinished line a cut left at its end, and whether it was cut."""
    if not _was_cut(part):
        return part, False
    return part[: part.rfind("\n") + 1], True


def _nul_named_matches(output: str, limit: int) -> GrepParse:
    """``path NUL line:text`` lines (ripgrep's ``--null``): a name ends at its NUL, a text at
    its newline, and neither can hold the other's terminator."""
    output, truncated = _whole_lines(output)
    matches: list[p.GrepMatch] = []
    pos, end = 0, len(output)
    while pos < end:
        if len(matches) > limit:
            return GrepParse(matches, True)
        nul = output.find("\x00", pos)
        if nul == -1:
            break
        m = _LINE_NUMBER.match(output, nul + 1)
        newline = output.find("\n", nul + 1)
        text_end = end if newline == -1 else newline
        if m is not None:
            matches.append(p.GrepMatch(output[pos:nul], int(m.group(1)), output[m.end() : text_end]))
        pos = text_end + 1
    return GrepParse(matches, truncated)


def _split_names(output: str) -> tuple[str, str]:
    """The candidate names (NUL-terminated) and the ``grep`` lines after them: the names end at
    the first NUL followed by a newline (see `_candidate_anchored_matches`)."""
    if output.startswith("\n"):
        return "", output[1:]
    end = output.find("\x00\n")
    while end != -1 and output.startswith(".", end + 2):  # the marker of a cut output, not grep's
        end = output.find("\x00\n", end + 2)
    return (output, "") if end == -1 else (output[: end + 1], output[end + 2 :])


def _candidate_anchored_matches(output: str, limit: int) -> GrepParse:
    """Candidate names (NUL-terminated), a NUL and a newline, then ``path:line:text`` lines.

    A name may hold ``:`` or newlines, so each match is anchored on a known candidate name
    followed by ``:<digits>:`` rather than split on the first colon. The names end at the first
    NUL followed by a newline: every name starts with the search's root, a ``/``, so that newline
    cannot start a name (the marker `OutputBuffer.text` puts in a cut output starts with ``.``:
    skipped). Not at the last NUL: busybox ``grep`` prints a binary file's lines, NULs and all,
    where GNU ``grep`` skips the file. A file that printed a NUL is dropped whole here, as GNU
    drops it; one whose NULs are all on lines without a match cannot be told from text (busybox,
    unlike GNU and the helper, then reports its matches).

    Linear: the next colon is searched once for all the lines it follows, a name is looked for
    within `_MAX_NAME` of its line's start, and the lengths tried and characters hashed while
    looking are counted against a budget of four times the output's length; past it the rest
    is not read and the answer is ``truncated``.
    """
    names_text, grep_text = _split_names(output)
    names_cut = _was_cut(names_text)
    grep_text, lines_cut = _whole_lines(grep_text)
    names = _Names.of(nul_list(names_text))
    budget = 4 * len(grep_text) + _MAX_NAME
    matches: list[p.GrepMatch] = []
    binary: set[str] = set()
    pos, end, colon = 0, len(grep_text), -1
    while pos < end:
        if len(matches) > limit or budget < 0:
            return GrepParse(_without(matches, binary), True)
        if colon < pos:
            colon = grep_text.find(":", pos)
            if colon == -1:  # no line left can be a match
                break
        found, budget = _anchored(grep_text, pos, colon, names, budget)
        if found is None:  # a line that is not a match (e.g. a "binary file matches" notice)
            newline = grep_text.find("\n", pos)
            pos = end if newline == -1 else newline + 1
            continue
        path, line_number, text_start = found
        newline = grep_text.find("\n", text_start)
        text_end = end if newline == -1 else newline
        text = grep_text[text_start:text_end]
        if "\x00" in text:
            binary.add(path)
        matches.append(p.GrepMatch(path, line_number, text))
        pos = text_end + 1
    return GrepParse(_without(matches, binary), names_cut or lines_cut)


@dataclass(frozen=True, slots=True)
class _Names:
    """The candidate names; apart, those holding a colon, and for each text before a first
    colon the lengths (ascending) of such names starting with it: a line's name is its text
    before its first colon, or one of these."""

    every: frozenset[str]
    with_colons: frozenset[str]
    lengths_by_head: dict[str, tuple[int, ...]]

    @classmethod
    def of(cls, names: Iterable[str]) -> _Names:
        every = frozenset(name for name in names if len(name) <= _MAX_NAME)
        with_colons = frozenset(name for name in every if ":" in name)
        lengths: dict[str, set[int]] = {}
        for name in with_colons:
            lengths.setdefault(name.partition(":")[0], set()).add(len(name))
        return cls(every, with_colons, {head: tuple(sorted(found)) for head, found in lengths.items()})


_LENGTH_COST = 8
"""What trying one more length of name costs from the budget, in characters hashed: a turn of
the loop costs about as much as hashing this many more."""


def _anchored(text: str, pos: int, colon: int, names: _Names, budget: int) -> tuple[tuple[str, int, int] | None, int]:
    """The match starting at ``pos`` (``colon`` is the first colon after it): the shortest
    candidate name there followed by ``:<digits>:``, as ``(path, line, where its text
    starts)``; and the budget left once the lengths tried and the prefixes hashed are paid for."""
    if colon - pos > _MAX_NAME:
        return None, budget
    budget -= colon - pos
    head = text[pos:colon]
    if head in names.every and (m := _LINE_NUMBER.match(text, colon + 1)):
        return (head, int(m.group(1)), m.end()), budget
    for length in names.lengths_by_head.get(head, ()):
        budget -= _LENGTH_COST
        if budget < 0:
            break
        end = pos + length
        if text.startswith(":", end):
            budget -= length
            if text[pos:end] in names.with_colons and (m := _LINE_NUMBER.match(text, end + 1)):
                return (text[pos:end], int(m.group(1)), m.end()), budget
    return None, budget


def _without(matches: list[p.GrepMatch], binary: set[str]) -> list[p.GrepMatch]:
    return [match for match in matches if match.path not in binary] if binary else matches
