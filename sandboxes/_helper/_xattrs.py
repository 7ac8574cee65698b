"""Native ``e2b_metadata`` in the exec helper: E2B's file metadata, kept as the files' ``user.e2b.*``
extended attributes, as envd keeps it (shipped with the request: stdlib only, Python
3.6-compatible).

``["e2b_metadata", "get", PATH...]``: exit 0 and a JSON object (ASCII) naming each path that has
any, its keys (the attribute names past the prefix) and values (UTF-8, invalid bytes replaced);
a path gone, or on a filesystem without user attributes, has none.
``["e2b_metadata", "set", N, PATH_1..PATH_N, KEY, VALUE, ...]``: each path's ``user.e2b.*``
replaced by the pairs (links followed); exit 0, `EXIT_UNSUPPORTED` where the filesystem keeps no
user attributes, 7 for a name or value the kernel refuses (too long), the script's ``why`` codes
for a path that is not there, 12 for any other refusal.
"""

import errno
import json
import os

from ._native import _why

METADATA_OPS = ["e2b_metadata"]
PREFIX = "user.e2b."
EXIT_UNSUPPORTED = 95
EXIT_REFUSED = 7
_UNSUPPORTED = (errno.ENOTSUP, errno.EOPNOTSUPP)
MAX_PATHS = 100000


def metadata(op: "list[str]") -> "tuple[int, bytes]":
    """``(exit code, output)`` of ``op`` (see the module's docstring); ValueError when malformed."""
    if len(op) < 2 or op[1] not in ("get", "set"):
        raise ValueError("wrong arguments for e2b_metadata")
    if op[1] == "get":
        paths = op[2:]
        if len(paths) > MAX_PATHS or not all(path.startswith("/") and "\0" not in path for path in paths):
            raise ValueError("bad paths")
        found = {}
        for path in paths:
            kept = _read(path)
            if kept:
                found[path] = kept
        return 0, json.dumps(found, sort_keys=True).encode("ascii")
    if len(op) < 3 or not op[2].isdigit():
        raise ValueError("wrong arguments for e2b_metadata set")
    count = int(op[2])
    paths, rest = op[3 : 3 + count], op[3 + count :]
    if len(paths) != count or len(rest) % 2 or not all(p.startswith("/") and "\0" not in p for p in paths):
        raise ValueError("wrong arguments for e2b_metadata set")
    wanted = [(rest[i], rest[i + 1]) for i in range(0, len(rest), 2)]
    for path in paths:
        code = _write(path, wanted)
        if code:
            return code, b""
    return 0, b""


def _read(path: str) -> "dict[str, str]":
    try:
        names = [name for name in os.listxattr(path) if name.startswith(PREFIX)]
    except OSError:
        return {}
    pairs = {}
    for name in names:
        try:
            pairs[name[len(PREFIX) :]] = os.getxattr(path, name).decode("utf-8", "replace")
        except OSError:  # removed meanwhile
            continue
    return pairs


def _write(path: str, pairs: "list[tuple[str, str]]") -> int:
    try:
        for name in os.listxattr(path):
            if name.startswith(PREFIX):
                os.removexattr(path, name)
        for key, value in pairs:
            os.setxattr(path, PREFIX + key, value.encode("utf-8"))
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return EXIT_UNSUPPORTED
        if exc.errno in (errno.ERANGE, errno.E2BIG, errno.ENOSPC, errno.EINVAL):
            return EXIT_REFUSED
        if exc.errno == errno.ENOENT:
            return _why(path)
        return 12
    return 0
