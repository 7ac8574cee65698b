"""``sandboxes``: the backend protocol from a shell, locally or against a sandbox service.

Every protocol subcommand (exec, ls, read, write, grep, glob) is one protocol call, so the CLI
doubles as a way to poke at a backend by hand and to script against it: human output by
default, the result as JSON with ``--json``. The same code serves a local sandbox (`LocalSandbox`
rooted at ``--root``) and a remote one (``--sandbox ID`` of the service at ``--url``): both are
a `SandboxBackendProtocol`.

Mode: ``--url`` or ``--sandbox`` means the service, ``--root`` a local sandbox; with neither,
``SANDBOXES_URL`` in the environment means the service, else local. ``create``, ``rm``, ``cp``
and ``mcp`` (an MCP server on stdio) only exist against a service; ``serve`` runs one.

Exit status: 0 on success, 1 when the backend or the service reports an error (``error: <code>:
<message>`` on stderr), 2 for usage errors; ``exec`` exits with the command's own status (124 on
timeout, as coreutils' ``timeout`` does).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sandboxes import protocol as p
from sandboxes.cli import commands
from sandboxes.cli._common import (
    EXIT_ERROR,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    Failed,
    Session,
    Usage,
    key_value,
    non_negative,
    note,
)
from sandboxes.cli._state_args import add_state_commands
from sandboxes.semantics import message_for

__all__ = ["BACKENDS", "EXIT_ERROR", "EXIT_TIMEOUT", "EXIT_USAGE", "main"]

BACKENDS = ("local",)
_COMMON_DEFAULTS: dict[str, Any] = {
    "root": None,
    "backend": "local",
    "json": False,
    "url": None,
    "api_key": None,
    "sandbox": None,
}


@contextlib.contextmanager
def _open_local(args: argparse.Namespace) -> Iterator[Session]:
    """The single place that knows which local backends exist and how to build them."""
    if args.backend != "local":  # unreachable through argparse; guards future choices
        raise Failed(p.INVALID_ARGUMENT, f"unknown backend {args.backend!r}")
    from sandboxes.local import LocalSandbox

    root = Path(args.root or os.environ.get("SANDBOXES_ROOT") or os.getcwd())
    # LocalSandbox would create a missing root; from a shell that is usually a typo.
    if not root.is_dir():
        raise Failed(p.FILE_NOT_FOUND, message_for(p.FILE_NOT_FOUND, str(root), "root directory does not exist"))
    sandbox = LocalSandbox(root)
    try:
        yield Session(sandbox, str(sandbox.root))
    finally:
        sandbox.close()


def _is_remote(args: argparse.Namespace) -> bool:
    explicit = args.url is not None or args.sandbox is not None
    if explicit and args.root is not None:
        raise Usage("--root is for a local sandbox; --url and --sandbox for the service's: give one or the other")
    return explicit or (args.root is None and bool(os.environ.get("SANDBOXES_URL")))


_NEVER_USED_HERE = ("httpx._main", "h2", "tornado")
"""Optional imports of the client's dependencies that a remote subcommand never uses, each
made only because it succeeds: httpx's command-line tool (click, rich, pygments), HTTP/2 for
httpcore (the client speaks HTTP/1.1), tenacity's Tornado support."""


def _skip_httpx_cli() -> None:
    """Keep the client's dependencies from importing what a remote subcommand never uses
    (`_NEVER_USED_HERE`: a large share of its start), by making those imports fail. Only in
    this process's CLI run, and only for modules not imported yet."""
    for name in _NEVER_USED_HERE:
        if name.split(".")[0] not in sys.modules:
            sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def _dispatch(args: argparse.Namespace) -> int:
    code: int
    if args.kind == "local-or-remote" and not _is_remote(args):
        with _open_local(args) as session:
            code = args.handler(args, session)
            return code
    if args.root is not None:
        raise Usage(f"{args.subcommand}: works against a sandbox service; --root is for local sandboxes")
    _skip_httpx_cli()
    if args.kind == "local-or-remote" or args.subcommand == "process":
        light = _dispatch_light(args)
        if light is not None:
            return light
    try:
        from sandboxes.cli import remote
    except ImportError as exc:
        raise _no_server_extra(exc) from exc
    if args.kind == "cp":
        return remote.cmd_cp(args)
    if args.kind == "ports":
        return remote.cmd_ports_forward(args)
    if args.kind == "mcp":
        return remote.cmd_mcp(args)
    if args.kind == "service":
        with remote.connect(args) as client:
            code = args.handler(args, client)
            return code
    if args.sandbox is None:
        if args.subcommand == "ls" and args.path is None:
            with remote.connect(args) as client:
                return remote.cmd_list(args, client)
        raise Usage(f"{args.subcommand}: which sandbox? --sandbox ID (`sandboxes create` makes one)")
    with remote.open_sandbox(args, args.sandbox) as session:
        code = args.handler(args, session)
        return code


def _no_server_extra(exc: ImportError) -> Failed:
    return Failed(p.BACKEND_ERROR, f"the service needs the server extra (pip install 'sandboxes[server]'): {exc}")


def _dispatch_light(args: argparse.Namespace) -> int | None:
    """A protocol subcommand against a sandbox, or the plain list of sandboxes, through the
    light path (`sandboxes.cli._fast`); ``None`` for what only the client does."""
    listing = args.sandbox is None and args.subcommand == "ls" and args.path is None and not args.json
    process = args.subcommand == "process"
    if args.sandbox is None and not listing and not process:
        return None
    try:
        from sandboxes.cli import _fast
    except ImportError as exc:
        raise _no_server_extra(exc) from exc
    if process:
        with _fast.connect(args) as connection:
            code: int = args.handler(args, _fast.LightClient(connection))
            return code
    if listing:
        with _fast.connect(args) as connection:
            return _fast.cmd_list(args, connection)
    with _fast.open_sandbox(args, args.sandbox) as session:
        code = args.handler(args, session)
        return code


def _serve(argv: list[str]) -> int:
    try:
        from sandboxes.server.__main__ import serve
    except ImportError as exc:
        note(f"sandboxes serve: needs the server extra (pip install 'sandboxes[server]'): {exc}")
        return EXIT_ERROR
    return serve(argv)


# --------------------------------------------------------------------------- parsing


def _parser() -> argparse.ArgumentParser:
    # Common options are accepted before or after the subcommand; SUPPRESS keeps a subparser's
    # default from overwriting a value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--root",
        default=argparse.SUPPRESS,
        help="local sandbox root directory (default: $SANDBOXES_ROOT or the current directory)",
    )
    common.add_argument("--backend", choices=BACKENDS, default=argparse.SUPPRESS, help="local backend (default: local)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the result as JSON")
    common.add_argument("--url", default=argparse.SUPPRESS, help="sandbox service to use (default: $SANDBOXES_URL)")
    common.add_argument(
        "--api-key", default=argparse.SUPPRESS, help="the service's API key (default: $SANDBOXES_API_KEY)"
    )
    common.add_argument("--sandbox", metavar="ID", default=argparse.SUPPRESS, help="the service's sandbox to act on")
    parser = argparse.ArgumentParser(
        prog="sandboxes",
        parents=[common],
        description="Sandboxes from a shell: a local sandbox (--root) or a sandbox service's (--url, --sandbox).",
    )
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")

    def add(name: str, handler: Callable[..., int] | None, text: str, kind: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, parents=[common], help=text, description=text)
        cmd.set_defaults(handler=handler, kind=kind)
        return cmd

    sub.add_parser(
        "serve", help="run the sandbox service (`sandboxes serve --help`: its options)", add_help=False
    ).add_argument("options", nargs=argparse.REMAINDER)

    cmd = add(
        "exec",
        commands.cmd_exec,
        "run a command in the sandbox; one argument is a shell command line, several are an argv (quoted for you)",
        "local-or-remote",
    )
    cmd.add_argument("--timeout", type=non_negative, default=None, help="seconds (default: the backend's; 0: none)")
    cmd.add_argument("--cwd", default=None, help="working directory (default: the root, or the sandbox's workdir)")
    cmd.add_argument("--stdin", action="store_true", help="forward this process's stdin to the command")
    cmd.add_argument("--env", type=key_value, action="append", default=[], metavar="K=V", help="environment variable")
    cmd.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="CMD", help="the command; exec's options go before it"
    )
    cmd = add("ls", commands.cmd_ls, "list a directory (of a service, no --sandbox: its sandboxes)", "local-or-remote")
    cmd.add_argument("path", nargs="?", metavar="PATH")
    cmd.add_argument("-l", "--long", action="store_true", help="show size and modification time (sandboxes: details)")
    cmd = add("read", commands.cmd_read, "print a file (text; binary only with --base64)", "local-or-remote")
    cmd.add_argument("path", metavar="PATH")
    cmd.add_argument("--offset", type=int, default=0, help="0-based first line")
    cmd.add_argument("--limit", type=int, default=2000, help="number of lines")
    cmd.add_argument("--base64", action="store_true", help="print the content base64-encoded (needed for binary)")
    cmd = add("write", commands.cmd_write, "write a text file from stdin or --content", "local-or-remote")
    cmd.add_argument("path", metavar="PATH")
    cmd.add_argument("--content", default=None, help="the text to write (default: read stdin)")
    cmd = add("grep", commands.cmd_grep, "search files for a literal string; prints path:line:text", "local-or-remote")
    cmd.add_argument("pattern", metavar="PATTERN")
    cmd.add_argument("path", nargs="?", metavar="PATH")
    cmd.add_argument("--glob", default=None, help="only files matching this glob")
    cmd.add_argument("--max-count", type=int, default=None, help="stop after this many matches in total")
    cmd = add("glob", commands.cmd_glob, "list files matching a glob pattern", "local-or-remote")
    cmd.add_argument("pattern", metavar="PATTERN")
    cmd.add_argument("path", nargs="?", metavar="PATH")

    _add_service_commands(add, common)
    return parser


def _add_service_commands(
    add: Callable[[str, Callable[..., int] | None, str, str], argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    # Handlers are looked up when run: the remote module needs the server extra.
    def lazy(name: str) -> Callable[..., int]:
        def run(*args: Any) -> int:
            from sandboxes.cli import remote

            code: int = getattr(remote, name)(*args)
            return code

        return run

    cmd = add("create", lazy("cmd_create"), "create a sandbox in the service; prints its id", "service")
    cmd.add_argument("--template", default="default", help="the service's template (default: default)")
    cmd.add_argument("--ttl", type=float, default=None, help="seconds to live (default: the template's)")
    cmd.add_argument("--env", type=key_value, action="append", default=[], metavar="K=V", help="environment variable")
    cmd.add_argument("--label", type=key_value, action="append", default=[], metavar="K=V", help="label")
    cmd.add_argument("--snapshot", default=None, metavar="SNAPSHOT", help="restore this snapshot in it, verified")
    egress = cmd.add_mutually_exclusive_group()
    egress.add_argument(
        "--egress", action="append", default=None, metavar="RULE",
        help="allow egress to RULE (host, *.domain, CIDR, with optional :PORTS) instead of the template's list",
    )  # fmt: skip
    egress.add_argument("--no-egress", action="store_true", help="allow no egress at all (an empty allow-list)")
    cmd.add_argument(
        "--volume", action="append", default=[], metavar="NAME:PATH[:ro]", help="mount a volume of yours at PATH"
    )
    cmd.add_argument(
        "--idempotency-key",
        default=None,
        metavar="KEY",
        help="run again with the same KEY (and options), answer the sandbox it made while that lives "
        "instead of making another (default: a fresh key, the same for this command's retries)",
    )

    def shell(*args: Any) -> int:
        from sandboxes.cli.shell import cmd_shell

        return cmd_shell(*args)

    cmd = add("shell", shell, "an interactive terminal in a sandbox of the service (like docker exec -it)", "service")
    cmd.add_argument("target", metavar="SANDBOX", help="the sandbox's id")
    cmd.add_argument("-c", "--command", default=None, help="what to run (default: a login shell, bash -i -l)")
    cmd = add("rm", lazy("cmd_rm"), "delete sandboxes of the service, and everything in them", "service")
    cmd.add_argument("ids", nargs="+", metavar="ID")
    cmd.add_argument("-f", "--force", action="store_true", help="an id that does not exist is not an error")
    cmd = add("metrics", lazy("cmd_metrics"), "a sandbox's usage: CPU, memory, disk (--json: every sample)", "service")
    cmd.add_argument("id", metavar="ID")
    cmd = add("volume", lazy("cmd_volume"), "your volumes: volume create NAME, volume ls, volume rm NAME...", "service")
    cmd.add_argument("action", choices=["create", "ls", "rm"])
    cmd.add_argument("names", nargs="*", metavar="NAME")
    cmd.add_argument("--size", type=int, default=None, help="create: bytes counted against your quota")
    cmd.add_argument("--template", default="default", help="create: the template whose sandboxes mount it")
    cmd = add(
        "cp",
        None,
        "copy files or directories between here and a sandbox: cp LOCAL ID:PATH, cp ID:PATH LOCAL "
        "(relative PATHs are in the sandbox's workdir; '-' is a tar stream on stdin/stdout)",
        "cp",
    )
    cmd.add_argument("source", metavar="SOURCE")
    cmd.add_argument("target", metavar="TARGET")
    cmd = add("ports", None, "reach a port inside a sandbox of the service", "ports")
    forward = cmd.add_subparsers(dest="ports_action", required=True, metavar="ACTION").add_parser(
        "forward",
        parents=[common],
        help="listen on 127.0.0.1 and forward each connection to PORT inside the sandbox (until interrupted)",
    )
    forward.add_argument("ports_sandbox", metavar="SANDBOX")
    forward.add_argument("ports_port", type=int, metavar="PORT")
    forward.add_argument(
        "--local-port", type=int, default=None, help="the local port (default: PORT, else any free one)"
    )
    add(
        "mcp",
        None,
        "serve the service's sandboxes to an agent as an MCP server on stdin and stdout "
        "(--sandbox ID: the sandbox calls act on when they name none)",
        "mcp",
    )

    def stateful(name: str) -> Callable[..., int]:
        def run(*args: Any) -> int:
            import importlib

            module = importlib.import_module("sandboxes.cli." + ("processes" if name == "cmd_process" else "state"))
            code: int = getattr(module, name)(*args)
            return code

        return run

    add_state_commands(add, stateful)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:
        return _serve(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    for name, default in _COMMON_DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, default)
    try:
        return _dispatch(args)
    except Usage as exc:
        parser.print_usage(sys.stderr)
        note(f"sandboxes: error: {exc}")
        return EXIT_USAGE
    except Failed as exc:
        note(f"error: {exc.code}: {exc.message}")
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # A backend raises only when it cannot be reached or has a bug; say so in one line
        # unless asked for the traceback.
        if os.environ.get("SANDBOXES_DEBUG"):
            raise
        note(f"error: {p.BACKEND_ERROR}: {type(exc).__name__}: {exc}")
        return EXIT_ERROR
