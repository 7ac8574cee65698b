"""Virtual path rules shared by every backend.

Every path entering a backend passes through `normalize_path` first, so a path that one
backend refuses is refused by all of them with the same code, before any I/O happens.
"""

from __future__ import annotations

import re

from sandboxes.protocol import INVALID_PATH

_DRIVE_LETTER = re.compile(r"^[A-Za-z]:")
MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
"""Linux's NAME_MAX: refused up front so that every backend, in memory or on disk, agrees."""


class InvalidPathError(ValueError):
    """A path the protocol refuses; ``code`` is always ``invalid_path``."""

    code = INVALID_PATH


def normalize_path(path: object) -> str:
    """Return the canonical form of an absolute virtual path, or raise `InvalidPathError`.

    Canonical means: starts with ``/``, no empty or ``.`` components, no trailing slash (except
    the root itself). ``..`` is refused rather than resolved, because resolving it lexically
    would let ``/workspace/../etc`` look like it is under ``/workspace`` to a caller that checks
    prefixes before normalising.
    """
    if not isinstance(path, str) or not path:
        raise InvalidPathError(f"path must be a non-empty string, got {path!r}")
    if "\x00" in path:
        raise InvalidPathError("path contains a NUL byte")
    if path.startswith("~"):
        raise InvalidPathError(f"home-relative paths are not allowed: {path!r}")
    if _DRIVE_LETTER.match(path):  # a backslash elsewhere is an ordinary POSIX name character
        raise InvalidPathError(f"Windows paths are not supported: {path!r}")
    if not path.startswith("/"):
        raise InvalidPathError(f"path must be absolute (start with '/'): {path!r}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidPathError(f"'..' is not allowed in paths: {path!r}")
    if any(len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES for part in parts):
        raise InvalidPathError(f"a path component is longer than {MAX_NAME_BYTES} bytes: {path!r}")
    normalized = "/" + "/".join(parts)
    if len(normalized.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise InvalidPathError(f"path longer than {MAX_PATH_BYTES} bytes")
    return normalized


def is_within(path: str, root: str) -> bool:
    """Whether normalised ``path`` is ``root`` or lies below it (component-wise, not by string)."""
    return root == "/" or path == root or path.startswith(root + "/")


def join(root: str, relative: str) -> str:
    """Join a normalised root and a relative path without doubling the slash."""
    relative = relative.lstrip("/")
    if not relative:
        return root
    return f"{root.rstrip('/')}/{relative}"


def parent(path: str) -> str:
    head = path.rsplit("/", 1)[0]
    return head or "/"


def relative_to(path: str, root: str) -> str:
    """``path`` relative to ``root``; a file searched as its own root is its basename."""
    if path == root:
        return path.rsplit("/", 1)[-1]
    if root == "/":
        return path[1:]
    return path[len(root) + 1 :]
