"""The handlers of the subcommands of a sandbox's state in the service: pause and resume.
Imported only in remote mode (they need the ``server`` extra)."""

from __future__ import annotations

import argparse

from sandboxes.api import SandboxInfo
from sandboxes.cli._common import emit_json, out
from sandboxes.client import SandboxClient

__all__ = ["cmd_pause", "cmd_resume"]


def cmd_pause(args: argparse.Namespace, client: SandboxClient) -> int:
    _said(args, client.pause(args.id, args.ttl))
    return 0


def cmd_resume(args: argparse.Namespace, client: SandboxClient) -> int:
    _said(args, client.resume(args.id))
    return 0


def _said(args: argparse.Namespace, info: SandboxInfo) -> None:
    """The sandbox's info as JSON with ``--json``, else its id and state."""
    if args.json:
        emit_json(info)
    else:
        out(f"{info.id} {info.state}\n")
