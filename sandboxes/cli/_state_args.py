"""The arguments of the subcommands of a sandbox's state in the service (pause, resume,
snapshots, fork), apart
from their handlers (`sandboxes.cli.state`), which need the ``server`` extra."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["add_state_commands"]

Add = Callable[[str, Callable[..., int] | None, str, str], argparse.ArgumentParser]


def add_state_commands(add: Add, handler: Callable[[str], Callable[..., int]]) -> None:
    """Register the subcommands; ``handler(name)``: the function of `sandboxes.cli.state` by name."""
    cmd = add("pause", handler("cmd_pause"), "freeze a sandbox's processes where they are (resume goes on)", "service")
    cmd.add_argument("id", metavar="ID")
    cmd.add_argument(
        "--ttl",
        choices=("keep", "stop"),
        default="keep",
        help="keep: its expiry runs on while paused (default); stop: what is left is given back at resume",
    )
    cmd.add_argument(
        "--hibernate",
        action="store_true",
        help="keep its files in a snapshot and release it instead: its processes end (printed: files-only)",
    )
    cmd.add_argument(
        "--memory", action="store_true", help="with --hibernate: keep its processes' memory too (refused: unavailable)"
    )
    cmd = add("resume", handler("cmd_resume"), "let a paused sandbox's processes run again", "service")
    cmd.add_argument("id", metavar="ID")
    text = "keep a sandbox's workspace (and --path PATHs) in the service's snapshot store; prints its id"
    cmd = add("snapshot", handler("cmd_snapshot"), text, "service")
    cmd.add_argument("id", metavar="ID")
    cmd.add_argument("--path", action="append", default=[], metavar="PATH", help="an absolute path to keep besides")
    cmd.add_argument("--no-workspace", dest="workspace", action="store_false", help="keep the --path PATHs alone")
    cmd = add("snapshots", handler("cmd_snapshots"), "list the tenant's snapshots", "service")
    cmd.add_argument("-l", "--long", action="store_true", help="with the sandbox, bytes, entries and paths")
    cmd = add("snapshot-rm", handler("cmd_snapshot_rm"), "delete snapshots", "service")
    cmd.add_argument("ids", nargs="+", metavar="SNAPSHOT")
    text = "make COUNT sandboxes with a sandbox's workspace (one snapshot, restored at once); prints their ids"
    cmd = add("fork", handler("cmd_fork"), text, "service")
    cmd.add_argument("id", metavar="ID")
    cmd.add_argument("--count", type=int, default=1, help="how many (default: 1)")
    cmd.add_argument("--idempotency-key", default=None, metavar="KEY", help="run again with KEY: the same sandboxes")
    text = "background processes: process start ID CMD... (prints its id), process get|wait|kill ID PROCESS"
    cmd = add("process", handler("cmd_process"), text + " (its stdout to stdout, its stderr to stderr)", "service")
    cmd.add_argument("action", choices=("start", "get", "wait", "kill"))
    cmd.add_argument("id", metavar="ID", help="the sandbox")
    cmd.add_argument(
        "rest", nargs=argparse.REMAINDER, metavar="CMD|PROCESS", help="start: the command; else the process"
    )
    cmd.add_argument(
        "--timeout", type=float, default=None, help="start: the command's seconds; wait: most seconds to wait"
    )
