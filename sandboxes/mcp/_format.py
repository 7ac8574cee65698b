"""Protocol results as the text an LLM reads: numbered lines (as deepagents' ``read_file``),
listings one entry a line, and a long command output as its head and tail around a marker.

Every function here is linear in what it is given and bounds what it returns: a line longer
than `MAX_LINE_CHARS` is cut with a note, an answer stops at a whole line past `ANSWER_CHARS`
and says how to ask for the rest, a preview keeps `PREVIEW_LINES` lines at each end.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable

from sandboxes import api
from sandboxes import protocol as p
from sandboxes.client import ProcessStatus

__all__ = [
    "ANSWER_CHARS",
    "MAX_LINE_CHARS",
    "PREVIEW_LINES",
    "PREVIEW_LINE_CHARS",
    "grep_text",
    "listing_text",
    "numbered",
    "preview",
    "process_text",
    "read_text",
    "sandbox_text",
]

MAX_LINE_CHARS = 2000
"""The longest line shown; the rest of a longer one is replaced by a note of its length."""

PREVIEW_LINES = 20
"""Lines of a long output shown at its head, and as many at its tail."""

PREVIEW_LINE_CHARS = 1000
"""The longest line a preview shows (as deepagents' previews)."""

ANSWER_CHARS = 100_000
"""The most characters of lines a page of a file, a listing or a search answers."""


def _clip(line: str, most: int = MAX_LINE_CHARS) -> str:
    if len(line) <= most:
        return line
    return f"{line[:most]}... [line cut: {len(line) - most} more characters]"


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def numbered(lines: Iterable[str], start_line: int, most: int = MAX_LINE_CHARS) -> str:
    """``lines`` with their 1-based numbers from ``start_line`` in a right-aligned gutter and a
    tab, as ``cat -n`` and deepagents' ``read_file`` show them, each cut at ``most`` characters."""
    return "\n".join(f"{number:>6}\t{_clip(line, most)}" for number, line in enumerate(lines, start_line))


def _bounded(lines: Iterable[str], budget: int = ANSWER_CHARS) -> tuple[list[str], int | None]:
    """The first of ``lines`` that fit in ``budget`` characters, and the index of the first one
    left out (``None``: all fit)."""
    kept: list[str] = []
    used = 0
    for index, line in enumerate(lines):
        used += len(line) + 1
        if used > budget:
            return kept, index
        kept.append(line)
    return kept, None


def read_text(path: str, result: p.ReadResult, uri: str) -> str:
    """A successful read: its numbered lines and, when more follow, the offset to ask next; a
    binary file is not shown, its resource ``uri`` named instead."""
    data = result.file_data
    if data is None:
        return f"{path}: nothing to show"
    if data.encoding == "base64":
        return (
            f"{path} is a binary file ({len(data.content) * 3 // 4} bytes, about): not shown. "
            f"Read it as the resource {uri}, or inspect it with execute."
        )
    if result.no_lines_requested or not data.content:
        return f"{path} exists but is empty" if not result.total_lines else f"{path}: no lines requested"
    start = result.start_line or 1
    shown, cut = _bounded(numbered(_lines(data.content), start).split("\n"))
    text = "\n".join(shown)
    if cut is not None:
        return (
            f"{text}\n\n[lines {start}-{start + cut - 1} of {result.total_lines} (as many as an answer holds); "
            f"call read_file with offset={start - 1 + cut} for the next lines]"
        )
    if result.next_offset is None:
        return text
    return (
        f"{text}\n\n[lines {start}-{result.end_line} of {result.total_lines}; "
        f"call read_file with offset={result.next_offset} for the next lines]"
    )


def listing_text(entries: Iterable[p.FileInfo], truncated: bool = False) -> str:
    """One entry a line: directories end with ``/``; files show their size when known."""
    lines, cut = _bounded(_entry(entry) for entry in entries)
    if truncated or cut is not None:
        lines.append("[more entries exist: narrow the pattern or the path]")
    return "\n".join(lines) if lines else "(nothing)"


def _entry(entry: p.FileInfo) -> str:
    return entry.path if entry.is_dir or entry.size is None else f"{entry.path} ({entry.size} bytes)"


def grep_text(matches: Iterable[p.GrepMatch], truncated: bool = False) -> str:
    """``path:line:text``, one match a line, as ``grep -n`` prints them."""
    lines, cut = _bounded(f"{match.path}:{match.line}:{_clip(match.text)}" for match in matches)
    if truncated or cut is not None:
        lines.append("[more matches exist: narrow the pattern, the path or the glob]")
    return "\n".join(lines) if lines else "no matches"


def preview(text: str, lines: int = PREVIEW_LINES) -> str:
    """``text``'s first and last ``lines`` lines, numbered, around a note of how many were left
    out; all of it (numbered) when it has no more than twice that."""
    all_lines = _lines(text)
    if len(all_lines) <= 2 * lines:
        return numbered(all_lines, 1, PREVIEW_LINE_CHARS)
    omitted = len(all_lines) - 2 * lines
    head = numbered(all_lines[:lines], 1, PREVIEW_LINE_CHARS)
    tail = numbered(all_lines[-lines:], len(all_lines) - lines + 1, PREVIEW_LINE_CHARS)
    return f"{head}\n... [{omitted} lines left out] ...\n{tail}"


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def sandbox_text(info: api.SandboxInfo) -> str:
    """One sandbox on one line: id, template, backend, workdir, expiry."""
    return (
        f"{info.id}  template={info.template} backend={info.backend} "
        f"workdir={info.workdir or '/'} expires={_when(info.expires_at)}"
    )


def _streams(stdout: str, stderr: str) -> str:
    """``stdout``, then ``stderr`` under a line of its own saying so (if there is any)."""
    if not stderr:
        return stdout
    return f"{stdout}{'' if not stdout or stdout.endswith(chr(10)) else chr(10)}[stderr]\n{stderr}"


def process_text(status: ProcessStatus) -> str:
    """A background process's state, its exit code once ended, and its output so far: its
    stdout, then its stderr under a ``[stderr]`` line when it wrote any (a service that keeps
    them merged answers its one output)."""
    head = f"process {status.id}: {status.status}"
    if status.result is not None and status.result.exit_code is not None:
        head += f", exit code {status.result.exit_code}"
    if status.stdout or status.stderr:
        output = _streams(status.stdout, status.stderr)
    else:
        output = status.result.output if status.result is not None else status.output
    return f"{head}\n{output}" if output else f"{head} (no output yet)" if status.running else head
