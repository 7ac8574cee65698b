"""The protocol subcommands (exec, ls, read, write, grep, glob): one protocol call each, the
same code for a local sandbox and a remote one, since both are a `SandboxBackendProtocol`."""

from __future__ import annotations

import argparse
import base64
import shlex
import sys
from typing import Any

from sandboxes import protocol as p
from sandboxes.cli._common import EXIT_ERROR, EXIT_TIMEOUT, Failed, Session, Usage, check, emit_json, note, out
from sandboxes.semantics import message_for


def cmd_exec(args: argparse.Namespace, session: Session) -> int:
    words: list[str] = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not words:
        raise Usage("exec: a command is required")
    command = words[0] if len(words) == 1 else shlex.join(words)
    stdin = sys.stdin.buffer.read() if args.stdin else None
    cwd = session.path(args.cwd) if args.cwd is not None else None
    env = dict(args.env) if args.env else None
    options: dict[str, Any] = {"timeout": args.timeout, "cwd": cwd, "stdin": stdin, "env": env}
    if args.json:
        response = session.backend.execute(command, **options)
        emit_json(response)
    else:
        response = _run_printing(session, command, options)
        if response.truncated:
            note("sandboxes: output truncated (head and tail kept)")
    if response.error == p.TIMEOUT:
        note(f"error: {p.TIMEOUT}: {response.message}")
        return EXIT_TIMEOUT
    if response.error is not None:
        raise Failed(response.error, response.message or message_for(response.error))
    return response.exit_code if response.exit_code is not None else EXIT_ERROR


def _run_printing(session: Session, command: str, options: dict[str, Any]) -> p.ExecuteResponse:
    """Print the output as it comes when the backend can stream it (a remote sandbox: a long
    command shows progress over the network), its stderr to stderr; else all at once, merged."""
    stream = getattr(session.backend, "execute_stream", None)
    if stream is None:
        response = session.backend.execute(command, **options)
        out(response.output)
        return response
    for event in stream(command, **options):
        if isinstance(event, p.ExecuteResponse):
            return event
        out(event, sys.stderr if getattr(event, "stream", None) == "stderr" else None)
    raise Failed(p.CONNECTION_LOST, "the output stream ended without the command's exit")  # pragma: no cover


def cmd_ls(args: argparse.Namespace, session: Session) -> int:
    result = check(args, session.backend.ls(session.path(args.path)))
    if not args.json:
        for entry in result.entries or []:
            size = "-" if entry.size is None else str(entry.size)
            line = f"{size:>10}  {entry.modified_at or '-':<25}  {entry.path}" if args.long else entry.path
            out(line + "\n")
    return 0


def cmd_read(args: argparse.Namespace, session: Session) -> int:
    path = session.path(args.path)
    result = session.backend.read(path, offset=args.offset, limit=args.limit)
    data = result.file_data
    if data is not None and data.encoding == "base64" and not args.base64 and not args.json:
        size = len(base64.b64decode(data.content))
        raise Failed(p.NOT_A_TEXT_FILE, message_for(p.NOT_A_TEXT_FILE, path, f"{size} bytes; use --base64"))
    check(args, result)
    if args.json or data is None:
        return 0
    if args.base64:
        encoded = data.content if data.encoding == "base64" else base64.b64encode(data.content.encode()).decode()
        out(encoded + "\n")
        return 0
    out(data.content)
    if result.next_offset is not None:
        note(
            f"sandboxes: showing lines {result.start_line}-{result.end_line} of {result.total_lines}; "
            f"continue with --offset {result.next_offset}"
        )
    return 0


def cmd_write(args: argparse.Namespace, session: Session) -> int:
    if args.content is not None:
        content = args.content
    else:
        try:
            content = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Failed(p.INVALID_ARGUMENT, f"content on stdin is not UTF-8 text: {exc}") from exc
    check(args, session.backend.write(session.path(args.path), content))
    return 0


def cmd_grep(args: argparse.Namespace, session: Session) -> int:
    result = session.backend.grep(args.pattern, session.path(args.path), args.glob, max_count=args.max_count)
    check(args, result)
    if not args.json:
        out("".join(f"{m.path}:{m.line}:{m.text}\n" for m in result.matches or []))
        if result.truncated:
            note(f"sandboxes: results truncated after {len(result.matches or [])} matches")
    return 0


def cmd_glob(args: argparse.Namespace, session: Session) -> int:
    result = check(args, session.backend.glob(args.pattern, session.path(args.path)))
    if not args.json:
        out("".join(f"{m.path}\n" for m in result.matches or []))
        if result.truncated:
            note("sandboxes: results truncated")
    return 0
