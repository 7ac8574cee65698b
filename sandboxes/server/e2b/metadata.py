"""E2B's file metadata (envd 0.6.2): an upload's ``X-Metadata-<key>`` headers kept as the files'
``user.e2b.<key>`` extended attributes, read back into each ``EntryInfo``'s ``metadata``. Both go
through the sandbox's exec helper (its ``e2b_metadata`` op, `sandboxes._helper._xattrs`), so every
backend with one has them; without one, a read finds none and a write is refused."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from sandboxes import _scripts
from sandboxes import protocol as p
from sandboxes.base import Call

__all__ = ["HEADER_PREFIX", "from_headers", "get_call", "parsed", "set_call", "set_failure"]

HEADER_PREFIX = "x-metadata-"
EXIT_NO_HELPER = 94
"""What the script answers in place of the op: nothing but the exec helper reads attributes."""
EXIT_UNSUPPORTED = 95
EXIT_REFUSED = 7
MAX_KEYS = 64
MAX_METADATA_BYTES = 64 << 10
"""The most an upload's metadata may hold (keys and values together)."""
OUTPUT_LIMIT = 16 << 20
"""What a metadata read may send back (as a listing may)."""
_NO_HELPER = f"exit {EXIT_NO_HELPER}\n"


def from_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The metadata an upload's headers carry, keys lowercased; `ValueError` past the bounds."""
    found = {name.lower()[len(HEADER_PREFIX) :]: value for name, value in headers.items() if _is_metadata(name)}
    if len(found) > MAX_KEYS or sum(len(key) + len(value) for key, value in found.items()) > MAX_METADATA_BYTES:
        raise ValueError(f"file metadata is limited to {MAX_KEYS} keys and {MAX_METADATA_BYTES} bytes")
    if any(not key or "\0" in key or "\0" in value for key, value in found.items()):
        raise ValueError("an empty metadata key, or one holding a NUL byte")
    return found


def _is_metadata(name: str) -> bool:
    return name.lower().startswith(HEADER_PREFIX)


def get_call(paths: Sequence[str]) -> Call:
    """Reads the metadata of ``paths`` (absolute); `parsed` reads its answer."""
    return Call(_scripts.command(_NO_HELPER), output_limit=OUTPUT_LIMIT, native=("e2b_metadata", "get", *paths))


def set_call(paths: Sequence[str], metadata: Mapping[str, str]) -> Call:
    """Replaces the metadata of ``paths`` by ``metadata``; `set_failure` reads its answer."""
    pairs = [part for pair in metadata.items() for part in pair]
    native = ("e2b_metadata", "set", str(len(paths)), *paths, *pairs)
    return Call(_scripts.command(_NO_HELPER), output_limit=4096, idempotent=True, native=native)


def parsed(response: p.ExecuteResponse) -> dict[str, dict[str, str]]:
    """Each path's metadata from a `get_call`'s answer (none for a sandbox without a helper)."""
    if response.exit_code != 0 or response.truncated:
        return {}
    try:
        found = json.loads(response.output or "{}")
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    return {
        path: {str(key): str(value) for key, value in pairs.items()}
        for path, pairs in found.items()
        if isinstance(path, str) and isinstance(pairs, dict)
    }


def set_failure(response: p.ExecuteResponse, path: str) -> tuple[p.ErrorCode, str] | None:
    """Why a `set_call` failed (an error code and a sentence), or ``None`` if it did not."""
    code = response.exit_code
    if code == 0:
        return None
    if code == EXIT_UNSUPPORTED:
        return (
            p.INVALID_ARGUMENT,
            f"the sandbox's filesystem at {path} keeps no user extended attributes (file metadata)",
        )
    if code == EXIT_NO_HELPER:
        return p.UNAVAILABLE, "file metadata needs the sandbox's exec helper, which this sandbox does not run"
    if code == EXIT_REFUSED:
        return p.INVALID_ARGUMENT, f"the sandbox's filesystem refused the metadata of {path} (a key or value too long)"
    if code == _scripts.EXIT_NOT_FOUND:
        return p.FILE_NOT_FOUND, f"{path} is gone"
    if code is None:
        return p.UNAVAILABLE, response.message or "the sandbox did not answer"
    return p.PERMISSION_DENIED, f"the metadata of {path} could not be set"
