"""``sandboxes``: the backend protocol from a shell.

Every subcommand is one protocol call, so the CLI doubles as a way to poke at a backend by hand
and to script against it: human output by default, the result dataclass as JSON with ``--json``.
Exit status: 0 on success, 1 when the backend reports an error (``error: <code>: <message>`` on
stderr), 2 for usage errors; ``exec`` exits with the command's own status (124 on timeout, as
coreutils' ``timeout`` does).

Only the local backend exists today. Backends are chosen in `_open_backend`; a new one adds a
``--backend`` choice and a branch there, and every subcommand works with it unchanged.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import json
import os
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sandboxes import protocol as p
from sandboxes.semantics import message_for

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 124
BACKENDS = ("local",)


@dataclasses.dataclass(frozen=True, slots=True)
class _Session:
    """An open backend and the directory relative command-line paths are resolved against."""

    backend: p.SandboxBackendProtocol
    base: str

    def path(self, raw: str | None) -> str:
        """Relative paths are a convenience for humans typing; absolute ones pass untouched, so
        the backend (not the CLI) decides what is valid. The empty string is passed on as-is for
        the backend to refuse."""
        if raw is None:
            return self.base
        if raw == "" or raw.startswith("/"):
            return raw
        return f"{self.base.rstrip('/')}/{raw}"


class _Failed(Exception):
    """A protocol error to report; raised so every subcommand exits through one place."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Usage(Exception):
    """A usage error found after parsing; exits 2 like argparse's own."""


@contextlib.contextmanager
def _open_backend(args: argparse.Namespace) -> Iterator[_Session]:
    """The single place that knows which backends exist and how to build them."""
    if args.backend != "local":  # unreachable through argparse; guards future choices
        raise _Failed(p.INVALID_ARGUMENT, f"unknown backend {args.backend!r}")
    from sandboxes.local import LocalSandbox

    root = Path(args.root or os.environ.get("SANDBOXES_ROOT") or os.getcwd())
    # LocalSandbox would create a missing root; from a shell that is usually a typo.
    if not root.is_dir():
        raise _Failed(p.FILE_NOT_FOUND, message_for(p.FILE_NOT_FOUND, str(root), "root directory does not exist"))
    sandbox = LocalSandbox(root)
    try:
        yield _Session(sandbox, str(sandbox.root))
    finally:
        sandbox.close()


# --------------------------------------------------------------------------- output


def _out(text: str, stream: Any = None) -> None:
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


def _note(text: str) -> None:
    _out(text + "\n", sys.stderr)


def _emit_json(result: Any) -> None:
    """ASCII-only JSON: always valid UTF-8, even for paths with undecodable bytes."""
    _out(json.dumps(dataclasses.asdict(result), indent=2, default=str) + "\n")


def _check(args: argparse.Namespace, result: Any) -> Any:
    """Print the JSON form if asked, then turn a reported error into `_Failed`."""
    if args.json:
        _emit_json(result)
    if result.error is not None:
        raise _Failed(result.error, result.message or message_for(result.error))
    return result


# --------------------------------------------------------------------------- subcommands


def _cmd_exec(args: argparse.Namespace, session: _Session) -> int:
    words: list[str] = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not words:
        raise _Usage("exec: a command is required")
    command = words[0] if len(words) == 1 else shlex.join(words)
    stdin = sys.stdin.buffer.read() if args.stdin else None
    cwd = session.path(args.cwd) if args.cwd is not None else None
    response = session.backend.execute(command, timeout=args.timeout, cwd=cwd, stdin=stdin)
    if args.json:
        _emit_json(response)
    else:
        _out(response.output)
        if response.truncated:
            _note("sandboxes: output truncated (head and tail kept)")
    if response.error == p.TIMEOUT:
        _note(f"error: {p.TIMEOUT}: {response.message}")
        return EXIT_TIMEOUT
    if response.error is not None:
        raise _Failed(response.error, response.message or message_for(response.error))
    return response.exit_code if response.exit_code is not None else EXIT_ERROR


def _cmd_ls(args: argparse.Namespace, session: _Session) -> int:
    result = _check(args, session.backend.ls(session.path(args.path)))
    if not args.json:
        for entry in result.entries or []:
            size = "-" if entry.size is None else str(entry.size)
            line = f"{size:>10}  {entry.modified_at or '-':<25}  {entry.path}" if args.long else entry.path
            _out(line + "\n")
    return 0


def _cmd_read(args: argparse.Namespace, session: _Session) -> int:
    path = session.path(args.path)
    result = session.backend.read(path, offset=args.offset, limit=args.limit)
    data = result.file_data
    if data is not None and data.encoding == "base64" and not args.base64 and not args.json:
        size = len(base64.b64decode(data.content))
        raise _Failed(p.NOT_A_TEXT_FILE, message_for(p.NOT_A_TEXT_FILE, path, f"{size} bytes; use --base64"))
    _check(args, result)
    if args.json or data is None:
        return 0
    if args.base64:
        encoded = data.content if data.encoding == "base64" else base64.b64encode(data.content.encode()).decode()
        _out(encoded + "\n")
        return 0
    _out(data.content)
    if result.next_offset is not None:
        _note(
            f"sandboxes: showing lines {result.start_line}-{result.end_line} of {result.total_lines}; "
            f"continue with --offset {result.next_offset}"
        )
    return 0


def _cmd_write(args: argparse.Namespace, session: _Session) -> int:
    if args.content is not None:
        content = args.content
    else:
        try:
            content = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Failed(p.INVALID_ARGUMENT, f"content on stdin is not UTF-8 text: {exc}") from exc
    _check(args, session.backend.write(session.path(args.path), content))
    return 0


def _cmd_grep(args: argparse.Namespace, session: _Session) -> int:
    result = session.backend.grep(args.pattern, session.path(args.path), args.glob, max_count=args.max_count)
    _check(args, result)
    if not args.json:
        _out("".join(f"{m.path}:{m.line}:{m.text}\n" for m in result.matches or []))
        if result.truncated:
            _note(f"sandboxes: results truncated after {len(result.matches or [])} matches")
    return 0


def _cmd_glob(args: argparse.Namespace, session: _Session) -> int:
    result = _check(args, session.backend.glob(args.pattern, session.path(args.path)))
    if not args.json:
        _out("".join(f"{m.path}\n" for m in result.matches or []))
        if result.truncated:
            _note("sandboxes: results truncated")
    return 0


# --------------------------------------------------------------------------- parsing


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    # Common options are accepted before or after the subcommand; SUPPRESS keeps a subparser's
    # default from overwriting a value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--root",
        default=argparse.SUPPRESS,
        help="sandbox root directory (default: $SANDBOXES_ROOT or the current directory)",
    )
    common.add_argument("--backend", choices=BACKENDS, default=argparse.SUPPRESS, help="backend (default: local)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the result as JSON")
    parser = argparse.ArgumentParser(
        prog="sandboxes", parents=[common], description="The sandbox backend protocol from a shell."
    )
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")

    def add(name: str, handler: Callable[[argparse.Namespace, _Session], int], text: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, parents=[common], help=text, description=text)
        cmd.set_defaults(handler=handler)
        return cmd

    cmd = add(
        "exec",
        _cmd_exec,
        "run a command in the sandbox; one argument is a shell command line, several are an argv (quoted for you)",
    )
    cmd.add_argument("--timeout", type=_non_negative, default=None, help="seconds (default: the backend's; 0: none)")
    cmd.add_argument("--cwd", default=None, help="working directory (default: the root)")
    cmd.add_argument("--stdin", action="store_true", help="forward this process's stdin to the command")
    cmd.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="CMD", help="the command; exec's options go before it"
    )
    cmd = add("ls", _cmd_ls, "list a directory")
    cmd.add_argument("path", nargs="?", metavar="PATH")
    cmd.add_argument("-l", "--long", action="store_true", help="show size and modification time")
    cmd = add("read", _cmd_read, "print a file (text; binary only with --base64)")
    cmd.add_argument("path", metavar="PATH")
    cmd.add_argument("--offset", type=int, default=0, help="0-based first line")
    cmd.add_argument("--limit", type=int, default=2000, help="number of lines")
    cmd.add_argument("--base64", action="store_true", help="print the content base64-encoded (needed for binary)")
    cmd = add("write", _cmd_write, "write a text file from stdin or --content")
    cmd.add_argument("path", metavar="PATH")
    cmd.add_argument("--content", default=None, help="the text to write (default: read stdin)")
    cmd = add("grep", _cmd_grep, "search files for a literal string; prints path:line:text")
    cmd.add_argument("pattern", metavar="PATTERN")
    cmd.add_argument("path", nargs="?", metavar="PATH")
    cmd.add_argument("--glob", default=None, help="only files matching this glob")
    cmd.add_argument("--max-count", type=int, default=None, help="stop after this many matches in total")
    cmd = add("glob", _cmd_glob, "list files matching a glob pattern")
    cmd.add_argument("pattern", metavar="PATTERN")
    cmd.add_argument("path", nargs="?", metavar="PATH")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    for name, default in (("root", None), ("backend", "local"), ("json", False)):
        if not hasattr(args, name):
            setattr(args, name, default)
    try:
        with _open_backend(args) as session:
            code: int = args.handler(args, session)
            return code
    except _Usage as exc:
        parser.print_usage(sys.stderr)
        _note(f"sandboxes: error: {exc}")
        return EXIT_USAGE
    except _Failed as exc:
        _note(f"error: {exc.code}: {exc.message}")
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # A backend raises only when it cannot be reached or has a bug; say so in one line
        # unless asked for the traceback.
        if os.environ.get("SANDBOXES_DEBUG"):
            raise
        _note(f"error: {p.BACKEND_ERROR}: {type(exc).__name__}: {exc}")
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
