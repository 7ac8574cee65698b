"""``sandboxes shell SANDBOX``: an interactive terminal in a sandbox of the service, as ``docker
exec -it`` gives one: this terminal in raw mode (every key goes to the sandbox's), its size
followed (SIGWINCH -> resize), and the shell's exit status as this command's.

Imported only in remote mode, as `sandboxes.cli.remote` is; POSIX only (termios).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import termios
import threading
import tty
from collections.abc import Iterator
from types import FrameType

from sandboxes import protocol as p
from sandboxes.cli._common import EXIT_ERROR, EXIT_TIMEOUT, Failed, note
from sandboxes.client import RemoteTerminal, SandboxClient

__all__ = ["cmd_shell"]

_READ = 4096


def cmd_shell(args: argparse.Namespace, client: SandboxClient) -> int:
    """Run the terminal until its command exits; that command's status (124 for a timeout)."""
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    if not os.isatty(stdin):
        raise Failed(
            p.INVALID_ARGUMENT,
            "shell needs a terminal on its stdin (an interactive shell, like `docker exec -it`); "
            "to run a command without one: sandboxes exec --sandbox ID CMD",
        )
    terminal = client.attach(args.target).pty(*_size(stdin), command=args.command)
    with terminal, _raw(stdin), _following_size(terminal, stdin):
        threading.Thread(target=_forward_input, args=(stdin, terminal), name="shell-stdin", daemon=True).start()
        for chunk in terminal:
            os.write(stdout, chunk)
    ended = terminal.exit
    if ended is None:
        note(f"error: {p.CONNECTION_LOST}: the connection to the service dropped; the terminal runs on for a while")
        return EXIT_ERROR
    if ended.error == p.TIMEOUT:
        return EXIT_TIMEOUT
    if ended.exit_code is None:
        note(f"error: {ended.error}: {ended.message}")
        return EXIT_ERROR
    return ended.exit_code


def _size(fd: int) -> tuple[int, int]:
    """(cols, rows) of the terminal of ``fd``; 80 x 24 for a side it does not know (0)."""
    size = os.get_terminal_size(fd)
    return size.columns or 80, size.lines or 24


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    """The terminal of ``fd`` in raw mode, restored as it was on the way out."""
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _following_size(terminal: RemoteTerminal, fd: int) -> Iterator[None]:
    """Each SIGWINCH resizes the sandbox's terminal to this one's size."""

    def resized(_signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(Exception):  # the socket closed meanwhile: the end is near
            terminal.resize(*_size(fd))

    previous = signal.signal(signal.SIGWINCH, resized)
    try:
        yield
    finally:
        signal.signal(signal.SIGWINCH, previous)


def _forward_input(fd: int, terminal: RemoteTerminal) -> None:
    """What is typed, to the sandbox's terminal, until this one's input ends or the socket
    closed (a daemon thread: the process ends with the shell)."""
    with contextlib.suppress(Exception):
        while data := os.read(fd, _READ):
            terminal.send(data)
