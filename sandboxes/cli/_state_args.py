"""The arguments of the subcommands of a sandbox's state in the service (pause, resume), apart
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
    cmd = add("resume", handler("cmd_resume"), "let a paused sandbox's processes run again", "service")
    cmd.add_argument("id", metavar="ID")
