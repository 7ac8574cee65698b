"""The handler of ``sandboxes process``: a sandbox's background processes in the service
(start, get, wait, kill), their stdout printed to stdout and their stderr to stderr.
Imported only in remote mode (it needs the ``server`` extra); it runs on the CLI's light path
(`sandboxes.cli._fast`), a `SandboxClient` would do as well."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import TYPE_CHECKING

from sandboxes import protocol as p
from sandboxes.cli._common import EXIT_ERROR, EXIT_TIMEOUT, Failed, Usage, emit_json, note, out
from sandboxes.client._light import ProcessStatus
from sandboxes.semantics import message_for

if TYPE_CHECKING:
    from sandboxes.cli._fast import LightClient
    from sandboxes.client import SandboxClient

__all__ = ["cmd_process"]


def cmd_process(args: argparse.Namespace, client: SandboxClient | LightClient) -> int:
    """``start ID CMD...`` prints the process's id; ``get|wait|kill ID PROCESS`` print its
    stdout and stderr apart and exit as it did (0 while it runs)."""
    sandbox = client.attach(args.id)
    words: list[str] = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    if args.action == "start":
        if not words:
            raise Usage("process start: a command is required")
        command = words[0] if len(words) == 1 else shlex.join(words)
        started = sandbox.start_process(command, timeout=args.timeout)
        if args.json:
            emit_json(started)
        else:
            out(started.id + "\n")
        return 0
    if len(words) != 1:
        raise Usage(f"process {args.action}: which process? process {args.action} ID PROCESS")
    if args.action == "kill":
        status = sandbox.kill_process(words[0])
    elif args.action == "wait":
        status = sandbox.wait_process(words[0], timeout=args.timeout)
    else:
        status = sandbox.poll_process(words[0])
    return _shown(args, status)


def _shown(args: argparse.Namespace, status: ProcessStatus) -> int:
    if args.json:
        emit_json(status)
    else:
        out(status.stdout)
        out(status.stderr, sys.stderr)
    result = status.result
    if result is None:
        return 0
    if result.error == p.TIMEOUT:
        note(f"error: {p.TIMEOUT}: {result.message}")
        return EXIT_TIMEOUT
    if result.error is not None:
        raise Failed(result.error, result.message or message_for(result.error))
    return result.exit_code if result.exit_code is not None else EXIT_ERROR
