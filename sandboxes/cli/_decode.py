"""The light path's reading of the service's JSON and making of its request bodies, without
pydantic: each answer is read into the protocol's dataclasses (or a mirror of an API model
below) only when it is exactly of the declared types; anything else raises `Unsure`, and the
caller hands the same bytes or arguments to the client's pydantic models (`sandboxes.api`), so a
strange answer or a bad argument ends exactly as the full client ends it.

The mirrors (`SandboxInfo`, `StreamEvent`, `ProcessInfo`) state the fields of the API models of
those names; tests/test_cli_light.py holds them, and every decoder here, to those models.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import math
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from sandboxes import protocol as p

__all__ = [
    "EXECUTE_RESULT_FIELDS",
    "REQUEST_FIELDS",
    "ProcessInfo",
    "SandboxInfo",
    "SandboxList",
    "StreamEvent",
    "Unsure",
    "execute_body",
    "file_body",
    "strictly",
]

T = TypeVar("T")

EXECUTE_RESULT_FIELDS = ("output", "exit_code", "truncated", "error", "message", "duration_ms")
"""The fields of `sandboxes.api.ExecuteResult`: what an `ExecuteResponse` is read from (not its
``extra``, which the wire does not carry)."""

REQUEST_FIELDS = {
    "ls": ("path",),
    "read": ("file_path", "offset", "limit"),
    "write": ("file_path", "content"),
    "grep": ("pattern", "path", "glob", "max_count"),
    "glob": ("pattern", "path"),
}
"""The fields of each file operation's request model (`sandboxes.api.LsRequest`, ...), in order:
all of them are sent, as the model dumps them."""

_FIELDS: dict[type, tuple[str, ...]] = {p.ExecuteResponse: EXECUTE_RESULT_FIELDS}
_SURROGATE = re.compile("[\ud800-\udfff]")


class Unsure(Exception):
    """This answer or argument is not plainly valid: the client's models must judge it."""


@dataclass(frozen=True, slots=True)
class SandboxInfo:
    """`sandboxes.api.SandboxInfo`'s fields."""

    id: str
    template: str
    backend: str
    created_at: float
    expires_at: float | None
    labels: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    state: Literal["running", "paused"] = "running"
    processes_kept: bool | None = None


@dataclass(frozen=True, slots=True)
class SandboxList:
    """`sandboxes.api.SandboxList`'s fields."""

    sandboxes: list[SandboxInfo]


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """`sandboxes.api.StreamEvent`'s fields, its ``result`` read as an `ExecuteResponse`."""

    type: Literal["output", "exit"]
    data: str | None = None
    result: p.ExecuteResponse | None = None
    id: str | None = None
    offset: int | None = None
    stream: Literal["stderr", "merged"] | None = None


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """`sandboxes.api.ProcessInfo`'s fields, its ``result`` read as an `ExecuteResponse`."""

    id: str
    status: Literal["running", "exited", "killed", "timeout"]
    output: str = ""
    result: p.ExecuteResponse | None = None
    stdout: str = ""
    stderr: str = ""


def strictly(kind: type[T], raw: bytes | str) -> T:
    """``raw`` (a JSON object) as a ``kind`` (a dataclass); `Unsure` unless it is exactly of the
    declared types (fields a newer service adds are ignored, as the API's answers do)."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise Unsure from exc
    value: T = _value(kind, data)
    return value


@functools.cache
def _hints(kind: type) -> dict[str, Any]:
    return typing.get_type_hints(kind)


def _value(kind: Any, data: Any) -> Any:
    origin = typing.get_origin(kind)
    if kind is str:
        if type(data) is not str or (not data.isascii() and _SURROGATE.search(data)):
            raise Unsure  # the answer's own JSON parser refuses a lone surrogate
        return data
    if kind is bool or kind is int:
        if type(data) is not kind:
            raise Unsure
        return data
    if kind is float:
        if type(data) not in (int, float) or not math.isfinite(data):
            raise Unsure
        return float(data)
    if kind is type(None):
        if data is not None:
            raise Unsure
        return None
    if origin is Literal:
        if type(data) is not str or data not in typing.get_args(kind):
            raise Unsure
        return data
    if origin in (typing.Union, types.UnionType):
        return _union(typing.get_args(kind), data)
    if origin is list:
        if type(data) is not list:
            raise Unsure
        (item,) = typing.get_args(kind)
        return [_value(item, each) for each in data]
    if origin is dict:
        if type(data) is not dict:
            raise Unsure
        key, item = typing.get_args(kind)
        return {_value(key, k): _value(item, v) for k, v in data.items()}
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        return _dataclass(kind, data)
    raise Unsure


def _union(kinds: tuple[Any, ...], data: Any) -> Any:
    if data is None:
        if type(None) in kinds:
            return None
        raise Unsure
    (kind,) = [k for k in kinds if k is not type(None)] or [None]
    return _value(kind, data)


def _dataclass(kind: type, data: Any) -> Any:
    if type(data) is not dict:
        raise Unsure
    hints = _hints(kind)
    names = _FIELDS.get(kind) or tuple(f.name for f in dataclasses.fields(kind))
    values = {name: _value(hints[name], data[name]) for name in names if name in data}
    try:
        return kind(**values)
    except TypeError as exc:  # a required field is missing
        raise Unsure from exc


def execute_body(
    command: str,
    *,
    timeout: float | None,
    stdin: bytes | None,
    env: Mapping[str, str] | None,
    cwd: str | None,
) -> dict[str, Any]:
    """`sandboxes.api.ExecuteRequest`'s body as its model dumps it, when the model certainly
    takes these values; `Unsure` when it might refuse them (it says why, as the client does)."""
    env = dict(env or {})
    plain = (
        type(command) is str
        and "\x00" not in command
        and (timeout is None or (type(timeout) is float and math.isfinite(timeout) and timeout >= 0))
        and (cwd is None or (type(cwd) is str and "\x00" not in cwd))
        and all(_env_entry(name, value) for name, value in env.items())
    )
    if not plain:
        raise Unsure
    stdin_b64 = None if stdin is None else base64.b64encode(stdin).decode("ascii")
    return {
        "command": command,
        "timeout": timeout,
        "stdin_b64": stdin_b64,
        "env": env,
        "cwd": cwd,
        "output_limit": None,
    }


def _env_entry(name: object, value: object) -> bool:
    return (
        type(name) is str
        and type(value) is str
        and name != ""
        and "=" not in name
        and "\x00" not in name
        and "\x00" not in value
    )


def file_body(op: str, *values: object) -> dict[str, Any]:
    """A file operation's request body, ``values`` in `REQUEST_FIELDS` order; `Unsure` unless
    each is of its field's JSON type (a string, an integer, or ``None`` where optional)."""
    names = REQUEST_FIELDS[op]
    if len(values) != len(names) or not all(_plain(name, value) for name, value in zip(names, values, strict=True)):
        raise Unsure
    return dict(zip(names, values, strict=True))


def _plain(name: str, value: object) -> bool:
    if name in ("offset", "limit"):
        return type(value) is int
    if name == "max_count":
        return value is None or type(value) is int
    if name in ("path", "glob"):
        return value is None or type(value) is str
    return type(value) is str
