"""The Connect protocol's framing with the JSON codec, as the E2B SDK speaks it over HTTP/1.1:
a streaming call's request and each of its answers is an envelope (one flag byte, a 4-byte
big-endian length, the JSON message); the last envelope has flag 0x02 and carries ``{}`` or
``{"error": {"code", "message"}}``."""

from __future__ import annotations

import json
import struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import Request

__all__ = [
    "HTTP_STATUS",
    "ConnectError",
    "end_of_stream",
    "envelope",
    "json_object",
    "parse_message",
    "read_envelope",
    "unary_message",
    "unary_message_or_empty",
]

_HEADER = struct.Struct(">BI")
_COMPRESSED = 0x01
_END_STREAM = 0x02
STREAM_MEDIA_TYPE = "application/connect+json"

HTTP_STATUS = {
    "invalid_argument": 400,
    "failed_precondition": 400,
    "not_found": 404,
    "resource_exhausted": 429,
    "unimplemented": 501,
    "unavailable": 503,
    "deadline_exceeded": 504,
}
"""The HTTP status of a unary call that fails with a Connect code (Connect's own mapping)."""


class ConnectError(Exception):
    """A failure answered as Connect's end-of-stream error, with one of its codes."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode("utf-8")
    return _HEADER.pack(flags, len(data)) + data


def end_of_stream(error: ConnectError | None = None) -> bytes:
    body: dict[str, Any] = {} if error is None else {"error": {"code": error.code, "message": error.message}}
    return envelope(body, _END_STREAM)


def read_envelope(body: bytes) -> dict[str, Any]:
    """The one message of a server-streaming call's request body."""
    if len(body) < _HEADER.size:
        raise ConnectError("invalid_argument", "the request is not a Connect envelope")
    flags, length = _HEADER.unpack_from(body)
    if length != len(body) - _HEADER.size:
        raise ConnectError("invalid_argument", "the envelope's length does not match the request body")
    return parse_message(flags, body[_HEADER.size :])


def parse_message(flags: int, data: bytes) -> dict[str, Any]:
    """One envelope's JSON message (its ``flags`` and the bytes after its header)."""
    if flags & _COMPRESSED:
        raise ConnectError("unimplemented", "compressed messages are not supported")
    return json_object(data)


async def unary_message(request: Request) -> dict[str, Any]:
    """A unary call's message: its request's body, a JSON object (none: ``{}``)."""
    return json_object(await request.body() or b"{}")


async def unary_message_or_empty(request: Request) -> dict[str, Any]:
    """A unary call's message, or ``{}`` when its body is not a JSON object: for a call whose
    handler says itself which field is missing or wrong."""
    try:
        message = json.loads(await request.body() or b"{}")
    except (UnicodeDecodeError, ValueError):
        message = None
    return message if isinstance(message, dict) else {}


def json_object(data: bytes) -> dict[str, Any]:
    """``data`` as a JSON object; `ConnectError` ``invalid_argument`` if it is not one."""
    try:
        message = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConnectError("invalid_argument", "the message is not JSON") from exc
    if not isinstance(message, dict):
        raise ConnectError("invalid_argument", "the message is not a JSON object")
    return message
