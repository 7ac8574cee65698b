"""The output of a job or a recorded command as `sandboxes.jobs` reads it back: kept pieces of
a stream with their positions, as text with markers where bytes were dropped, and a record's
runs of one stream (`sandboxes._helper._record`), parsed as the hostile text they may be."""

from __future__ import annotations

from sandboxes._output import Stream
from sandboxes._parse import natural

__all__ = ["MAX_RUNS", "Chunks", "add_run", "dropped", "encoded", "end", "text"]

Chunks = tuple[tuple[int, bytes], ...]
"""Kept pieces of one stream, as ``(position in the stream, bytes)``, in order."""


def encoded(size: int) -> int:
    """Most bytes the scripts answer for ``size`` bytes of one stream: base64 and its lines, the
    headers."""
    return size * 4 // 3 + 4 * (size // 57 + 4) + 4096


def end(chunks: Chunks) -> int:
    """The position after the last kept byte (0: none)."""
    return chunks[-1][0] + len(chunks[-1][1]) if chunks else 0


def dropped(chunks: Chunks) -> int:
    """Bytes between the chunks that are no longer kept."""
    gaps, position = 0, None
    for start, data in chunks:
        if position is not None and start > position:
            gaps += start - position
        position = start + len(data)
    return gaps


def text(chunks: Chunks) -> str:
    """The chunks as text, with a marker where bytes were dropped (as `OutputBuffer.text`)."""
    parts: list[str] = []
    position = None
    for start, data in chunks:
        if position is not None and start > position:
            parts.append(f"\n... [{start - position} bytes of output truncated] ...\n")
        parts.append(data.decode("utf-8", "replace"))
        position = start + len(data)
    return "".join(parts)


_TAGS: dict[str, Stream] = {"o": "stdout", "e": "stderr", "m": "merged"}
MAX_RUNS = 4096
"""Most runs of one stream a record keeps (`sandboxes._helper._record`); past them, ``merged``."""


def add_run(runs: list[tuple[int, Stream]], line: str) -> None:
    """One ``OFFSET TAG`` line of a record's runs, kept if well formed and past the last one
    (the sandbox wrote it: anything else is dropped)."""
    fields = line.split()
    if len(runs) >= MAX_RUNS or len(fields) != 2 or fields[1] not in _TAGS:
        return
    start = natural(fields[0])
    if start is not None and (not runs or start > runs[-1][0]):
        runs.append((start, _TAGS[fields[1]]))
