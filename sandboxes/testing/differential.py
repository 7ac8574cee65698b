"""Differential testing: any backend must answer a random sequence of operations exactly as the
in-memory `StateBackend` does.

Operations draw paths from a small pool of hostile names so that they collide (write over a
directory, read a deleted file, edit what another step wrote). Results are compared after
dropping what legitimately differs: timestamps and the wording of messages.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import strategies as st

from sandboxes import protocol as p

_NAMES = ("a", "b.txt", "a b", "$(x)", "ü.py", "-n", ".h", "c.png")
_TEXT = st.text(st.sampled_from("ab \n\r\tü$'\"x"), max_size=30)
_BLOBS = st.binary(max_size=64).map(lambda b: b + b"\x00")  # NUL: binary to every backend
_PATTERNS = st.sampled_from(("*", "*.txt", "**/*", "a*", "*/b.txt", "{a,b.txt}", ".*", "?"))
_NEEDLES = st.sampled_from(("a", "b", " ", "ü", "$", "x\n", ""))


@st.composite
def _relative_path(draw: st.DrawFn) -> str:
    depth = draw(st.integers(min_value=1, max_value=3))
    return "/".join(draw(st.sampled_from(_NAMES)) for _ in range(depth))


def operations() -> st.SearchStrategy[list[tuple[str, tuple[Any, ...]]]]:
    """Lists of ``(method, args)`` with paths relative to the test root."""
    path = _relative_path()
    uploads = st.lists(st.tuples(path, _BLOBS | _TEXT.map(str.encode)), max_size=3)
    op = st.one_of(
        st.tuples(st.just("write"), st.tuples(path, _TEXT)),
        st.tuples(st.just("upload_files"), st.tuples(uploads)),
        st.tuples(st.just("read"), st.tuples(path, st.integers(-1, 4), st.integers(0, 3))),
        st.tuples(st.just("edit"), st.tuples(path, _NEEDLES, _TEXT, st.booleans())),
        st.tuples(st.just("delete"), st.tuples(path)),
        st.tuples(st.just("ls"), st.tuples(path | st.just(""))),
        st.tuples(st.just("grep"), st.tuples(_NEEDLES, path | st.just(""), st.none() | _PATTERNS)),
        st.tuples(st.just("glob"), st.tuples(_PATTERNS, path | st.just(""))),
        st.tuples(st.just("download_files"), st.tuples(st.lists(path, max_size=3))),
    )
    return st.lists(op, min_size=1, max_size=12)


def apply(backend: p.BackendProtocol, root: str, method: str, args: tuple[Any, ...]) -> Any:
    """Run one operation with its relative paths placed under ``root``."""

    def at(relative: str) -> str:
        return f"{root}/{relative}" if relative else root

    if method == "write":
        return backend.write(at(args[0]), args[1])
    if method == "upload_files":
        return backend.upload_files([(at(rel), content) for rel, content in args[0]])
    if method == "download_files":
        return backend.download_files([at(rel) for rel in args[0]])
    if method == "read":
        return backend.read(at(args[0]), args[1], args[2])
    if method == "edit":
        return backend.edit(at(args[0]), args[1], args[2], args[3])
    if method == "delete":
        return backend.delete(at(args[0]))
    if method == "ls":
        return backend.ls(at(args[0]))
    if method == "grep":
        return backend.grep(args[0], at(args[1]), args[2])
    if method == "glob":
        return backend.glob(args[0], at(args[1]))
    raise ValueError(method)


def comparable(result: Any) -> Any:
    """The part of a result every backend must agree on: codes and data, not prose or clocks."""
    if isinstance(result, list):
        return [comparable(item) for item in result]
    if isinstance(result, p.FileInfo):
        return (result.path, result.is_dir, result.size if not result.is_dir else 0)
    if isinstance(result, p.FileData):
        return (result.content, result.encoding)
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
        fields.pop("message", None)
        return (type(result).__name__, {name: comparable(value) for name, value in fields.items()})
    return result
