"""A command on a pseudo-terminal, for the exec helper (`_command`): stdlib only, Python
3.6-compatible, imported only when a request asks for one (an R spec with ``pty``).

The command runs as ``/bin/sh -c command`` in a new session whose controlling terminal is the
slave side of a fresh pty (its stdin, stdout and stderr), sized before the shell starts; the
helper keeps the master, whose bytes are the command's output (O frames, as a pipe's) and into
which its stdin (I frames) is written. A resize (Z frame) sets the master's window size, and
the kernel signals SIGWINCH to the terminal's foreground process group.

What the client's C (end of stdin) does on a terminal: the helper stops writing what comes
after it, and nothing else: the master stays open (closing it would hang the terminal up), so
the command sees no end of input. A terminal's end of input is typed: Ctrl-D (``\\x04``), which
the line discipline turns into an end of file for a reader at the start of a line (a shell
exits on it).

A kill takes the command's group and marker (as for any command) and also every process of its
session: an interactive shell puts each job in a group of its own.
"""

import fcntl
import os
import struct
import termios

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: `typing` is not imported in the sandbox
    import signal
    from typing import Any
else:  # the C module behind `signal` (which imports `enum`), with the same calls and numbers
    import _signal as signal

DEFAULT_TERM = "xterm-256color"
"""TERM of a terminal's command, unless its request's environment sets one."""
MAX_SIDE = 10000
"""Columns or rows a size may have at most: a window size is two unsigned shorts."""


def size_of(value: "Any") -> "tuple[int, int]":
    """(cols, rows) of a request's ``{"cols": C, "rows": R}``; ValueError for anything else."""
    if not isinstance(value, dict):
        raise ValueError("a terminal's size is {cols, rows}")
    cols, rows = value.get("cols"), value.get("rows")
    if type(cols) is not int or type(rows) is not int or not (1 <= cols <= MAX_SIDE and 1 <= rows <= MAX_SIDE):
        raise ValueError("a terminal's cols and rows are integers from 1 to %d" % MAX_SIDE)
    return cols, rows


def set_size(fd: int, size: "tuple[int, int]") -> None:
    """Set the window size of the terminal behind ``fd`` (TIOCSWINSZ: rows, cols, no pixels)."""
    cols, rows = size
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def spawn_pty(command: str, env: "dict[str, str]", size: "tuple[int, int]") -> "tuple[int, int]":
    """(pid, master fd) of ``/bin/sh -c command`` on a new pty of ``size``, in a new session whose
    controlling terminal it is, in the helper's working directory. The master is close-on-exec."""
    master, slave = os.openpty()
    try:
        set_size(master, size)
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child: it execs or exits)
            _child(command, env, master, slave)
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    return pid, master


def _child(command: str, env: "dict[str, str]", master: int, slave: int) -> None:
    """In the forked child: become the session leader the slave is the terminal of, and exec."""
    try:
        os.close(master)
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
        for fd in (0, 1, 2):
            os.dup2(slave, fd)
        if slave > 2:
            os.close(slave)
        for signum in range(1, signal.NSIG):  # a terminal's: Ctrl-C must interrupt, whatever the helper ignores
            if signum not in (signal.SIGKILL, signal.SIGSTOP):
                try:
                    signal.signal(signum, signal.SIG_DFL)
                except (OSError, ValueError):  # not a signal here
                    pass
        os.execve("/bin/sh", ["/bin/sh", "-c", command], env)  # noqa: S606 (the shell is the command's)
    except BaseException as exc:
        try:
            os.write(2, ("sandboxes: the terminal's command could not start: %s\r\n" % (exc,)).encode())
        finally:
            os._exit(127)


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (what a job-control shell put in other groups),
    rescanning until a scan finds none, a bounded number of times."""
    for _ in range(50):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            if _session_of(int(entry)) == sid:
                found = True
                try:
                    os.kill(int(entry), signal.SIGKILL)
                except OSError:
                    pass
        if not found:
            return


def _session_of(pid: int) -> "int | None":
    """The session id of a live ``pid`` (None: gone, or a zombie, which holds nothing)."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    if len(fields) < 4 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[3])
