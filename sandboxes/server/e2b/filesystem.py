"""envd's ``filesystem.Filesystem`` unary RPCs over Connect (JSON codec): ``Stat``, ``ListDir``
(with a depth), ``MakeDir``, ``Move`` and ``Remove``, each one constant script run through the
sandbox's ``execute`` with every path bound as a quoted positional parameter
(`sandboxes._scripts.command`), so no path can become shell syntax; ``ListDir``'s is answered
by the sandbox's exec helper itself where it has one (its native ``list_dir``, the same bytes
without a process). Failures are Connect's
``{code, message}`` with its HTTP status (``not_found``: the SDK's ``FileNotFoundException``).
A relative path is under the sandbox's workdir, as ``/files`` resolves it."""

from __future__ import annotations

import functools
import posixpath
import stat
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from sandboxes import _scripts
from sandboxes import protocol as p
from sandboxes.base import Call
from sandboxes.paths import InvalidPathError, normalize_path
from sandboxes.server.e2b.common import ENVD_PREFIX, E2BRoute
from sandboxes.server.e2b.connect import ConnectError, unary_message
from sandboxes.server.e2b.envd import access, in_lane
from sandboxes.server.e2b.metadata import get_call, parsed
from sandboxes.server.errors import ServiceError
from sandboxes.server.registry import Entry

__all__ = ["entry_info", "router", "with_metadata"]

router = APIRouter(prefix=ENVD_PREFIX, route_class=E2BRoute, include_in_schema=False)

LIST_OUTPUT_LIMIT = 16 << 20
"""What a ``ListDir`` may send back from the sandbox; a listing past it is ``failed_precondition``."""
ENTRY_OUTPUT_LIMIT = 64 << 10
"""What a one-entry answer (``Stat``, ``Move``) may send back: a stat line and a link's target."""
MAX_DEPTH = 64

_ENTRY = r"""entry() {
  s=$(stat -c '%f %s %Y %u %g %U %G' -- "$1" 2>/dev/null) || exit 10
  printf '%s\n' "$s"
  if [ -L "$1" ]; then
    m=$(stat -L -c '%f' -- "$1" 2>/dev/null) || m=-
    t=$(readlink -e -- "$1" 2>/dev/null) || t=$1
    printf '%s\n%s\n' "$m" "$t"
  fi
  exit 0
}
"""
"""``entry PATH`` prints PATH's lstat (raw mode in hex, size, mtime, uid, gid, owner, group) on
one line; for a symlink, as envd reports one, then the raw mode of what it resolves to (``-``
if nothing) and its resolved absolute path (PATH itself if it does not resolve); and ends the
script."""

STAT = (
    _ENTRY
    + r"""if [ ! -e "$1" ] && [ ! -L "$1" ]; then why "$1"; exit "$c"; fi
entry "$1"
"""
)

LIST = r"""if [ ! -d "$1" ]; then
  if [ -e "$1" ]; then exit 16; fi
  why "$1"; exit "$c"
fi
cd -P -- "$1" 2>/dev/null || exit 12
if find . -maxdepth 0 -printf "" 2>/dev/null; then
  find . -mindepth 1 -maxdepth "$2" -printf "=%y%m %s %T@ %U %G %u %g\n%p\0" 2>/dev/null
  exit 0
fi
find . -mindepth 1 -maxdepth "$2" -exec sh -c '
F="%f %s %Y %u %g %U %G"
s=$(stat -c "$F" -- "$@" 2>/dev/null)
n=$(printf "%s\n" "$s" | wc -l)
if [ -n "$s" ] && [ $((n)) -eq $# ]; then
  printf "%s\n" "$s" | for f; do IFS= read -r l; printf "%s\n%s\0" "$l" "$f"; done
else
  for f; do l=$(stat -c "$F" -- "$f" 2>/dev/null) && printf "%s\n%s\0" "$l" "$f"; done
fi' sh {} + 2>/dev/null
exit 0
"""
"""Each entry under ``$1`` (followed if a link) down to depth ``$2``, not following links: its
stat line, a newline, its path relative to ``$1`` (``./a/b``), a NUL. A ``find`` that prints
(GNU's) writes each line itself, in one process: ``=``, the type letter and the octal
permissions, then as `_ENTRY`'s (mtime with a fraction); another's entries are stat-ed, one
``stat`` per batch of ``find``'s (a batch in which an entry vanished, one by one), in
`_ENTRY`'s format. The exec helper's native ``list_dir`` (`sandboxes._helper._listdir`)
answers the same exit codes and GNU ``find``'s bytes."""

MAKE_DIR = r"""if [ -d "$1" ]; then exit 11; fi
if [ -e "$1" ] || [ -L "$1" ]; then exit 16; fi
mkdir -p -- "$1" 2>/dev/null && exit 0
why "$1"; [ "$c" = 10 ] && c=12; exit "$c"
"""
"""Status 11: the directory exists; 16: something else is there."""

MOVE = (
    _ENTRY
    + r"""if [ ! -e "$1" ] && [ ! -L "$1" ]; then why "$1"; exit "$c"; fi
if [ -d "$2" ] && [ ! -L "$2" ]; then exit 11; fi
d=${2%/*}
[ -z "$d" ] || [ -d "$d" ] || mkdir -p -- "$d" 2>/dev/null || exit 12
mv -f -- "$1" "$2" 2>/dev/null || exit 12
entry "$2"
"""
)
"""``$1`` renamed to ``$2`` (its parents made), then `_ENTRY` of ``$2``; status 11: ``$2`` is
a directory (not moved into, unlike ``mv``)."""

_HTTP = {
    "invalid_argument": 400,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "failed_precondition": 400,
    "unavailable": 503,
    "internal": 500,
}
_STATUSES: Mapping[int, tuple[str, str]] = {
    _scripts.EXIT_NOT_FOUND: ("not_found", "no such file or directory"),
    _scripts.EXIT_NOT_A_DIRECTORY: ("not_found", "a parent is not a directory"),
    _scripts.EXIT_PERMISSION: ("permission_denied", "permission denied"),
    _scripts.EXIT_IS_DIRECTORY: ("already_exists", "a directory is already there"),
    _scripts.EXIT_NOT_REGULAR: ("invalid_argument", "not a directory"),
}
_FOUND_TYPES = {
    "f": stat.S_IFREG,
    "d": stat.S_IFDIR,
    "l": stat.S_IFLNK,
    "p": stat.S_IFIFO,
    "s": stat.S_IFSOCK,
    "c": stat.S_IFCHR,
    "b": stat.S_IFBLK,
}
"""``find -printf``'s ``%y`` letters, as file types."""
_TYPES = {stat.S_IFREG: "FILE_TYPE_FILE", stat.S_IFDIR: "FILE_TYPE_DIRECTORY", stat.S_IFLNK: "FILE_TYPE_SYMLINK"}


def _error(exc: ConnectError) -> Response:
    return JSONResponse({"code": exc.code, "message": exc.message}, _HTTP.get(exc.code, 500))


def _path(entry: Entry, message: dict[str, Any], field: str = "path") -> str:
    raw = message.get(field)
    if not isinstance(raw, str) or not raw:
        raise ConnectError("invalid_argument", f"{field} is required")
    absolute = raw if raw.startswith("/") else posixpath.join(entry.state.workdir or "/", raw)
    try:
        return normalize_path(absolute)
    except InvalidPathError as exc:
        raise ConnectError("invalid_argument", str(exc)) from exc


async def _run(
    request: Request, entry: Entry, script: str, args: tuple[str, ...], limit: int, native: str | None = None
) -> str:
    """The script's output on success (or its ``native`` op's, the exec helper's same answer
    without a process, where the sandbox's helper does it); its status as Connect's error about
    ``args[0]`` else."""
    call = Call(_scripts.command(script, *args), output_limit=limit, native=None if native is None else (native, *args))
    run = functools.partial(entry.sandbox.run_call, call)
    try:
        response: p.ExecuteResponse = await in_lane(request, entry, run)
    except ServiceError as exc:
        raise ConnectError("unavailable", exc.message) from exc
    if response.exit_code is None:
        raise ConnectError("unavailable", response.message or f"the sandbox did not answer: {response.error}")
    if response.exit_code != 0:
        code, why = _STATUSES.get(
            response.exit_code, ("internal", f"the sandbox's shell failed ({response.exit_code})")
        )
        raise ConnectError(code, f"{why}: {args[0]}")
    if response.truncated:
        raise ConnectError("failed_precondition", f"the answer about {args[0]} is larger than {limit} bytes")
    return response.output


def _entry(path: str, line: str, link: tuple[str, str] | None) -> dict[str, Any]:
    """envd's ``EntryInfo`` (proto JSON) from `_ENTRY`'s stat line and, for a symlink, the raw
    mode and path it resolves to: its type and permission bits are then its target's."""
    fields = line.split(" ")
    if len(fields) < 7:
        raise ConnectError("internal", f"the sandbox's stat of {path} is malformed")
    raw, size, mtime, uid, gid, owner, group = fields[:7]
    try:
        mode = _FOUND_TYPES[raw[1]] | int(raw[2:], 8) if raw.startswith("=") else int(raw, 16)
        length = int(size)
        modified = datetime.fromtimestamp(int(mtime.partition(".")[0]), UTC)
    except (ValueError, KeyError, IndexError, OverflowError, OSError) as exc:
        raise ConnectError("internal", f"the sandbox's stat of {path} is malformed") from exc
    info: dict[str, Any] = {
        "name": posixpath.basename(path) or "/",
        "type": _TYPES.get(stat.S_IFMT(mode), "FILE_TYPE_UNSPECIFIED"),
        "path": path,
        "size": str(length),
        "mode": stat.S_IMODE(mode),
        "permissions": stat.filemode(mode),
        "owner": uid if owner == "UNKNOWN" else owner,
        "group": gid if group == "UNKNOWN" else group,
        "modifiedTime": modified.isoformat().replace("+00:00", "Z"),
    }
    if link is not None and stat.S_ISLNK(mode):
        target_mode, target = link
        resolved = _raw_mode(target_mode)
        info["type"] = _TYPES.get(stat.S_IFMT(resolved), "FILE_TYPE_UNSPECIFIED")
        info["mode"] = stat.S_IMODE(resolved)
        info["symlinkTarget"] = target
    return info


def _raw_mode(text: str) -> int:
    """``stat``'s ``%f`` (hex), or 0 for anything else (``-``: the link resolves to nothing)."""
    try:
        return int(text, 16) if text.isascii() and text.isalnum() else 0
    except ValueError:
        return 0


def _one(path: str, output: str) -> dict[str, Any]:
    line, _, rest = output.partition("\n")
    target_mode, _, target = rest.partition("\n")
    return _entry(path, line, (target_mode, target[:-1] if target.endswith("\n") else target))


def _listing(root: str, output: str) -> list[dict[str, Any]]:
    """The entries in envd's order (its walk's): depth first, each directory's names sorted."""
    found = []
    for record in output.split("\0")[:-1]:
        line, _, relative = record.partition("\n")
        if relative.startswith("./"):
            found.append((relative[2:].split("/"), line))
    found.sort(key=lambda item: item[0])
    return [_entry(posixpath.join(root, *parts), line, None) for parts, line in found]


async def with_metadata(request: Request, entry: Entry, infos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``infos`` (envd's ``EntryInfo``s), each with its file's ``metadata`` where it has any."""
    if not infos:
        return infos
    call = get_call([info["path"] for info in infos])
    try:
        found = parsed(await in_lane(request, entry, functools.partial(entry.sandbox.run_call, call)))
    except ServiceError as exc:
        raise ConnectError("unavailable", exc.message) from exc
    for info in infos:
        if info["path"] in found:
            info["metadata"] = found[info["path"]]
    return infos


def _unary(handler: Any) -> Any:
    """``handler(request, entry, message)`` as a Connect unary route: the caller's access
    checked first, its `ConnectError` answered in Connect's shape."""

    async def route(request: Request) -> Response:
        entry = await access(request)
        try:
            return JSONResponse(await handler(request, entry, await unary_message(request)))
        except ConnectError as exc:
            return _error(exc)

    route.__name__, route.__doc__ = handler.__name__, handler.__doc__
    return route


async def entry_info(request: Request, entry: Entry, path: str) -> dict[str, Any]:
    """envd's ``EntryInfo`` of ``path`` (normalized, absolute), its metadata included."""
    info = _one(path, await _run(request, entry, STAT, (path,), ENTRY_OUTPUT_LIMIT))
    return (await with_metadata(request, entry, [info]))[0]


@router.post("/filesystem.Filesystem/Stat")
@_unary
async def stat_entry(request: Request, entry: Entry, message: dict[str, Any]) -> dict[str, Any]:
    return {"entry": await entry_info(request, entry, _path(entry, message))}


@router.post("/filesystem.Filesystem/ListDir")
@_unary
async def list_dir(request: Request, entry: Entry, message: dict[str, Any]) -> dict[str, Any]:
    """Entries down to ``depth`` (0: 1), the directory itself not among them."""
    path = _path(entry, message)
    depth = message.get("depth") or 1
    if not isinstance(depth, int) or depth < 1:
        raise ConnectError("invalid_argument", "depth must be a positive integer")
    output = await _run(request, entry, LIST, (path, str(min(depth, MAX_DEPTH))), LIST_OUTPUT_LIMIT, "list_dir")
    return {"entries": await with_metadata(request, entry, _listing(path, output))}


@router.post("/filesystem.Filesystem/MakeDir")
@_unary
async def make_dir(request: Request, entry: Entry, message: dict[str, Any]) -> dict[str, Any]:
    """The directory and its parents; ``already_exists`` if it is there (the SDK's ``False``)."""
    path = _path(entry, message)
    try:
        await _run(request, entry, MAKE_DIR, (path,), ENTRY_OUTPUT_LIMIT)
    except ConnectError as exc:
        if exc.code == "invalid_argument":
            raise ConnectError(exc.code, f"path already exists but it is not a directory: {path}") from None
        raise
    return {"entry": {"name": posixpath.basename(path), "type": "FILE_TYPE_DIRECTORY", "path": path}}


@router.post("/filesystem.Filesystem/Move")
@_unary
async def move(request: Request, entry: Entry, message: dict[str, Any]) -> dict[str, Any]:
    source, destination = _path(entry, message, "source"), _path(entry, message, "destination")
    output = await _run(request, entry, MOVE, (source, destination), ENTRY_OUTPUT_LIMIT)
    return {"entry": (await with_metadata(request, entry, [_one(destination, output)]))[0]}


@router.post("/filesystem.Filesystem/Remove")
@_unary
async def remove(request: Request, entry: Entry, message: dict[str, Any]) -> dict[str, Any]:
    """The file or the whole directory; a path already gone is no error (envd's ``RemoveAll``)."""
    path = _path(entry, message)
    if path == "/":
        raise ConnectError("invalid_argument", "refusing to remove the root directory")
    try:
        result: p.DeleteResult = await in_lane(request, entry, functools.partial(entry.sandbox.delete, path))
    except ServiceError as exc:
        raise ConnectError("unavailable", exc.message) from exc
    if result.error is not None and result.error != p.FILE_NOT_FOUND:
        code = "permission_denied" if result.error == p.PERMISSION_DENIED else "internal"
        raise ConnectError(code, result.message or f"{result.error}: {path}")
    return {}
