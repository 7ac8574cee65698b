"""Running a local process with bounded output, stdin fed concurrently, and a tree-wide kill.

Used by `LocalSandbox`; kept apart so the sandbox module holds only policy (what to run and
how to isolate it), not pipe plumbing.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sandboxes._helper import _kill
from sandboxes._output import OutputBuffer

_DRAIN_GRACE = 0.2
"""Seconds to keep reading after the command exits: a background job it started may hold the
pipe open forever, and ``execute`` must not wait for it."""


@dataclass(frozen=True, slots=True)
class ProcessResult:
    output: OutputBuffer
    exit_code: int | None
    timed_out: bool
    duration_ms: float


def run_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    stdin: bytes | None,
    timeout: float | None,
    output_limit: int,
    marker: tuple[str, str] | None = None,
    on_output: Callable[[bytes], None] | None = None,
    pass_fds: Sequence[int] = (),
    preexec_fn: Callable[[], None] | None = None,
) -> ProcessResult:
    """Run ``argv`` in a new session. When it ends or times out, kill its process group and
    every process still carrying ``marker`` (an environment variable inherited by all
    descendants, which finds the ones that left the group with ``setsid``): nothing a command
    started outlives it.

    ``on_output`` sees every chunk as it is read (uncapped, in order), from the reader thread:
    it must neither block nor raise, or it stalls the command's pipe.

    ``pass_fds`` stay open in the child; ``preexec_fn`` runs in it before exec (limits)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
        pass_fds=tuple(pass_fds),
        preexec_fn=preexec_fn,  # a few plain system calls (sandboxes.local._limits)
    )
    output = OutputBuffer(output_limit)
    assert proc.stdout is not None
    reader = threading.Thread(target=_pump, args=(proc.stdout, output, on_output), daemon=True)
    reader.start()
    if stdin is not None:
        threading.Thread(target=_feed, args=(proc, stdin), daemon=True).start()
    timed_out = not _wait(proc, timeout if timeout else None)
    if timed_out:
        kill_tree(proc.pid, marker)  # unreaped, so its group id cannot belong to anyone else yet
        proc.wait()
    else:  # reaped: its group id may already be reused, so only the marker is safe to follow
        kill_marked(marker)
    reader.join(_DRAIN_GRACE if not timed_out else 2.0)
    with contextlib.suppress(OSError):  # also stops listening to a job that still holds the pipe
        proc.stdout.close()
    code = None if timed_out else _shell_status(proc.returncode)
    return ProcessResult(output, code, timed_out, (time.monotonic() - started) * 1000)


def _wait(proc: subprocess.Popen[bytes], timeout: float | None) -> bool:
    """Wait for the process to exit, at most ``timeout`` seconds; whether it did (unreaped
    until then). ``Popen.wait(timeout)`` polls with growing sleeps, which a short command would
    wait out; a pidfd becomes readable the moment the process exits."""
    if timeout is None:
        proc.wait()
        return True
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # a kernel before 5.3
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout)
    finally:
        os.close(pidfd)
    if not ready:
        return False
    proc.wait()
    return True


def kill_tree(pid: int, marker: tuple[str, str] | None) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    kill_marked(marker)


def kill_marked(marker: tuple[str, str] | None) -> None:
    if marker is not None:
        _kill.kill_marked(marker[1], marker[0])


def _pump(stream: object, output: OutputBuffer, on_output: Callable[[bytes], None] | None = None) -> None:
    read = stream.read1 if hasattr(stream, "read1") else stream.read  # type: ignore[attr-defined]
    with contextlib.suppress(ValueError, OSError):
        while chunk := read(65536):
            output.write(chunk)
            if on_output is not None:
                on_output(chunk)


def _feed(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError, OSError, ValueError):
        proc.stdin.write(data)
    with contextlib.suppress(BrokenPipeError, OSError, ValueError):
        proc.stdin.close()


def _shell_status(returncode: int) -> int:
    """Report death by signal N as 128+N, the way a shell would."""
    return 128 - returncode if returncode < 0 else returncode
