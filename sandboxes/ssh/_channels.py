"""The pieces an `sandboxes.ssh.SSHSandbox` talks through on an SSH channel of its own: the script that runs
one command without the exec helper, the byte stream the helper's frames travel on, the output
buffer that relays each chunk as it arrives, and the reading of an SFTP failure."""

from __future__ import annotations

import contextlib
import errno
import select

import paramiko

from sandboxes import protocol as p
from sandboxes._helper._kill import KILL_MARKED_SH
from sandboxes._output import OutputBuffer, OutputHook
from sandboxes._scripts import KILL_MARKED as KILL_TREE
from sandboxes.ssh._connection import SSHConnection

__all__ = [
    "KILL_MARKED",
    "RUN",
    "STDERR_CHUNK",
    "ChannelStream",
    "EndScan",
    "Relayed",
    "channel_dead",
    "feed",
    "lost",
    "sftp_error",
]

RUN = (
    KILL_TREE
    + r"""cwd=$1; marker=$2; cmd=$3; end=$4; shift 4
start_of() { _st=; { read -r _st < "/proc/$1/stat"; } 2>/dev/null; set -- ${_st##*') '}; _st=${20-}; }
start_of $$
since=$_st
for pair do export "$pair"; done
export SANDBOXES_EXEC_ID="$marker"
cd -- "$cwd" 2>/dev/null || { cat >/dev/null; printf %s "$marker"; exit 200; }
exec 3>&2 2>/dev/null
/bin/sh -c "$cmd" 2>&3 3>&-
status=$?
unset SANDBOXES_EXEC_ID
kill_marked "$marker"
[ -z "$since" ] || kill_strays 1 "$since"
printf %s "$end"
cat >/dev/null
exit "$status"
"""
)
"""One command without the helper: environment pairs and cwd as quoted arguments.

The command runs as a child, not by ``exec``: sshd reports a death by signal as ``exit-signal``,
which paramiko drops, so the parent shell turns it into a status (128 + signal); its own stderr
is muted so that it does not add a "Killed" line to the output. Whatever the command left
running (marked by the environment variable) is killed when it exits (`sandboxes._helper._kill`), as the
exec helper does, and so is what escaped its tree and was adopted by the host's init since the
command started (``kill_strays``, `sandboxes._scripts.KILL_MARKED`: by owner, parent and start
time, which a process cannot forge; a live background job's are spared).

The parent shell reads stdin to its end before it exits, so sshd cannot close the channel while
stdin (or its EOF) is still on the way: sshd reuses the number of a closed channel at once, and
paramiko may send a message it prepared just before the close, which would then land in another
command's stdin (or end the whole connection).

sshd sends the exit status as soon as the shell exits, before what is still in the output pipe
(the channel's window allows it later), so the end of the output is marked in the output itself:
the shell prints ``end``, a token of the caller's, once the command and what it left are gone
(`EndScan`). A command can print it too, and so cut only its own output short.

A missing working directory prints the marker, so that a command that itself exits 200 is
not mistaken for it."""

KILL_MARKED = KILL_MARKED_SH + 'kill_marked "$1"\n'
"""Kill a timed-out command's processes (`sandboxes._helper._kill`)."""

STDERR_CHUNK = 1 << 16
"""What one read of the helper's stderr takes, to drain its last words."""


class ChannelStream:
    """`sandboxes._mux.TimedByteStream` over the helper's channel.

    The bounded wait polls the channel's `fileno` (a pipe paramiko sets while the channel has
    data or has ended), not `settimeout`: a channel has one timeout for reads AND writes, and
    a request written meanwhile by another thread would inherit the reader's."""

    def __init__(self, connection: SSHConnection, channel: paramiko.Channel) -> None:
        self._connection = connection
        self._channel = channel
        self._ready = select.poll()
        self._ready.register(channel.fileno(), select.POLLIN)

    def send(self, data: bytes) -> None:
        self._channel.sendall(data)

    def recv(self, size: int) -> bytes:
        return bytes(self._channel.recv(size))

    def recv_within(self, size: int, timeout: float | None) -> bytes | None:
        channel = self._channel
        if not self._readable():
            if timeout == 0:
                return None
            events = self._ready.poll(None if timeout is None else timeout * 1000)
            if not self._readable():
                while channel.recv_stderr_ready():  # the helper's last words: nobody reads them
                    channel.recv_stderr(STDERR_CHUNK)
                closed = any(event & (select.POLLHUP | select.POLLNVAL) for _, event in events)
                return b"" if closed else None  # paramiko closed its pipe: the channel is closed
        return bytes(channel.recv(size))

    def _readable(self) -> bool:
        """Whether `recv` returns at once: data, or the channel's end."""
        channel = self._channel
        return bool(channel.recv_ready() or channel.eof_received or channel.closed)

    def close(self) -> None:
        self._connection.close_session(self._channel)


class EndScan:
    """Finds the end token in a stream of chunks, holding back only the bytes that may start it,
    so that what it passes on is output and never the token."""

    def __init__(self, token: bytes) -> None:
        self._token = token
        self._held = b""
        self.found = False

    def feed(self, chunk: bytes) -> bytes:
        """What of ``chunk`` is output; nothing once the token was found (what follows it was
        printed after the command's end by something that escaped its kill)."""
        if self.found:
            return b""
        data = self._held + chunk
        at = data.find(self._token)
        if at >= 0:
            self.found = True
            self._held = b""
            return data[:at]
        keep = next(
            (k for k in range(min(len(self._token) - 1, len(data)), 0, -1) if data.endswith(self._token[:k])), 0
        )
        self._held = data[len(data) - keep :]
        return data[: len(data) - keep]

    def rest(self) -> bytes:
        """The bytes held back, at the end of a stream that never held the token."""
        held, self._held = self._held, b""
        return held


class Relayed(OutputBuffer):
    """An `OutputBuffer` that hands every chunk written to it on (``merged``) as it arrives."""

    def __init__(self, limit: int, on_output: OutputHook | None) -> None:
        super().__init__(limit)
        self._on_output = on_output

    def write(self, data: bytes) -> None:
        super().write(data)
        if self._on_output is not None and data:
            self._on_output(data, "merged")


def feed(channel: paramiko.Channel, data: bytes) -> None:
    with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
        channel.sendall(data)
        channel.shutdown_write()


def channel_dead(sftp: paramiko.SFTPClient) -> bool:
    """Whether an SFTP ``OSError`` is the connection failing rather than a status from the server."""
    channel = sftp.get_channel()
    transport = channel.get_transport()
    return bool(channel.closed) or transport is None or not transport.is_active()


def lost(message: str) -> p.ExecuteResponse:
    return p.ExecuteResponse("", error=p.CONNECTION_LOST, message=message)


def sftp_error(exc: OSError) -> p.ErrorCode:
    codes: dict[int, p.ErrorCode] = {
        errno.ENOENT: p.FILE_NOT_FOUND,
        errno.EACCES: p.PERMISSION_DENIED,
        errno.EPERM: p.PERMISSION_DENIED,
        errno.EISDIR: p.IS_DIRECTORY,
        errno.ENOTDIR: p.NOT_A_DIRECTORY,
        errno.ENOSPC: p.NO_SPACE,
    }
    return codes.get(exc.errno or 0, p.BACKEND_ERROR)
