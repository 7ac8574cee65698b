"""A grep's output is the sandbox's: `sandboxes._parse.parse_grep` reads any of it in time
linear in its size and keeps no more than a grep answers; `sandboxes.client` holds what the
service sends to the same caps."""

from __future__ import annotations

import time

import httpx

from sandboxes import _parse, _scripts
from sandboxes import protocol as p
from sandboxes.client import _wire
from sandboxes.semantics import GREP_MAX_CHARS, GREP_MAX_MATCHES, finish_grep

_FAST = 1.0
"""Seconds a parse below may take: each takes milliseconds; the quadratic parser they were
shaped against took more than ten."""


def _parse_time(output: str) -> tuple[float, _parse.GrepParse]:
    started = time.perf_counter()
    parsed = _parse.parse_grep(output)
    return time.perf_counter() - started, parsed


def test_lines_that_name_no_candidate_are_read_once() -> None:
    """Each such line sent the search for a name over every colon to the end of the output (a
    new hashed prefix each): 18 KB took 18 s. Now every line is read once."""
    elapsed, parsed = _parse_time("/r/a\x00\x00\n" + "/r/b:\n" * 3000)
    assert elapsed < _FAST
    assert parsed == _parse.GrepParse([], False)
    elapsed, parsed = _parse_time("/r/a\x00\x00\n" + "/r/b:\n" * 300_000 + "/r/a:1:hit\n")
    assert elapsed < 2 * _FAST
    assert parsed == _parse.GrepParse([p.GrepMatch("/r/a", 1, "hit")], False)


def test_names_full_of_colons_cost_a_bounded_budget() -> None:
    """Candidate names of thousands of colons, and lines that almost name them: only the
    lengths of names sharing a line's text before its first colon are tried, and what they cost
    is paid from a budget of the output's size; past it the answer is ``truncated``. Names with
    a few colons are read whole."""
    colons = ":" * 4000
    names = "".join(f"/r/{colons}{i}\x00" for i in range(50)) + "\x00\n"
    elapsed, parsed = _parse_time(names + f"/r/{colons}x:1:t\n" * 2000)
    assert elapsed < _FAST
    assert parsed == _parse.GrepParse([], False)
    every_length = "".join(f"/r/{':' * k}n\x00" for k in range(1, 4000)) + "\x00\n"
    elapsed, parsed = _parse_time(every_length + f"/r/{colons}\n" * 2000)
    assert elapsed < _FAST
    assert parsed == _parse.GrepParse([], True)
    odd = [f"/r/a:b/{i}:1:{i}" for i in range(2000)]
    elapsed, parsed = _parse_time(
        "".join(f"{name}\x00" for name in odd) + "\x00\n" + "".join(f"{name}:7:hit\n" for name in odd)
    )
    assert parsed == _parse.GrepParse([p.GrepMatch(name, 7, "hit") for name in odd], False)


def test_parsing_stops_past_the_limit() -> None:
    output = "=Z\n" + "/r/a\x001:hit\n" * 100
    assert _parse.parse_grep(output, limit=5) == _parse.GrepParse([p.GrepMatch("/r/a", 1, "hit")] * 6, True)
    anchored = "/r/a\x00\x00\n" + "/r/a:1:hit\n" * 100
    assert _parse.parse_grep(anchored, limit=5) == _parse.GrepParse([p.GrepMatch("/r/a", 1, "hit")] * 6, True)


def test_a_part_the_scripts_cap_cut_loses_its_unfinished_line() -> None:
    record = "/r/a\x001:" + "x" * 1000 + "\n"
    lines = record * (_scripts.GREP_PART_MAX // len(record)) + record[:500]
    assert len(lines) >= _scripts.GREP_PART_MAX
    parsed = _parse.parse_grep("=Z\n" + lines[: _scripts.GREP_PART_MAX], limit=1 << 30)
    assert parsed.truncated
    assert len(parsed.matches) == _scripts.GREP_PART_MAX // len(record)
    assert not _parse.parse_grep("=Z\n" + record * 3).truncated
    names = "".join(f"/r/{i:07}\x00" for i in range(_scripts.GREP_PART_MAX // 11 + 1))[: _scripts.GREP_PART_MAX]
    assert _parse.parse_grep(names + "\x00\n/r/0000001:1:hit\n") == _parse.GrepParse(
        [p.GrepMatch("/r/0000001", 1, "hit")], True
    )


def test_an_answer_keeps_within_the_caps() -> None:
    many = [p.GrepMatch("/r/a", n, "hit") for n in range(GREP_MAX_MATCHES + 1, 0, -1)]
    assert finish_grep(many, None) == p.GrepResult(matches=sorted(many, key=lambda m: m.line)[:-1], truncated=True)
    wide = [p.GrepMatch("/r/a", n, "x" * (1 << 20)) for n in range(1, 6)]
    kept = finish_grep(list(wide), None)
    assert kept.truncated
    assert kept.matches == wide[: len(kept.matches or [])]
    assert sum(len(m.path) + len(m.text) for m in kept.matches or []) <= GREP_MAX_CHARS
    assert finish_grep(wide[:2], None) == p.GrepResult(matches=wide[:2])


def test_the_client_keeps_a_services_answer_within_the_caps() -> None:
    matches = [{"path": "/r/a", "line": n, "text": "hit"} for n in range(1, GREP_MAX_MATCHES + 6)]
    result = _wire.grep_result(httpx.Response(200, json={"matches": matches, "truncated": False}))
    assert result.truncated
    assert result.matches == [p.GrepMatch("/r/a", n, "hit") for n in range(1, GREP_MAX_MATCHES + 1)]
    small = _wire.grep_result(httpx.Response(200, json={"matches": matches[:2], "truncated": False}))
    assert small == p.GrepResult(matches=[p.GrepMatch("/r/a", 1, "hit"), p.GrepMatch("/r/a", 2, "hit")])
