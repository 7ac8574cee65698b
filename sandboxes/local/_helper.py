"""The exec helper of a `LocalSandbox`: one long-lived jail running `sandboxes._mux`'s helper,
spoken to over its stdin and stdout.

Why: a bwrap spawn (namespaces, mounts, seccomp, and started by root the drop to the jail uid)
costs far more than a process start, and a spawn per command would make every file operation
pay it. The helper inside one jail starts
each command with a ``posix_spawn`` instead, under the same isolation (the jail is the same
bwrap, with the same flags, seccomp filter, cgroup and rlimits) and with the same guarantees:
a command's whole tree dies with it, timeouts included (the helper's job, as in Docker).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence

from sandboxes._mux import PYTHON_FLAGS, SERVER_SOURCE, MuxBroken, MuxClient

__all__ = ["HelperProcess", "PipeStream"]

_STDERR_KEPT = 4096


class PipeStream:
    """`sandboxes._mux.ByteStream` over a child's stdin and stdout."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self._process = process
        self._in = process.stdin.fileno()
        self._out = process.stdout.fileno()
        self._readable = select.poll()
        self._readable.register(self._out, select.POLLIN)
        self._closing = threading.Lock()
        self._closed = False

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._in, view) :]

    def recv(self, size: int) -> bytes:
        return os.read(self._out, size)

    def recv_within(self, size: int, timeout: float | None) -> bytes | None:
        """`sandboxes._mux.TimedByteStream` (one reader at a time: one poll object)."""
        if timeout is not None and not self._readable.poll(timeout * 1000):
            return None
        return os.read(self._out, size)

    def close(self) -> None:
        """Kill the jail (the helper is bwrap's command; the whole pid namespace goes with it),
        and point this stream's two descriptors at dead pipes (a read sees the end, a write
        fails) rather than close them: a thread still reading or writing by number (the reader
        thread, a send blocked on a stopped helper) must never reach a pipe opened since under
        the same number. The numbers are freed with the stream's files, once unreachable."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=10)
        with self._closing:
            if self._closed:
                return
            self._closed = True
            _make_dead(self._in, readable=False)
            _make_dead(self._out, readable=True)


def _make_dead(fd: int, *, readable: bool) -> None:
    """``fd`` replaced, under its number, by the end of a pipe whose other end is closed."""
    read, write = os.pipe()
    dead, other = (read, write) if readable else (write, read)
    os.close(other)
    try:
        os.dup2(dead, fd, inheritable=False)
    finally:
        os.close(dead)


class HelperProcess:
    """A started jail with the helper in it, and the client talking to it."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        pass_fds: Sequence[int],
        preexec_fn: Callable[[], None] | None,
        hello_timeout: float = 20.0,
    ) -> None:
        self.process = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            start_new_session=True,
            pass_fds=tuple(pass_fds),
            preexec_fn=preexec_fn,  # a few plain system calls (sandboxes.local._limits)
        )
        self.stderr = bytearray()
        threading.Thread(target=self._drain_stderr, name="local-helper-stderr", daemon=True).start()
        stream = PipeStream(self.process)
        try:
            self.client = MuxClient(stream, hello_timeout=hello_timeout)
        except MuxBroken as broken:
            stream.close()
            raise MuxBroken(f"{broken}; helper stderr: {bytes(self.stderr[-500:])!r}") from broken

    @property
    def pid(self) -> int:
        return self.process.pid

    def close(self) -> None:
        self.client.close()  # closes the stream: kills the jail

    def _drain_stderr(self) -> None:
        """Keep the tail of what the jail says on stderr (bwrap's or python's complaint when the
        helper cannot start); never let it fill the pipe and stall the jail."""
        assert self.process.stderr is not None
        fd = self.process.stderr.fileno()
        try:
            with contextlib.suppress(OSError, ValueError):
                while chunk := os.read(fd, 65536):
                    self.stderr += chunk
                    del self.stderr[:-_STDERR_KEPT]
        finally:
            self.process.stderr.close()


HELPER_COMMAND = ("python3", *PYTHON_FLAGS, "-c", SERVER_SOURCE)
"""What runs in the jail; python3 is the host's own (the jail sees /usr read-only)."""
