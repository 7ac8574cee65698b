"""The handlers of the subcommands of a sandbox's state in the service: pause and resume,
snapshots and forks.
Imported only in remote mode (they need the ``server`` extra)."""

from __future__ import annotations

import argparse

from sandboxes.api import SandboxInfo
from sandboxes.cli._common import emit_json, out
from sandboxes.client import SandboxClient

__all__ = ["cmd_fork", "cmd_pause", "cmd_resume", "cmd_snapshot", "cmd_snapshot_rm", "cmd_snapshots"]


def cmd_pause(args: argparse.Namespace, client: SandboxClient) -> int:
    _said(args, client.pause(args.id, args.ttl, mode="hibernate" if args.hibernate else "freeze", memory=args.memory))
    return 0


def cmd_resume(args: argparse.Namespace, client: SandboxClient) -> int:
    _said(args, client.resume(args.id))
    return 0


def _said(args: argparse.Namespace, info: SandboxInfo) -> None:
    """The sandbox's info as JSON with ``--json``, else its id and state."""
    if args.json:
        emit_json(info)
    else:
        out(f"{info.id} {info.state}{' files-only' if info.processes_kept is False else ''}\n")


def cmd_snapshot(args: argparse.Namespace, client: SandboxClient) -> int:
    info = client.attach(args.id).snapshot(args.path, workspace=args.workspace)
    if args.json:
        emit_json(info)
    else:
        out(info.id + "\n")
    return 0


def cmd_snapshots(args: argparse.Namespace, client: SandboxClient) -> int:
    snapshots = client.list_snapshots()
    if args.json:
        emit_json(snapshots)
        return 0
    for info in snapshots:
        line = f"{info.id}  {info.sandbox_id}  {info.bytes:>12}  {info.files:>7}  {' '.join(info.paths)}"
        out((line if args.long else info.id) + "\n")
    return 0


def cmd_snapshot_rm(args: argparse.Namespace, client: SandboxClient) -> int:
    for snapshot_id in args.ids:
        client.delete_snapshot(snapshot_id)
    return 0


def cmd_fork(args: argparse.Namespace, client: SandboxClient) -> int:
    forked = client.attach(args.id).fork(args.count, idempotency_key=args.idempotency_key)
    if args.json:
        emit_json([sandbox.info for sandbox in forked])
    else:
        out("".join(sandbox.id + "\n" for sandbox in forked))
    return 0
