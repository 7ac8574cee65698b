"""`CompositeBackend`: one path namespace stitched together from several backends.

A default backend owns ``/``; each route mounts another backend at an absolute prefix, and a
path belongs to the route with the longest prefix that contains it (component-wise, so a route
at ``/memories`` never captures ``/memoriesX``). The routed backend sees the path with its
prefix stripped (``/memories/a.txt`` is ``/a.txt`` there), and every path it answers with gets
the prefix back exactly once, so the caller only ever sees its own namespace.

The namespace behaves like one filesystem:

* A mount point and every directory above it exist as directories, whatever the backend
  underneath holds there: ``ls`` shows them, ``read``/``write``/``edit``/``upload`` and
  ``download`` on them answer ``is_directory``, and a search rooted there covers the routes
  below. What a backend holds below a more specific mount is hidden (the mount shadows it).
* ``delete`` refuses, with ``invalid_path``, a mount point or any directory containing one: a
  recursive delete that cannot remove the mount must not report success. (``/`` itself is
  refused by the default backend, as everywhere.)
* ``grep`` and ``glob`` above mounts ask every backend involved concurrently (async) and merge;
  a failure of any of them is the answer (no silent partial results).
* Searches cost one call per backend involved (per re-rooted glob pattern for a route below
  the search root: usually one, see `_route_patterns`). The async twins make those calls
  concurrently; the sync methods make them one after another.
* Error messages name the caller's path: a routed backend's quoted inner path (``'/a.txt'``)
  is rewritten to the outer one (``'/memories/a.txt'``).

Commands are a different matter: `CompositeSandbox` runs them in the default backend only, so a
shell does not see routed paths. That is why a composite is a `SandboxBackendProtocol` only
when its default is one; `CompositeBackend.create` picks the right class.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypeVar, overload

import bracex
from wcmatch import fnmatch as wcfnmatch

from sandboxes import protocol as p
from sandboxes.paths import InvalidPathError, is_within, join, normalize_path, relative_to
from sandboxes.semantics import (
    InvalidGlobError,
    compile_glob,
    failure,
    filter_glob,
    finish_grep,
    message_for,
    refused_input,
)

R = TypeVar("R")
_Routed = TypeVar(
    "_Routed",
    p.LsResult,
    p.ReadResult,
    p.WriteResult,
    p.EditResult,
    p.DeleteResult,
    p.GrepResult,
    p.GlobResult,
)

_Method = Literal["ls", "read", "write", "edit", "delete", "grep", "glob", "upload_files", "download_files"]

_BRACE_LIMIT = 1000
"""Same expansion cap as the shared glob matcher, so any pattern it accepts expands here too."""

_ABSENT = (p.FILE_NOT_FOUND, p.NOT_A_DIRECTORY)
"""A backend's answers meaning "nothing here", which a directory implied by mounts overrides."""


@dataclass(frozen=True, slots=True)
class _Mount:
    prefix: str
    """Normalised; ``/`` for the default backend."""
    backend: p.BackendProtocol

    def inner(self, path: str) -> str:
        if self.prefix == "/":
            return path
        return "/" if path == self.prefix else path[len(self.prefix) :]

    def outer(self, inner: str) -> str:
        if self.prefix == "/":
            return inner
        return self.prefix if inner == "/" else self.prefix + inner

    def localize(self, result: _Routed, inner: str) -> _Routed:
        """Speak the caller's namespace: outer paths in the result and in its message.

        The prefix is added here and nowhere else, to paths the routed backend produced, so it
        is added exactly once.
        """
        changes: dict[str, Any] = {}
        if self.prefix != "/" and result.message:
            changes["message"] = _rewrite(result.message, inner, self.outer(inner))
        if isinstance(result, p.WriteResult | p.EditResult | p.DeleteResult) and result.path is not None:
            changes["path"] = self.outer(result.path)
        elif isinstance(result, p.LsResult) and result.entries is not None:
            changes["entries"] = [dataclasses.replace(e, path=self.outer(e.path)) for e in result.entries]
        elif isinstance(result, p.GrepResult | p.GlobResult) and result.matches is not None:
            changes["matches"] = [dataclasses.replace(m, path=self.outer(m.path)) for m in result.matches]
        return dataclasses.replace(result, **changes) if changes else result


@dataclass(frozen=True, slots=True)
class _Call:
    """One backend call of a plan; the driver runs it sync (``method``) or async (``a`` + method)."""

    mount: _Mount
    method: _Method
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


# A plan yields the batch of calls it needs next (run concurrently when async), receives their
# results in order, and returns the answer. Sync and async share every decision this way.
_Plan = Generator[list[_Call], list[Any], R]


def _rewrite(message: str, inner: str, outer: str) -> str:
    # Only the quoted form: every shared message quotes its path, and bare "/" must not be touched.
    return message.replace(f"'{inner}'", f"'{outer}'")


def _segment_matches(component: str, segment: str) -> bool:
    try:
        return bool(wcfnmatch.fnmatch(component, segment))
    except Exception:  # an unusual segment: over-approximate, the final filter decides
        return True


def _closure(states: set[int], segments: list[str]) -> set[int]:
    """States reachable by letting ``**`` segments match nothing."""
    out, stack = set(states), list(states)
    while stack:
        i = stack.pop()
        if i < len(segments) and segments[i] == "**" and i + 1 not in out:
            out.add(i + 1)
            stack.append(i + 1)
    return out


def _route_patterns(pattern: str, mount_rel: str) -> list[str]:
    """Glob patterns that select, at the root of a backend mounted at ``mount_rel`` (relative to
    the search root), at least the files ``pattern`` selects there from the search root.

    Asking the routed backend for these rather than for every file keeps a search cheap and lets
    a sandbox pre-filter names; it is a superset only where wcmatch's rules are
    over-approximated, and callers filter the mapped-back paths with ``filter_glob`` anyway.
    A pattern without ``/`` matches basenames at any depth, which does not depend on the root.
    Otherwise each brace alternative is matched segment by segment against the mount's
    components, and what remains of it is anchored at the routed root.
    """
    if "/" not in pattern:
        return [pattern]
    try:
        alternatives = bracex.expand(pattern, keep_escapes=True, limit=_BRACE_LIMIT)
    except Exception:  # unreachable for patterns compile_glob accepted; dot-files may be missed
        return ["/**"]
    components = mount_rel.split("/")
    found: list[str] = []
    for alternative in alternatives:
        segments = [s for s in alternative.split("/") if s]
        states = _closure({0}, segments)
        for component in components:
            after: set[int] = set()
            for i in states:
                if i >= len(segments):
                    continue
                if segments[i] == "**":
                    if not component.startswith("."):
                        after.add(i)
                elif _segment_matches(component, segments[i]):
                    after.add(i + 1)
            states = _closure(after, segments)
        # A state reachable from another through empty `**` selects a subset of it: skip it.
        for state in sorted(states):
            if state < len(segments) and not any(o != state and state in _closure({o}, segments) for o in states):
                residual = "/" + "/".join(segments[state:])
                if residual not in found:
                    found.append(residual)
    return found


class CompositeBackend(p.BackendProtocol):
    """Routes each path to the backend mounted at its longest matching prefix.

    ``routes`` maps absolute prefixes to backends. Prefixes are normalised (``/mem`` and
    ``/mem/`` are the same route) and validated here, so a bad table fails at construction
    with `ValueError` instead of misrouting later.
    """

    @overload
    @classmethod
    def create(cls, default: p.SandboxBackendProtocol, routes: Mapping[str, p.BackendProtocol]) -> CompositeSandbox: ...

    @overload
    @classmethod
    def create(cls, default: p.BackendProtocol, routes: Mapping[str, p.BackendProtocol]) -> CompositeBackend: ...

    @classmethod
    def create(cls, default: p.BackendProtocol, routes: Mapping[str, p.BackendProtocol]) -> CompositeBackend:
        """A `CompositeSandbox` when ``default`` can run commands, else a `CompositeBackend`."""
        if isinstance(default, p.SandboxBackendProtocol):
            return CompositeSandbox(default, routes)
        return CompositeBackend(default, routes)

    def __init__(self, default: p.BackendProtocol, routes: Mapping[str, p.BackendProtocol]) -> None:
        if not isinstance(default, p.BackendProtocol):
            raise TypeError(f"default must be a BackendProtocol, got {type(default).__name__}")
        self.default = default
        validated: dict[str, p.BackendProtocol] = {}
        for raw, backend in routes.items():
            prefix = _validate_prefix(raw)
            if prefix in validated:
                raise ValueError(f"duplicate route prefix {raw!r}: it normalises to {prefix!r}, already routed")
            if not isinstance(backend, p.BackendProtocol):
                raise TypeError(f"route {raw!r} must map to a BackendProtocol, got {type(backend).__name__}")
            validated[prefix] = backend
        self.routes: Mapping[str, p.BackendProtocol] = MappingProxyType(validated)
        """Normalised prefix -> backend."""
        ordered = sorted(validated.items(), key=lambda item: len(item[0]), reverse=True)
        self._routes = [_Mount(prefix, backend) for prefix, backend in ordered]
        self._default = _Mount("/", default)

    # ------------------------------------------------------------------ routing

    def _owner(self, path: str) -> _Mount:
        for mount in self._routes:
            if is_within(path, mount.prefix):
                return mount
        return self._default

    def _below(self, path: str) -> list[_Mount]:
        """Routes mounted strictly below ``path``, which a search rooted at ``path`` must cover."""
        return [m for m in self._routes if m.prefix != path and is_within(m.prefix, path)]

    def _is_mount_dir(self, path: str) -> bool:
        """Whether ``path`` is a mount point or lies above one: a directory of the namespace."""
        return any(is_within(m.prefix, path) for m in self._routes)

    def _owns(self, mount: _Mount, path: str) -> bool:
        return self._owner(path.rstrip("/") or "/") is mount

    # ------------------------------------------------------------------ drivers

    def _run(self, plan: _Plan[R]) -> R:
        try:
            calls = next(plan)
            while True:
                results = [getattr(c.mount.backend, c.method)(*c.args, **c.kwargs) for c in calls]
                calls = plan.send(results)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    async def _arun(self, plan: _Plan[R]) -> R:
        try:
            calls = next(plan)
            while True:
                # Every call finishes before a failure propagates, so none is left running unobserved.
                results = await asyncio.gather(
                    *(getattr(c.mount.backend, "a" + c.method)(*c.args, **c.kwargs) for c in calls),
                    return_exceptions=True,
                )
                for result in results:
                    if isinstance(result, BaseException):
                        raise result
                calls = plan.send(list(results))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ plans

    def _single(
        self, kind: type[_Routed], method: _Method, raw: str, args: tuple[Any, ...], *, file_only: bool
    ) -> _Plan[_Routed]:
        """An operation on one path, answered by the backend that owns it."""
        try:
            path = normalize_path(raw)
        except InvalidPathError as exc:
            return kind(*refused_input(exc, raw))
        if file_only and self._is_mount_dir(path):
            return kind(*failure(p.IS_DIRECTORY, path))
        mount = self._owner(path)
        inner = mount.inner(path)
        results: list[_Routed] = yield [_Call(mount, method, (inner, *args))]
        return mount.localize(results[0], inner)

    def _delete(self, raw: str) -> _Plan[p.DeleteResult]:
        try:
            path = normalize_path(raw)
        except InvalidPathError as exc:
            return p.DeleteResult(*refused_input(exc, raw))
        if path != "/" and (mounts := [m.prefix for m in self._routes if is_within(m.prefix, path)]):
            what = "it is a route mount point" if path in mounts else f"it contains the route mount point '{mounts[0]}'"
            return p.DeleteResult(p.INVALID_PATH, message_for(p.INVALID_PATH, path, f"{what}, which cannot be deleted"))
        return (yield from self._single(p.DeleteResult, "delete", raw, (), file_only=False))

    def _ls(self, raw: str) -> _Plan[p.LsResult]:
        try:
            path = normalize_path(raw)
        except InvalidPathError as exc:
            return p.LsResult(*refused_input(exc, raw))
        owner, below = self._owner(path), self._below(path)
        if not below:
            return (yield from self._single(p.LsResult, "ls", raw, (), file_only=False))
        inner = owner.inner(path)
        results: list[p.LsResult] = yield [_Call(owner, "ls", (inner,))]
        result = owner.localize(results[0], inner)
        if result.error is not None and result.error not in _ABSENT:
            return result
        entries = [e for e in result.entries or [] if self._owns(owner, e.path)]
        implied = {join(path, relative_to(m.prefix, path).split("/")[0]) + "/" for m in below}
        kept = [e for e in entries if e.path.rstrip("/") + "/" not in implied or e.is_dir]
        implied -= {e.path for e in kept}
        kept += [p.FileInfo(d, True, 0, None) for d in implied]
        return p.LsResult(entries=sorted(kept, key=lambda e: e.path))

    def _search_root(self, raw: str | None) -> str | tuple[p.ErrorCode, str]:
        try:
            return normalize_path(raw or "/")
        except InvalidPathError as exc:
            return refused_input(exc, raw)

    def _search_calls(
        self, root: str, glob: str | None, call: Callable[[_Mount, str, str | None], _Call]
    ) -> list[_Call]:
        """The owner's search at ``root`` first; per route below, searches of the route's root
        with ``glob`` re-rooted there (possibly several patterns, possibly none)."""
        owner = self._owner(root)
        calls = [call(owner, owner.inner(root), glob)]
        for mount in self._below(root):
            globs = _route_patterns(glob, relative_to(mount.prefix, root)) if glob else [None]
            calls += [call(mount, "/", g) for g in globs]
        return calls

    def _search_failure(self, call: _Call, result: _Routed, root: str, is_owner: bool) -> _Routed | None:
        """The failure that must be the answer, localised; ``None`` when there is none.

        The owner not having ``root`` is no failure when mounts below make ``root`` a directory.
        """
        if result.error is None or (is_owner and result.error in _ABSENT and self._below(root)):
            return None
        return call.mount.localize(result, call.mount.inner(root) if is_owner else "/")

    def _glob(self, pattern: str, raw: str | None) -> _Plan[p.GlobResult]:
        try:
            compile_glob(pattern)
        except InvalidGlobError as exc:
            return p.GlobResult(*refused_input(exc, pattern))
        root = self._search_root(raw)
        if isinstance(root, tuple):
            return p.GlobResult(*root)
        calls = self._search_calls(root, pattern, lambda mount, path, g: _Call(mount, "glob", (g or pattern, path)))
        results: list[p.GlobResult] = yield calls
        found: set[str] = set()
        for index, (call, result) in enumerate(zip(calls, results, strict=True)):
            if (failed := self._search_failure(call, result, root, index == 0)) is not None:
                return failed
            localized = call.mount.localize(result, "/")
            paths = [m.path for m in localized.matches or [] if self._owns(call.mount, m.path)]
            found.update(paths if index == 0 else filter_glob(paths, pattern, root))
        truncated = any(r.truncated for r in results)
        return p.GlobResult(matches=[p.FileInfo(path) for path in sorted(found)], truncated=truncated)

    def _grep(self, pattern: str, raw: str | None, glob: str | None, max_count: int | None) -> _Plan[p.GrepResult]:
        try:
            if glob:
                compile_glob(glob)
        except InvalidGlobError as exc:
            return p.GrepResult(*refused_input(exc, glob))
        root = self._search_root(raw)
        if isinstance(root, tuple):
            return p.GrepResult(*root)
        calls = self._search_calls(
            root, glob, lambda mount, path, g: _Call(mount, "grep", (pattern, path, g), {"max_count": max_count})
        )
        results: list[p.GrepResult] = yield calls
        kept: list[list[p.GrepMatch]] = []
        for index, (call, result) in enumerate(zip(calls, results, strict=True)):
            if (failed := self._search_failure(call, result, root, index == 0)) is not None:
                return failed
            kept.append(self._grep_kept(call, result, root, glob, index == 0))
        # A capped answer that lost matches to shadowing or to the glob filter may have withheld
        # matches that belong in the merged window: ask those backends again without the cap.
        redo = [
            i
            for i, (result, matches) in enumerate(zip(results, kept, strict=True))
            if max_count is not None and result.truncated and len(matches) < len(result.matches or [])
        ]
        if redo:
            again: list[p.GrepResult] = yield [dataclasses.replace(calls[i], kwargs={"max_count": None}) for i in redo]
            for i, result in zip(redo, again, strict=True):
                if (failed := self._search_failure(calls[i], result, root, i == 0)) is not None:
                    return failed
                results[i], kept[i] = result, self._grep_kept(calls[i], result, root, glob, i == 0)
        merged = finish_grep(list({m for matches in kept for m in matches}), max_count)
        if any(r.truncated for r in results) and not merged.truncated:
            return p.GrepResult(matches=merged.matches, truncated=True)
        return merged

    def _grep_kept(
        self, call: _Call, result: p.GrepResult, root: str, glob: str | None, is_owner: bool
    ) -> list[p.GrepMatch]:
        """A backend's matches in the caller's namespace, minus what it does not own or (for a
        route searched with a widened glob) what the caller's glob does not select."""
        localized = call.mount.localize(result, "/")
        matches = [m for m in localized.matches or [] if self._owns(call.mount, m.path)]
        if glob and not is_owner:
            keep = set(filter_glob({m.path for m in matches}, glob, root))
            matches = [m for m in matches if m.path in keep]
        return matches

    def _transfer(
        self, raws: list[str], contents: list[bytes] | None
    ) -> _Plan[list[tuple[bytes | None, p.ErrorCode | None, str | None]]]:
        """Uploads (``contents`` given) or downloads: one batch per backend, answers in order.

        Each answer is ``(content, error, message)``; bad paths are answered here, in place.
        """
        answers: list[tuple[bytes | None, p.ErrorCode | None, str | None]] = [(None, None, None)] * len(raws)
        groups: dict[str, tuple[_Mount, list[tuple[int, str]]]] = {}
        for index, raw in enumerate(raws):
            try:
                path = normalize_path(raw)
            except InvalidPathError as exc:
                answers[index] = (None, *refused_input(exc, raw))
                continue
            if self._is_mount_dir(path):
                answers[index] = (None, *failure(p.IS_DIRECTORY, path))
                continue
            mount = self._owner(path)
            groups.setdefault(mount.prefix, (mount, []))[1].append((index, mount.inner(path)))
        calls = [
            _Call(mount, "upload_files", ([(inner, contents[i]) for i, inner in items],))
            if contents is not None
            else _Call(mount, "download_files", ([inner for _, inner in items],))
            for mount, items in groups.values()
        ]
        if not calls:
            return answers
        batches: list[list[p.FileUploadResponse | p.FileDownloadResponse]] = yield calls
        for (mount, items), batch in zip(groups.values(), batches, strict=True):
            for (index, inner), response in zip(items, batch, strict=True):
                message = response.message
                if message and mount.prefix != "/":
                    message = _rewrite(message, inner, mount.outer(inner))
                content = response.content if isinstance(response, p.FileDownloadResponse) else None
                answers[index] = (content, response.error, message)
        return answers

    # ------------------------------------------------------------------ protocol

    def ls(self, path: str) -> p.LsResult:
        return self._run(self._ls(path))

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> p.ReadResult:
        return self._run(self._single(p.ReadResult, "read", file_path, (offset, limit), file_only=True))

    def write(self, file_path: str, content: str) -> p.WriteResult:
        return self._run(self._single(p.WriteResult, "write", file_path, (content,), file_only=True))

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> p.EditResult:
        args = (old_string, new_string, replace_all)
        return self._run(self._single(p.EditResult, "edit", file_path, args, file_only=True))

    def delete(self, file_path: str) -> p.DeleteResult:
        return self._run(self._delete(file_path))

    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> p.GrepResult:
        return self._run(self._grep(pattern, path, glob, max_count))

    def glob(self, pattern: str, path: str | None = None) -> p.GlobResult:
        return self._run(self._glob(pattern, path))

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[p.FileUploadResponse]:
        answers = self._run(self._transfer([raw for raw, _ in files], [content for _, content in files]))
        return [
            p.FileUploadResponse(raw, error, message)
            for (raw, _), (_, error, message) in zip(files, answers, strict=True)
        ]

    def download_files(self, paths: list[str]) -> list[p.FileDownloadResponse]:
        answers = self._run(self._transfer(list(paths), None))
        return [p.FileDownloadResponse(raw, *answer) for raw, answer in zip(paths, answers, strict=True)]

    async def als(self, path: str) -> p.LsResult:
        return await self._arun(self._ls(path))

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> p.ReadResult:
        return await self._arun(self._single(p.ReadResult, "read", file_path, (offset, limit), file_only=True))

    async def awrite(self, file_path: str, content: str) -> p.WriteResult:
        return await self._arun(self._single(p.WriteResult, "write", file_path, (content,), file_only=True))

    async def aedit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> p.EditResult:
        args = (old_string, new_string, replace_all)
        return await self._arun(self._single(p.EditResult, "edit", file_path, args, file_only=True))

    async def adelete(self, file_path: str) -> p.DeleteResult:
        return await self._arun(self._delete(file_path))

    async def agrep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> p.GrepResult:
        return await self._arun(self._grep(pattern, path, glob, max_count))

    async def aglob(self, pattern: str, path: str | None = None) -> p.GlobResult:
        return await self._arun(self._glob(pattern, path))

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[p.FileUploadResponse]:
        answers = await self._arun(self._transfer([raw for raw, _ in files], [content for _, content in files]))
        return [
            p.FileUploadResponse(raw, error, message)
            for (raw, _), (_, error, message) in zip(files, answers, strict=True)
        ]

    async def adownload_files(self, paths: list[str]) -> list[p.FileDownloadResponse]:
        answers = await self._arun(self._transfer(list(paths), None))
        return [p.FileDownloadResponse(raw, *answer) for raw, answer in zip(paths, answers, strict=True)]


class CompositeSandbox(CompositeBackend, p.SandboxBackendProtocol):
    """A composite whose default backend runs commands; ``execute`` runs there.

    Commands see the default backend's filesystem only: routed paths are not mounted into it.
    """

    def __init__(self, default: p.SandboxBackendProtocol, routes: Mapping[str, p.BackendProtocol]) -> None:
        if not isinstance(default, p.SandboxBackendProtocol):
            raise TypeError(f"CompositeSandbox needs a SandboxBackendProtocol default, got {type(default).__name__}")
        super().__init__(default, routes)
        self._sandbox = default

    @property
    def id(self) -> str:
        return self._sandbox.id

    def execute(
        self,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int | None = None,
    ) -> p.ExecuteResponse:
        return self._sandbox.execute(command, timeout=timeout, stdin=stdin, env=env, cwd=cwd, output_limit=output_limit)

    async def aexecute(
        self,
        command: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - forwarded to the sandbox, not an asyncio timeout
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int | None = None,
    ) -> p.ExecuteResponse:
        return await self._sandbox.aexecute(
            command, timeout=timeout, stdin=stdin, env=env, cwd=cwd, output_limit=output_limit
        )


def _validate_prefix(raw: object) -> str:
    if not isinstance(raw, str):
        raise ValueError(f"route prefix must be a string, got {raw!r}")
    try:
        prefix = normalize_path(raw)
    except InvalidPathError as exc:
        raise ValueError(f"invalid route prefix {raw!r}: {exc}") from exc
    if prefix == "/":
        raise ValueError(f"route prefix {raw!r} is the root; pass that backend as `default` instead")
    return prefix
