"""Pure-Python semantics shared by every backend.

Whatever can be decided without touching storage is decided here (pagination, text vs binary,
edit matching, CRLF handling, glob and grep matching, error wording), so a local directory, a
Docker container, a VM over SSH and an in-memory dict all answer the same question the same way.
Backends only move bytes.
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePosixPath

from sandboxes import protocol as p
from sandboxes.paths import relative_to

MAX_BINARY_READ_BYTES = 512_000
"""Binary files larger than this are refused by ``read`` (use ``download_files``); this is
deepagents' preview cap, kept so agents see the same limit everywhere."""

BINARY_EXTENSIONS = frozenset(
    {
        ".png", ".jpeg", ".jpg", ".webp", ".gif", ".heic", ".heif",
        ".mp4", ".mpeg", ".mov", ".avi", ".flv", ".mpg", ".webm", ".wmv", ".3gpp",
        ".wav", ".mp3", ".aiff", ".aac", ".ogg", ".flac",
        ".pdf", ".ppt", ".pptx",
    }
)  # fmt: skip
"""Extensions read as base64 even when their bytes happen to decode (deepagents' list)."""


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def iso_from_epoch(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


class InvalidGlobError(ValueError):
    """A glob pattern the shared matcher refuses."""


# --------------------------------------------------------------------------- messages


def message_for(code: p.ErrorCode, path: str | None = None, detail: str | None = None) -> str:
    """The sentence an agent reads for an error code; ``detail`` is appended when given."""
    subject = f"'{path}'" if path is not None else "path"
    base = {
        p.FILE_NOT_FOUND: f"File {subject} not found",
        p.PERMISSION_DENIED: f"Permission denied: {subject}",
        p.IS_DIRECTORY: f"{subject} is a directory",
        p.NOT_A_DIRECTORY: f"{subject} is not a directory (or a parent is a file)",
        p.INVALID_PATH: f"Invalid path {subject}",
        p.INVALID_ARGUMENT: f"Invalid argument {subject}",
        p.FILE_TOO_LARGE: f"File {subject} is too large",
        p.NOT_A_TEXT_FILE: f"File {subject} is not a text file",
        p.FILE_CHANGED: f"File {subject} changed while it was being edited; read it again and retry",
        p.NO_SPACE: f"No space left on device writing {subject}",
        p.TIMEOUT: f"Operation on {subject} timed out",
        p.CONNECTION_LOST: f"Connection to the sandbox was lost during the operation on {subject}",
    }.get(code, f"{code}: {subject}")
    return f"{base}: {detail}" if detail else base


def failure(code: p.ErrorCode, path: str | None = None, detail: str | None = None) -> tuple[p.ErrorCode, str]:
    return code, message_for(code, path, detail)


def refused_input(exc: ValueError, subject: object) -> tuple[p.ErrorCode, str]:
    """``invalid_path`` for a refused path, ``invalid_argument`` for a refused glob pattern."""
    code: p.ErrorCode = p.INVALID_ARGUMENT if isinstance(exc, InvalidGlobError) else p.INVALID_PATH
    return code, f"{message_for(code, str(subject))}: {exc}"


# --------------------------------------------------------------------------- read


def decode_text(path: str, data: bytes) -> str | None:
    """The file's text, or ``None`` when it must be treated as binary.

    Binary means: an extension agents expect as media, a NUL byte, or bytes that are not
    UTF-8. NUL counts because ``grep`` in every sandbox treats such files as binary too.
    """
    if PurePosixPath(path).suffix.lower() in BINARY_EXTENSIONS or b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


_LINE_END = re.compile("\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
"""Where ``str.splitlines`` ends a line (deepagents' line indexing), a CRLF counting once."""
_LINE_ENDS = ("\n", "\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")


def _count_lines(text: str) -> int:
    """``len(text.splitlines())`` without making the lines: counts, linear and allocation-free."""
    ends = sum(text.count(end) for end in _LINE_ENDS) - text.count("\r\n")
    return ends + (1 if text and not _LINE_END.fullmatch(text[-1]) else 0)


def _line_starts(text: str, first: int, count: int) -> tuple[int, int, int]:
    """(where line ``first`` starts, where line ``first + count`` starts or the text ends, how
    many lines lie between), walking line ends one at a time: memory stays constant."""
    position, line, begin = 0, 0, None
    if first == 0:
        begin = 0
    for match in _LINE_END.finditer(text):
        line += 1
        position = match.end()
        if line == first:
            begin = position
        if begin is not None and line == first + count:
            return begin, position, count
    if begin is None:
        return len(text), len(text), 0
    tail = 1 if position < len(text) else 0  # a last line without its end
    return begin, len(text), min(line + tail - first, count)


def text_prefix(path: str, data: bytes) -> str | None:
    """The complete lines of a file's first bytes ``data``, ``None`` when they are not text."""
    if PurePosixPath(path).suffix.lower() in BINARY_EXTENSIONS or b"\x00" in data:
        return None
    return _complete_prefix(data)


def lines_window(path: str, data: bytes, offset: int, total: int, *, cut: bool) -> p.ReadResult:
    """A window of a big file cut in the sandbox (`sandboxes._scripts.READ_LINES`): ``data`` is
    its lines from ``offset`` on (split at LF), ``cut`` when a bound cut them short (the last,
    partial one is dropped), and ``total`` the file's number of lines."""
    if offset >= total:
        return p.ReadResult(
            error=p.OFFSET_OUT_OF_RANGE, message=f"Line offset {offset} exceeds file length ({total} lines)"
        )
    whole = not cut and not data.endswith(b"\n")  # the file's last line, without its end
    text = text_prefix(path, data + b"\n" if whole else data)
    if not text:
        return p.ReadResult(
            error=p.FILE_TOO_LARGE,
            message=f"File '{path}': line {offset + 1} is not text, or longer than read shows; use execute",
        )
    window = (text[:-1] if whole else text).replace("\r\n", "\n").replace("\r", "\n")
    count = window.count("\n") + (0 if window.endswith("\n") else 1)
    end = offset + count
    return p.ReadResult(
        file_data=p.FileData(window, "utf-8"),
        total_lines=total,
        start_line=offset + 1,
        end_line=end,
        next_offset=end if end < total else None,
    )


def _complete_prefix(data: bytes) -> str | None:
    """The text of a file's first bytes (a multi-byte character cut at their end dropped), up
    to its last line end (a CR at the very end dropped too: it may be half a CRLF); ``None``
    when that is not text."""
    view = memoryview(data)
    for cut in range(4):
        try:
            text = str(view[: len(data) - cut], "utf-8")  # a view: no copy of the bytes
            break
        except UnicodeDecodeError:
            continue
    else:
        return None
    text = text.removesuffix("\r")
    last = max(text.rfind(end) for end in _LINE_ENDS)
    return text[: last + 1]


def read_window(
    path: str,
    data: bytes,
    offset: int,
    limit: int,
    *,
    created_at: str | None = None,
    modified_at: str | None = None,
    whole: bool = True,
) -> p.ReadResult:
    """Slice a file into the requested window (deepagents' ``slice_read_response`` semantics).

    Line indexing splits where ``str.splitlines`` does (LF, CRLF, CR, ...); the window is shown
    with LF endings. Every file is paginated, whatever it holds (an empty one is its empty
    text); ``limit <= 0`` inspects nothing. Time is linear in ``data`` and memory is the window.
    ``whole=False``: ``data`` is only the file's first bytes (`READ_SCAN_BYTES` of a bigger
    file), so only a window inside its complete lines is answered, without ``total_lines``.
    """
    if not whole:
        return _prefix_window(path, data, offset, limit, created_at, modified_at)
    text = decode_text(path, data)
    if text is None:
        if len(data) > MAX_BINARY_READ_BYTES:
            return p.ReadResult(
                error=p.FILE_TOO_LARGE,
                message=f"File '{path}': Binary file exceeds maximum preview size of {MAX_BINARY_READ_BYTES} bytes",
            )
        encoded = base64.b64encode(data).decode("ascii")
        return p.ReadResult(file_data=p.FileData(encoded, "base64", created_at, modified_at))
    return _text_window(text, offset, limit, created_at, modified_at, total=_count_lines(text))


def _text_window(
    text: str, offset: int, limit: int, created_at: str | None, modified_at: str | None, *, total: int | None
) -> p.ReadResult:
    offset, limit = max(int(offset), 0), max(int(limit), 0)
    if text == "":
        return p.ReadResult(file_data=p.FileData(text, "utf-8", created_at, modified_at))
    if limit == 0:
        return p.ReadResult(file_data=p.FileData("", "utf-8", created_at, modified_at), no_lines_requested=True)
    begin, stop, count = _line_starts(text, offset, limit)
    if count == 0:
        shown = total if total is not None else _count_lines(text)
        return p.ReadResult(
            error=p.OFFSET_OUT_OF_RANGE,
            message=f"Line offset {offset} exceeds file length ({shown} lines)",
        )
    window = text[begin:stop].replace("\r\n", "\n").replace("\r", "\n")
    end = offset + count
    more = total is None or end < total
    return p.ReadResult(
        file_data=p.FileData(window, "utf-8", created_at, modified_at),
        total_lines=total,
        start_line=offset + 1,
        end_line=end,
        next_offset=end if more else None,
    )


def _prefix_window(
    path: str, data: bytes, offset: int, limit: int, created_at: str | None, modified_at: str | None
) -> p.ReadResult:
    """A window of a file bigger than what ``read`` looks at (its first ``len(data)`` bytes)."""
    text = text_prefix(path, data)
    if text is None:
        return p.ReadResult(
            error=p.FILE_TOO_LARGE,
            message=f"File '{path}': Binary file exceeds maximum preview size of {MAX_BINARY_READ_BYTES} bytes",
        )
    offset, limit = max(int(offset), 0), max(int(limit), 0)
    result = _text_window(text, offset, limit, created_at, modified_at, total=None)
    if result.error is None and (limit == 0 or result.end_line == offset + limit):
        return result
    return p.ReadResult(
        error=p.FILE_TOO_LARGE,
        message=(
            f"File '{path}' is larger than the {len(data)} bytes read looks at, and lines "
            f"{offset + 1}-{offset + limit} are not all within them: use grep, or execute "
            "(e.g. sed -n) to see them"
        ),
    )


# --------------------------------------------------------------------------- edit


@dataclass(frozen=True, slots=True)
class Replacement:
    content: str
    occurrences: int


def _is_crlf_file(text: str) -> bool:
    newlines = text.count("\n")
    return newlines > 0 and text.count("\r\n") == newlines


def replace_text(
    path: str, content: str, old: str, new: str, replace_all: bool
) -> Replacement | tuple[p.ErrorCode, str]:
    """Apply an edit, or say why it cannot apply.

    Agents see CRLF files with LF endings (``read`` normalises the window), so in a file whose
    every newline is CRLF the match is made on the LF form and the result is written back as
    CRLF. Files with mixed endings are matched literally.
    """
    if old == "":
        return p.INVALID_ARGUMENT, "Error: old_string cannot be empty. Provide the exact text to replace."
    crlf = _is_crlf_file(content)
    if crlf:
        content = content.replace("\r\n", "\n")
        old = old.replace("\r\n", "\n")
        new = new.replace("\r\n", "\n")
    count = content.count(old)
    if count == 0:
        hint = ""
        if old.endswith("\n") and content.endswith(old[:-1]):
            hint = " (old_string ends with a newline but the file does not; drop the trailing newline)"
        return p.STRING_NOT_FOUND, f"Error: String not found in file '{path}': '{old}'{hint}"
    if count > 1 and not replace_all:
        return (
            p.MULTIPLE_OCCURRENCES,
            f"Error: String '{old}' appears {count} times (multiple occurrences) in file '{path}'. "
            "Use replace_all=True to replace all instances, or provide a more specific string "
            "with surrounding context.",
        )
    updated = content.replace(old, new)
    if crlf:
        updated = updated.replace("\n", "\r\n")
    return Replacement(updated, count)


# --------------------------------------------------------------------------- glob


@functools.lru_cache(maxsize=256)
def compile_glob(pattern: str) -> Callable[[str], bool]:
    """A predicate over search-root-relative paths with deepagents' (ripgrep-like) semantics.

    No ``/`` in the pattern: match the basename at any depth. With ``/``: match the relative
    path, ``**`` crossing directories; a leading ``/`` anchors at the root. Dot-names match
    only when the pattern segment starts with ``.``. ``{a,b}`` expands.
    """
    if ".." in pattern.split("/"):
        raise InvalidGlobError(f"'..' is not allowed in glob patterns: {pattern!r}")
    from wcmatch import glob as wcglob  # here: every CLI call imports this module, few glob

    try:
        compiled = wcglob.compile(pattern.lstrip("/"), flags=wcglob.BRACE | wcglob.GLOBSTAR)
    except Exception as exc:  # wcmatch raises private types
        raise InvalidGlobError(f"invalid glob pattern {pattern!r}: {exc}") from exc
    if "/" in pattern:
        return lambda rel: bool(compiled.match(rel))
    return lambda rel: bool(compiled.match(rel.rsplit("/", 1)[-1]))


def basename_prefilter(pattern: str) -> list[str] | None:
    """Shell ``find -name`` patterns that every match's basename satisfies, or ``None``.

    Lets a sandbox skip most files before sending names back; the Python matcher still decides.
    """
    import bracex

    last = pattern.rsplit("/", 1)[-1]
    if last in ("", "**") or "\\" in last:
        return None
    try:
        return list(bracex.expand(last, limit=64)) if "{" in last else [last]
    except Exception:
        return None


def filter_glob(paths: Iterable[str], pattern: str, root: str) -> list[str]:
    """Paths (under ``root``) that ``pattern`` selects, sorted."""
    match = compile_glob(pattern)
    return sorted(path for path in paths if match(relative_to(path, root)))


# --------------------------------------------------------------------------- grep


def grep_text(path: str, text: str, pattern: str) -> list[p.GrepMatch]:
    """Literal (never regex) matches of ``pattern`` in ``text``, 1-based, as ``grep -F`` sees it:
    lines split on LF only, and a final newline does not start an extra empty line."""
    if "\n" in pattern:
        return []
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [p.GrepMatch(path, number, line) for number, line in enumerate(lines, 1) if pattern in line]


GREP_MAX_MATCHES = 10_000
"""Most matches any grep answers, whatever ``max_count`` asks: past it the answer is the first
ones by path then line, with ``truncated``."""

GREP_MAX_CHARS = 4 << 20
"""Most characters of paths and texts any grep answers: past it the answer is the first matches
by path then line that fit, with ``truncated``."""


def finish_grep(matches: list[p.GrepMatch], max_count: int | None) -> p.GrepResult:
    """Order matches by path then line and keep the first ones within ``max_count``,
    `GREP_MAX_MATCHES` and `GREP_MAX_CHARS`; ``truncated`` when any was dropped."""
    matches.sort(key=lambda m: (m.path, m.line))
    cap = GREP_MAX_MATCHES if max_count is None else min(max(max_count, 0), GREP_MAX_MATCHES)
    kept, chars = 0, 0
    for match in matches[:cap]:
        chars += len(match.path) + len(match.text)
        if chars > GREP_MAX_CHARS:
            break
        kept += 1
    if kept < len(matches):
        return p.GrepResult(matches=matches[:kept], truncated=True)
    return p.GrepResult(matches=matches)
