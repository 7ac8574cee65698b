"""What every subcommand shares: the open backend, the two ways to fail, and output that works
whatever the locale."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from sandboxes import protocol as p
from sandboxes.semantics import message_for

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 124


@dataclasses.dataclass(frozen=True, slots=True)
class Session:
    """An open backend and the directory relative command-line paths are resolved against: the
    root of a local sandbox, or a remote sandbox's workdir."""

    backend: p.SandboxBackendProtocol
    base: str
    remote: bool = False

    def path(self, raw: str | None) -> str:
        """Relative paths are a convenience for humans typing; absolute ones pass untouched, so
        the backend (not the CLI) decides what is valid. The empty string is passed on as-is for
        the backend to refuse."""
        if raw is None:
            return self.base
        if raw == "" or raw.startswith("/"):
            return raw
        return f"{self.base.rstrip('/')}/{raw}"


class Failed(Exception):
    """An error to report as ``error: <code>: <message>``; raised so every subcommand exits
    through one place."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Usage(Exception):
    """A usage error found after parsing; exits 2 like argparse's own."""


def out(text: str, stream: Any = None) -> None:
    """Write text whatever the locale; paths may carry undecodable bytes as surrogates."""
    stream = stream or sys.stdout
    if not hasattr(stream, "buffer"):  # an in-memory stream (tests calling main() directly)
        stream.write(text)
        return
    stream.flush()
    try:
        data = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        data = text.encode("utf-8", "backslashreplace")
    stream.buffer.write(data)
    stream.buffer.flush()


def note(text: str) -> None:
    out(text + "\n", sys.stderr)


def emit_json(result: Any) -> None:
    """A protocol dataclass or a wire model as indented JSON (ASCII only: always valid UTF-8,
    even for paths with undecodable bytes)."""
    if hasattr(result, "model_dump"):
        data = result.model_dump(mode="json")
    elif isinstance(result, list):
        data = [item.model_dump(mode="json") if hasattr(item, "model_dump") else item for item in result]
    else:
        data = dataclasses.asdict(result)
    out(json.dumps(data, indent=2, default=str) + "\n")


def check(args: argparse.Namespace, result: Any) -> Any:
    """Print the JSON form if asked, then turn a reported error into `Failed`."""
    if args.json:
        emit_json(result)
    if result.error is not None:
        raise Failed(result.error, result.message or message_for(result.error))
    return result


def non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value
