"""What crosses the exec helper's stream, and what the helper imports to speak it: the client's
requests come `marshal`'d (`wire_spec`), the helper's answers are JSON made without `json`
(``_server._json``), and a helper starts without importing `json`, `re`, `enum` or `signal`,
which were a quarter of its start. The real helper, over pipes."""

from __future__ import annotations

import enum
import json
import marshal
import resource
import subprocess
import sys
from collections import OrderedDict
from typing import IO, Any

import pytest
from test_mux import _PipeStream

from sandboxes._helper import _loop
from sandboxes._mux import Command, MuxClient
from sandboxes._mux._shipped import HELPER_SOURCES, bootstrap
from sandboxes._mux.client import HEADER, PYTHON_FLAGS, SERVER_SOURCE, wire_spec

_SLOW_IMPORTS = {"json", "re", "enum", "signal", "typing", "collections"}
"""Modules a helper's start no longer pays for: `json` and `re` (~3 ms in the runtime image),
`enum` (through `signal` as well, ~3 ms), and what they pull in."""


def _helper_json() -> Any:
    """``_loop._json`` as the helper defines it."""
    return _loop._json


@pytest.mark.parametrize(
    "value",
    [
        {"code": 0, "timed_out": False},
        {"code": None, "timed_out": True},
        {"code": -9, "timed_out": False},
        {"pid": 12, "python": "3.13.0rc1+", "pids_limit": None, "native": ["write", "ls"], "warm": True},
        'a "quoted" back\\slash, a newline\n, a tab\t, NUL \0, DEL \x7f',
        "non-ASCII \u00e9, outside the BMP \U0001f600, a lone surrogate \udc80",
        {"nested": [[], {}, [1, [2, "x"]]], "": ""},
    ],
)
def test_the_helpers_answers_are_the_json_the_client_parses(value: object) -> None:
    """Whatever ``_json`` is given, `json.loads` reads it back as it was (strings escaped as
    `json` would: quotes, backslashes, control characters, UTF-16 pairs; ``repr``, so that a
    ``true`` written as ``1`` would not pass)."""
    assert repr(json.loads(_helper_json()(value))) == repr(value)


@pytest.mark.parametrize("value", [1.5, b"bytes", ("a", "tuple"), {1, 2}])
def test_what_the_helper_never_answers_is_refused_not_garbled(value: object) -> None:
    with pytest.raises(TypeError):
        _helper_json()(value)


def test_a_helper_starts_without_json_re_enum_or_signal() -> None:
    """The helper answers a ping and a command with none of `_SLOW_IMPORTS` imported
    (``-X importtime`` names every module imported, as it is). It fails if the helper imports
    `json` again, or `signal` rather than `_signal`, or anything that pulls them in."""
    request = wire_spec({"command": "echo served", "env": {}, "cwd": None, "timeout": None, "stdin": False})
    server = HELPER_SOURCES["_server"].replace("\nNATIVE_IDLE = 0.05\n", "\nNATIVE_IDLE = 3600.0\n")
    assert server != HELPER_SOURCES["_server"]  # the file ops (`_search` imports `re`) compile only when asked
    never_idle = bootstrap({**HELPER_SOURCES, "_server": server})
    process = subprocess.Popen(
        [sys.executable, "-X", "importtime", *PYTHON_FLAGS, "-c", never_idle],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    try:
        process.stdin.write(HEADER.pack(b"P", 0, 0) + HEADER.pack(b"R", 1, len(request)) + request)
        process.stdin.flush()
        answers = [_frame(process.stdout)]
        while answers[-1][0] != b"X":
            answers.append(_frame(process.stdout))
    finally:
        _, errors = process.communicate(timeout=60)  # the end of its input ends it
    assert answers[0][0] == b"H", answers
    assert json.loads(answers[0][2])["pid"] == process.pid
    assert (b"O", 1, b"served\n") in answers, answers
    assert answers[-1] == (b"X", 1, b'{"code": 0, "timed_out": false}'), answers
    imported = {line.rpartition("|")[2].strip() for line in errors.decode().splitlines() if "import time:" in line}
    assert {"marshal", "select", "struct"} <= imported, sorted(imported)  # the report is read right
    assert not imported & _SLOW_IMPORTS, sorted(imported & _SLOW_IMPORTS)


@pytest.mark.parametrize("kind", [b"R", b"M", b"F"])
@pytest.mark.parametrize(
    "payload",
    [
        wire_spec({"command": "true", "env": {}})[:-3],
        b"",
        b"\xff not marshal",
        b'{"command": "true", "env": {}}',
        wire_spec({"op": ["ls"]})[:-1],
        marshal.dumps(["not", "a", "dict"], 4),
        b"[\xff\xff\xff\x7f",
    ],
    ids=["cut", "empty", "garbage", "json", "cut-op", "a-list", "a-list-of-2g-items"],
)
def test_a_malformed_spec_is_refused_and_the_helper_keeps_serving(kind: bytes, payload: bytes) -> None:
    """Only a client that is not `MuxClient` sends one, or a stream that corrupts it: the helper
    answers E and serves on: `marshal` raises EOFError for a spec cut short, MemoryError for
    one announcing more than the helper may hold (its address space is limited here, as a
    sandbox's memory is), not only ValueError."""
    process = subprocess.Popen(
        [sys.executable, *PYTHON_FLAGS, "-c", SERVER_SOURCE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)),
    )
    assert process.stdin is not None
    assert process.stdout is not None
    try:
        process.stdin.write(HEADER.pack(kind, 1, len(payload)) + payload + HEADER.pack(b"P", 0, 0))
        process.stdin.flush()
        answers = [_frame(process.stdout)]
        while answers[-1][0] != b"H":
            answers.append(_frame(process.stdout))
    finally:
        process.stdin.close()
        assert process.wait(timeout=60) == 0
    assert [(kind, ident) for kind, ident, _ in answers if kind != b"A"] == [(b"E", 1), (b"H", 0)], answers


class _Mode(str, enum.Enum):  # noqa: UP042 - the (str, Enum) of code before StrEnum, whose str() is its name
    FAST = "fast"


class _Count(enum.IntEnum):
    THREE = 3


class _Ratio(float):
    pass


def test_a_spec_is_sent_as_json_sent_it() -> None:
    """`marshal` takes the built-in types alone; `json` took their subclasses (a ``(str, Enum)``
    member in an environment, as its value), tuples as lists and any mapping: so does `wire_spec`."""
    spec = {
        "env": OrderedDict([("MODE", _Mode.FAST)]),
        "cwd": _Mode.FAST,
        "timeout": _Ratio(1.5),
        "op": ("ls", _Mode.FAST),
        "count": _Count.THREE,
        "stdin": True,
        "none": None,
    }
    sent = marshal.loads(wire_spec(spec))
    assert repr(sent) == repr(json.loads(json.dumps(spec)))
    with pytest.raises(TypeError):
        wire_spec({"stdin": b"bytes"})


def test_a_command_gets_a_str_enum_in_its_environment_as_its_value() -> None:
    stream = _PipeStream()
    try:
        result = MuxClient(stream).run(
            Command('printf %s "$MODE"', timeout=30, output_limit=1000, env={"MODE": _Mode.FAST})
        )
        assert (result.exit_code, result.output) == (0, "fast")
    finally:
        stream.close()


def _frame(stream: IO[bytes]) -> tuple[bytes, int, bytes]:
    kind, ident, length = HEADER.unpack(stream.read(HEADER.size))
    return kind, ident, stream.read(length)
