"""How the client reads a streamed execute's NDJSON lines (`sandboxes.client._streams`): each
output chunk is an `OutputChunk`, the text (a str) with the stream it came from."""

from __future__ import annotations

import json

from sandboxes import protocol as p
from sandboxes.client import OutputChunk
from sandboxes.client._streams import _item, _Position


def _line(**event: object) -> str:
    return json.dumps(event)


def test_each_chunk_says_which_stream_it_came_from() -> None:
    position = _Position("sandbox", reattach=True)
    lines = [
        _line(type="output", data="", id="c1", offset=0),
        _line(type="output", data="out\n", offset=4),  # stdout: the shape clients before streams read
        _line(type="output", data="err\n", offset=8, stream="stderr"),
        _line(type="output", data="", offset=8),  # a keep-alive
        _line(type="stdin-closed", data="?"),  # a type a newer service may send
        _line(type="output", data="both\n", offset=13, stream="merged"),
        _line(type="exit", result={"output": "out\nerr\nboth\n", "exit_code": 0}),
    ]
    items = [item for item in (_item(position, line) for line in lines) if item is not None]
    *chunks, final = items
    assert [(str(chunk), chunk.stream) for chunk in chunks if isinstance(chunk, OutputChunk)] == [
        ("out\n", "stdout"),
        ("err\n", "stderr"),
        ("both\n", "merged"),
    ]
    assert chunks == ["out\n", "err\n", "both\n"]  # still the strs they were
    assert isinstance(final, p.ExecuteResponse)
    assert final.output == "".join(map(str, chunks))
    assert (position.command_id, position.offset) == ("c1", 13)
