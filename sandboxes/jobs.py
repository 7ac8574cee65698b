"""Background jobs that live IN the sandbox: start, poll, kill, list, on `BaseSandbox.execute`.

Why in the sandbox, not in the caller's memory: a job held by a thread of the process that
started it (the service's former background processes) dies or is forgotten with that process,
and no other process can see it. A job here is a supervisor process and a directory inside the
sandbox; any process holding a handle to the sandbox polls or kills it by its id, after a
restart of the one that started it too. Everything goes through ``execute()`` alone, one round
trip per operation, so every backend (Local, Docker, SSH, Kubernetes, busybox images without
python3) has jobs. The scripts are constants (`sandboxes._job_scripts`); caller data reaches
them only as quoted positional parameters (the command too) and on stdin (the environment, the
job's stdin), as in `sandboxes._scripts`, so no command, environment or path can become the
runner's shell syntax.

A job ``<id>`` (time-ordered hex) is a directory ``${TMPDIR:-/tmp}/.sandboxes-jobs/<id>`` (0700,
in a 0700 root the sandbox user must own: on a shared ``/tmp`` a root planted by someone else
is refused) holding:

- ``cmd``, ``env`` (base64 lines of ``NAME=VALUE``, so values never appear in a command line),
  ``stdin`` (when given), ``limits`` (output head size and tail chunk size);
- ``pid``: the supervisor, started by ``setsid`` with stdin from ``/dev/null``: it left the
  starting command's session and group, and the exec helper, told by the start
  (`sandboxes._helper._kill.JOB_START_ENV`), records it and spares it from its sweep of orphans (its
  marker, below, which any process could set, spares it from the shell's sweep only while its
  job is live), so it outlives the ``execute()`` that started it. It is a child subreaper where
  the sandbox has python3, so what its command leaves behind stays in its tree, and it kills
  those adopted processes once its command ended (``kill_strays``: by parent, not by marker,
  before they pass on to init). It forks its
  output process, the command and the watchdog, writes ``pid``, and only then lets the command
  run (through the FIFO ``go``): a command that takes every pid at once cannot starve the
  supervisor or the start of a process they still need. In between it waits for the start's
  ``ack`` (`scripts.START`: no fork after it), and ends ``failed start`` once the start (its
  ``starter``) is gone without one: a start that died at a fork it could not make never runs
  the command, one cut off after its ``ack`` may have;
- ``cpid``: the command, ``setsid /bin/sh -c CMD`` in the job's directory of choice, with the
  caller's environment and ``SANDBOXES_EXEC_ID=sandboxes-job-<id>``: every process it starts
  inherits the marker, so `kill` takes down the whole tree (`sandboxes._scripts.KILL_MARKED`),
  and its process group is killed too (a leader that wiped its environment);
- ``o.h``, ``o.<k>``: the stdout, and ``e.h``, ``e.<k>``: the stderr (bytes as written, each
  stream apart, each through a FIFO of its own, so how they interleaved is not kept). An output
  process per stream reads its FIFO with one ``dd`` read at a time (busybox ``head -c`` reads
  past its count and buffers its output): the first ``H`` bytes go to ``X.h``, the rest to tail
  chunks of ``T`` bytes of which the newest two are kept, so at most ``H + 2T`` (the output
  limit) is kept of EACH stream, head and tail as `sandboxes._output.OutputBuffer` does, however
  long the command runs. It never stops reading: a command past its output limit keeps running
  (no SIGPIPE), and how much was dropped follows from which chunks remain. (A job started by an
  older runner has its stdout and stderr merged in ``o.*``, and no ``e.*``.)
- ``status``: ``exited <code>``, ``timeout``, ``killed``, ``lost`` (its supervisor vanished:
  the sandbox or its jail restarted) or ``failed cwd``, then the end time (``-`` until known),
  written once: whoever first creates the file ``end`` (the supervisor, the watchdog, a kill;
  ``set -C``, an exclusive create) writes it. Where ``/tmp`` has no room left for its bytes,
  the status is the name of an empty file, ``status.<state>.<code>.<time>``; a job with neither
  whose supervisor is gone reads ``lost``, never ``running``.

Killing works when the job took every pid the sandbox may have (a fork bomb), when every script
the runner sends can start no process, or none can start at all: see `JobRunner.kill`. Poll,
list and start then raise `CannotFork` (``unavailable``: from a start, it did not run); a start
whose answer was lost may have run, and says ``connection_lost``.

The timeout is enforced inside the sandbox by a watchdog process (``sleep``, then the kill),
not by the caller. The supervisor waits for the command, kills what it left running, lets the
output drain (1 s at most: an escaped process may hold the FIFO), then writes the status, so a
finished job's output is complete. Finished jobs are removed at each start past the newest
``keep``. Processes carry markers ``sandboxes-job-<id>`` (the command), ``-s`` (supervisor),
``-o`` (the output processes), ``-w`` (watchdog), all under `sandboxes._helper._kill.JOB_MARKER_PREFIX`.

Limits: a job lives as long as its sandbox's processes do. On Docker, SSH and Kubernetes that is
the container, host or pod; a `LocalSandbox` jail dies with the process holding the sandbox
(``bwrap --die-with-parent``), and so do its jobs (a restarted holder finds none: their ``/tmp``
was the jail's), and without the exec helper every local command is a jail of its own, so a job
cannot outlive its start there. Sandboxes sharing one SSH user (``isolation="none"``) share
``/tmp`` and so see each other's jobs. The per-sandbox cap on running jobs is checked in the
start script, so two starts at the same moment may both pass it. A sandbox whose pids are all
taken and that has no exec helper (busybox images, SSH hosts without python3) can be killed from
inside only while a shell can start there at all: when not a single pid frees up, `kill`
raises `CannotFork` after its retries.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import math
import re
import secrets
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from sandboxes import _job_output as _out
from sandboxes import _job_scripts as scripts
from sandboxes import protocol as p
from sandboxes._helper._kill import JOB_MARKER_PREFIX, JOB_START_ENV, MARKER_ENV
from sandboxes._job_output import MAX_RUNS, Chunks
from sandboxes._mux._command import Command
from sandboxes._output import DEFAULT_OUTPUT_LIMIT, Stream
from sandboxes._parse import natural
from sandboxes.base import BaseSandbox, KillsTagged

__all__ = ["CannotFork", "Job", "JobError", "JobNotFound", "JobRunner", "JobState", "JobSurvived", "TooManyJobs"]

State = Literal["running", "exited", "killed", "timeout", "lost", "failed"]

_ID_HEX = 32
_OPERATION_TIMEOUT = 60.0
_EXIT_NOT_FOUND = 10
_EXIT_SURVIVED = 27
_KILL_ATTEMPTS = 12
_MAX_TIMEOUT = float(1 << 31)
"""Seconds (68 years): a longer timeout (``inf`` too) is this one; busybox ``sleep`` refuses
20 digits, and the watchdog would time the job out at once."""
_CANNOT_FORK = re.compile(
    r"(?i)can(?:not|'t) fork|fork: |resource temporarily unavailable|BlockingIOError|unable to start container process"
)
"""How a sandbox says it could not start a process: ``sh`` (dash: "Cannot fork", busybox: "can't
fork", bash: "fork: ..."), the exec helper (``BlockingIOError``), the kernel's ``EAGAIN``, and
``docker exec`` (runc: "unable to start container process") when the container's pids are all
taken."""


class JobError(Exception):
    """A job operation failed; ``code`` is the protocol's error code."""

    def __init__(self, code: p.ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class JobNotFound(JobError):
    def __init__(self, job_id: str) -> None:
        super().__init__(p.FILE_NOT_FOUND, f"no job {job_id!r} in this sandbox")


class TooManyJobs(JobError):
    def __init__(self, running: int) -> None:
        super().__init__(p.INVALID_ARGUMENT, f"{running} background jobs already run in this sandbox (the maximum)")


class JobSurvived(JobError):
    """A kill ended without ending the job's supervisor."""

    def __init__(self, job_id: str) -> None:
        super().__init__(
            p.UNAVAILABLE, f"job {job_id}'s supervisor was still running after 10 s of kills; try the kill again"
        )


class CannotFork(JobError):
    """The sandbox cannot start processes now: its process limit is reached."""

    def __init__(self) -> None:
        super().__init__(
            p.UNAVAILABLE,
            "the sandbox cannot start processes: its process limit is reached (by a command that "
            "keeps forking?); kill the job that fills it, or wait for it to end",
        )


@dataclass(frozen=True, slots=True)
class JobState:
    """What a job is doing, without its output."""

    id: str
    status: State
    exit_code: int | None = None
    reason: str | None = None
    """Why a ``failed`` job failed (``cwd``: its working directory is missing)."""
    started_ns: int | None = None
    ended_ns: int | None = None

    @property
    def finished(self) -> bool:
        return self.status != "running"

    @property
    def duration_ms(self) -> float | None:
        if self.started_ns is None or self.ended_ns is None:
            return None
        return max(0, self.ended_ns - self.started_ns) / 1e6


@dataclass(frozen=True, slots=True)
class Job:
    """A job's state and its output kept from some position on (`JobRunner.poll`).

    Each of the command's streams (``chunks``: its stdout, ``errors``: its stderr) is kept apart,
    with positions of its own: the sandbox keeps the first ``head`` bytes of each and the last
    ``tail`` to ``2 * tail`` bytes. A recorded command (`JobRunner.read_record`) has one sequence,
    ``chunks`` (stdout and stderr in the order they came), and ``runs``: where each run of one
    stream starts in it (``(position, stream)``, ascending; none: ``merged``)."""

    state: JobState
    chunks: Chunks = ()
    head: int = 0
    tail: int = 0
    errors: Chunks = ()
    runs: tuple[tuple[int, Stream], ...] = ()

    @property
    def output(self) -> bytes:
        return b"".join(data for _, data in self.chunks)

    @property
    def end(self) -> int:
        """The stream position after the last byte returned: the offset to poll from next."""
        return _out.end(self.chunks)

    @property
    def errors_end(self) -> int:
        """The stderr position after the last byte returned: the stderr offset to poll from next."""
        return _out.end(self.errors)

    @property
    def dropped(self) -> int:
        """Bytes between the returned chunks (of both streams) that the sandbox no longer keeps."""
        return _out.dropped(self.chunks) + _out.dropped(self.errors)

    def stdout(self) -> str:
        """The stdout as text (of a recorded command: its whole output), with a marker where
        bytes were dropped."""
        return _out.text(self.chunks)

    def stderr(self) -> str:
        """The stderr as text, with a marker where bytes were dropped."""
        return _out.text(self.errors)

    def text(self) -> str:
        """Both streams as one text, as `OutputBuffer.text` marks drops: the stdout, then the
        stderr (a job keeps them apart, so their interleaving is not known)."""
        out, err = self.stdout(), self.stderr()
        if out and err and not out.endswith("\n"):
            out += "\n"
        return out + err

    def pieces(self) -> list[tuple[int, bytes, Stream]]:
        """A recorded command's chunks cut at its runs: ``(position, bytes, stream)``."""
        pieces: list[tuple[int, bytes, Stream]] = []
        starts = [start for start, _ in self.runs]
        for start, data in self.chunks:
            cut = 0
            while cut < len(data):
                at = start + cut
                run = bisect.bisect_right(starts, at) - 1
                stream: Stream = self.runs[run][1] if run >= 0 else "merged"
                upto = starts[run + 1] if run + 1 < len(starts) else at + len(data)
                size = max(1, min(len(data) - cut, upto - at))
                pieces.append((at, data[cut : cut + size], stream))
                cut += size
        return pieces

    def response(self) -> p.ExecuteResponse:
        """The job as a finished `execute` would have answered (only meaningful once finished)."""
        state = self.state
        output, truncated = self.text(), self.dropped > 0
        duration = state.duration_ms
        if state.status == "timeout":
            return p.ExecuteResponse(
                output,
                truncated=truncated,
                error=p.TIMEOUT,
                message="Command timed out; its process tree was killed",
                duration_ms=duration,
            )
        if state.status == "killed":
            return p.ExecuteResponse(
                output,
                truncated=truncated,
                message="Killed on request; its process tree was killed",
                duration_ms=duration,
            )
        if state.status == "lost":
            return p.ExecuteResponse(
                output,
                truncated=truncated,
                error=p.CONNECTION_LOST,
                message=(
                    "The job's supervisor vanished without recording its end (the sandbox restarted, or "
                    "its /tmp is full?); what was left of it was killed"
                ),
                duration_ms=duration,
            )
        if state.status == "failed":
            if state.reason == "cwd":
                return p.ExecuteResponse("", error=p.FILE_NOT_FOUND, message="The working directory does not exist")
            return p.ExecuteResponse("", error=p.BACKEND_ERROR, message=f"the job could not start ({state.reason})")
        return p.ExecuteResponse(output, exit_code=state.exit_code, truncated=truncated, duration_ms=duration)


class JobRunner:
    """Background jobs of one sandbox (see the module docstring). Stateless: any number of
    runners, in any processes, over handles to the same sandbox, see the same jobs."""

    def __init__(
        self,
        sandbox: BaseSandbox,
        *,
        root: str | None = None,
        keep: int = 64,
        max_running: int = 1 << 20,
        max_read: int = 64 << 20,
        operation_timeout: float = _OPERATION_TIMEOUT,
    ) -> None:
        self.sandbox = sandbox
        self.root = root or ""
        """Where the jobs' directories are; empty: ``${TMPDIR:-/tmp}/.sandboxes-jobs``."""
        self.keep = keep
        self.max_running = max_running
        self.max_read = max_read
        """Most output bytes one poll returns (and so holds in this process's memory)."""
        self.operation_timeout = operation_timeout

    def start(
        self,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> JobState:
        """Start ``command`` detached; its id and state. ``timeout`` (seconds; ``None`` or 0:
        none) is enforced inside the sandbox; ``output_limit`` bytes of output are kept, head
        and tail. Raises `TooManyJobs` past ``max_running``, `JobError` if it did not start
        (``connection_lost``: it may have)."""
        data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
        return self.start_command(Command(command, timeout or 0, output_limit, data, dict(env or {}), cwd))

    def start_command(self, command: Command) -> JobState:
        """`start` with the command as one value, its fields as `start`'s keywords (a timeout
        of 0: none)."""
        cwd, data, output_limit = command.cwd, command.stdin, command.output_limit
        env_lines = b"".join(base64.b64encode(_env_entry(name, value)) + b"\n" for name, value in command.env.items())
        job_id = f"{time.time_ns():016x}{secrets.token_hex(8)}"
        tail = max(1, output_limit // 4)
        head = max(0, output_limit - 2 * tail)
        args = [
            self.root,
            job_id,
            str(head),
            str(tail),
            _seconds(command.timeout),
            str(self.keep),
            str(self.max_running),
            "0" if cwd is None else "1",
            cwd or "",
            "0" if data is None else "1",
            str(len(env_lines)),
            command.command,
        ]
        payload = env_lines + (data or b"") if data is not None or env_lines else None
        announce = {JOB_START_ENV: f"{JOB_MARKER_PREFIX}{job_id}-s"}
        response = self._run(_bind(scripts.START, *args), stdin=payload, started=True, env=announce)
        lines = response.output.splitlines()
        if "!ok" in lines:  # it runs, whatever the transport said after (a sweep that could not fork)
            return JobState(job_id, "running")
        if response.error in (p.TIMEOUT, p.CONNECTION_LOST):  # its answer, "!ok" perhaps, is lost
            raise JobError(p.CONNECTION_LOST, f"the start did not answer ({response.error}): list the jobs")
        if _cannot_fork(response):  # the start ended before its "!ok": the supervisor never runs the command
            raise CannotFork()
        if response.error is not None:
            raise JobError(response.error, response.message or f"the sandbox answered {response.error}")
        last = lines[-1] if lines else ""
        if last.startswith("!full"):
            raise TooManyJobs(int(last.split()[1]))
        raise JobError(p.BACKEND_ERROR, f"the job could not start: {_failure(response)}")

    def poll(self, job_id: str, offset: int = 0, limit: int | None = None, errors_offset: int = 0) -> Job:
        """The job's state and its kept output from stdout position ``offset`` and stderr
        position ``errors_offset`` on, at most ``limit`` bytes of each (default: all that is
        kept)."""
        _check_id(job_id)
        if offset < 0 or errors_offset < 0:
            raise JobError(p.INVALID_ARGUMENT, "offset must be >= 0")
        wanted = self.max_read if limit is None else max(0, min(limit, self.max_read))
        bound = 2 * _out.encoded(wanted)
        script = _bind(scripts.POLL, self.root, job_id, str(offset), str(wanted), str(errors_offset))
        response = self._run(script, output_limit=bound)
        if response.exit_code == _EXIT_NOT_FOUND:
            raise JobNotFound(job_id)
        if response.exit_code != 0:
            raise JobError(p.BACKEND_ERROR, f"polling job {job_id} failed: {_failure(response)}")
        return _parse_poll(job_id, response.output)

    def read_record(self, record_id: str, offset: int = 0, limit: int | None = None) -> Job:
        """A recorded command (`sandboxes._helper._record`: one the exec helper ran to its end
        after its client left) as a job: its state and its kept output from ``offset``, at most
        ``limit`` bytes (as `poll`)."""
        _check_id(record_id)
        wanted = self.max_read if limit is None else max(0, min(limit, self.max_read))
        bound = _out.encoded(wanted) + 32 * MAX_RUNS  # and the runs' lines
        response = self._run(_bind(scripts.RECORD, record_id, str(max(0, offset)), str(wanted)), output_limit=bound)
        if response.exit_code == _EXIT_NOT_FOUND:
            raise JobNotFound(record_id)
        if response.exit_code != 0:
            raise JobError(p.BACKEND_ERROR, f"reading record {record_id} failed: {_failure(response)}")
        return _parse_poll(record_id, response.output)

    def record_marker(self, record_id: str) -> str:
        """The marker a recorded command's processes carry, to kill them by (the sandbox's word:
        a marker it forged can only name its own processes)."""
        _check_id(record_id)
        response = self._run(_bind(scripts.RECORD_MARKER, record_id), output_limit=4096)
        if response.exit_code == _EXIT_NOT_FOUND:
            raise JobNotFound(record_id)
        marker = response.output.removeprefix("!m ").removesuffix("\n")
        if response.exit_code != 0 or not response.output.startswith("!m ") or not marker.isprintable():
            raise JobError(p.BACKEND_ERROR, f"reading record {record_id}'s marker failed: {_failure(response)}")
        if not 0 < len(marker) <= 128:
            raise JobError(p.BACKEND_ERROR, f"record {record_id} names no marker")
        return marker

    def kill(self, job_id: str) -> Job:
        """Kill the job's whole tree (unless it ended already) and answer its final state and
        output. Idempotent.

        Works when the job filled the sandbox's process limit, when every process the runner
        starts can fork no further: first the job's end is claimed as ``killed`` and its
        command's process group killed by a script of shell built-ins (`scripts.STOP`), then,
        where the sandbox can kill without starting a process (`KillsTagged`), every process of
        the job in any role, supervisor first; then the kill script proper, tried again (after
        a built-in sweep of the job's processes) while the sandbox answers it cannot fork. (When
        not even the first script can start, the job is claimed by the kill script: a poll from
        elsewhere in between may find its supervisor gone and record it ``lost``.)"""
        _check_id(job_id)
        ended = self._stop(job_id, sweep=False)
        if not ended and isinstance(self.sandbox, KillsTagged):
            for role in ("-s", "-w", "", "-o"):
                self.sandbox.kill_tagged(MARKER_ENV, f"{JOB_MARKER_PREFIX}{job_id}{role}")

        def sweep(_: RetryCallState) -> None:
            self._stop(job_id, sweep=True)

        retrying = Retrying(
            retry=retry_if_exception_type(CannotFork),
            stop=stop_after_attempt(_KILL_ATTEMPTS),
            wait=wait_exponential(multiplier=0.05, max=1.0),
            before_sleep=sweep,
            reraise=True,
        )
        response = retrying(self._run, _bind(scripts.KILL, self.root, job_id))
        if response.exit_code == _EXIT_NOT_FOUND:
            raise JobNotFound(job_id)
        if response.exit_code == _EXIT_SURVIVED:
            raise JobSurvived(job_id)
        if response.exit_code != 0:
            raise JobError(p.BACKEND_ERROR, f"killing job {job_id} failed: {_failure(response)}")
        return self.poll(job_id)

    def _stop(self, job_id: str, *, sweep: bool) -> bool:
        """`scripts.STOP`: whether the job had ended already (``False`` also when the sandbox
        could not even start the script: then nothing is known)."""
        try:
            response = self._run(_bind(scripts.STOP, self.root, job_id, "1" if sweep else "0"))
        except CannotFork:
            return False
        if response.exit_code == _EXIT_NOT_FOUND:
            raise JobNotFound(job_id)
        return response.exit_code == 0 and "!ended" in response.output

    def list(self) -> list[JobState]:
        """Every job the sandbox still has, oldest first (finished ones until collected)."""
        response = self._run(_bind(scripts.LIST, self.root))
        if response.exit_code != 0:
            raise JobError(p.BACKEND_ERROR, f"listing jobs failed: {_failure(response)}")
        states = []
        for line in response.output.splitlines():
            if line.startswith("!j "):
                fields = line.split()
                if len(fields) == 6 and _is_id(fields[1]):  # any directory the sandbox made is listed
                    states.append(_state(fields[1], fields[2:5], fields[5]))
        return states

    def _run(
        self,
        command: str,
        stdin: bytes | None = None,
        output_limit: int = 1 << 20,
        *,
        started: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> p.ExecuteResponse:
        """One round trip, its output bounded (a sandbox's answer is untrusted); `CannotFork` (no
        process could start) or `JobError` (the transport failed), unless ``started``."""
        response = self.sandbox.execute(
            command, stdin=stdin, timeout=self.operation_timeout, output_limit=output_limit, env=dict(env or {})
        )
        if started:
            return response
        if _cannot_fork(response):
            raise CannotFork()
        if response.error is not None:
            raise JobError(response.error, response.message or f"the sandbox answered {response.error}")
        return response


def _cannot_fork(response: p.ExecuteResponse) -> bool:
    """Whether a script failed because the sandbox could not start a process (`_CANNOT_FORK`)."""
    failed = response.error is not None or response.exit_code != 0
    return failed and _CANNOT_FORK.search(f"{response.message or ''}\n{response.output[-2000:]}") is not None


def _bind(script: str, *args: str) -> str:
    """``script`` with ``args`` as ``$1..$n``, each quoted (as `sandboxes._scripts.command`,
    without its prelude: its ``LC_ALL=C`` would reach the job's environment)."""
    return f"set -- {' '.join(shlex.quote(arg) for arg in args)}\n{script}"


def _env_entry(name: str, value: str) -> bytes:
    if not name or "=" in name or "\0" in name or "\0" in value:
        raise JobError(p.INVALID_ARGUMENT, f"invalid environment variable {name!r}")
    if name == MARKER_ENV:
        raise JobError(p.INVALID_ARGUMENT, f"{MARKER_ENV} is the job's own marker")
    return f"{name}={value}".encode()


def _seconds(timeout: float | None) -> str:
    """The watchdog's ``sleep`` argument, ``0`` for none: a timeout is rounded UP to the
    millisecond (rounded down, one under half a millisecond would be ``0``: no timeout at all)."""
    if timeout is not None and math.isnan(timeout):
        raise JobError(p.INVALID_ARGUMENT, "the timeout is not a number")
    if timeout is None or timeout <= 0:
        return "0"
    seconds = math.ceil(min(timeout, _MAX_TIMEOUT) * 1000) / 1000
    return f"{seconds:.3f}".rstrip("0").rstrip(".")


def _is_id(text: str) -> bool:
    return len(text) == _ID_HEX and all(c in "0123456789abcdef" for c in text)


def _check_id(job_id: str) -> None:
    if not _is_id(job_id):
        raise JobNotFound(job_id)


def _failure(response: p.ExecuteResponse) -> str:
    return f"exit {response.exit_code}: {response.output.strip()[-300:] or 'no output'}"


def _state(job_id: str, status: list[str], started: str) -> JobState:
    """A `JobState` from a status line's words (``STATE CODE ENDED``) and the start time."""
    word, code, ended = status
    kind = _STATES.get(word, "lost")
    return JobState(
        job_id,
        kind,
        exit_code=natural(code) if kind == "exited" else None,
        reason=code if kind == "failed" else None,
        started_ns=natural(started),
        ended_ns=natural(ended),
    )


_STATES: dict[str, State] = {state: state for state in ("running", "exited", "killed", "timeout", "lost", "failed")}


def _parse_poll(job_id: str, output: str) -> Job:
    lines = output.split("\n")
    if "!e" in lines:  # what follows is the transport's (a per-command wrapper's complaint), not the script's
        lines = [*lines[: len(lines) - lines[::-1].index("!e")], ""]
    header = lines[0].split() if lines else []
    head, tail = (natural(word) for word in header[5:7]) if len(header) == 7 else (None, None)
    if header[:1] != ["!j"] or lines[-2:] != ["!e", ""] or head is None or tail is None:
        raise JobError(p.BACKEND_ERROR, f"unexpected answer polling job {job_id}: {output[-300:]!r}")
    state = _state(job_id, header[1:4], header[4])
    streams: dict[str, list[tuple[int, bytes]]] = {"!s": [], "!2": []}
    runs: list[tuple[int, Stream]] = []
    target: list[tuple[int, bytes]] | None = None
    position = 0
    encoded: list[str] = []

    def flush() -> None:
        if target is None:
            return
        try:
            data = base64.b64decode("".join(encoded))
        except (binascii.Error, ValueError) as exc:
            raise JobError(p.BACKEND_ERROR, f"corrupt output of job {job_id}") from exc
        if data:
            target.append((position, data))

    for line in lines[1:-2]:
        kind = line[:3]
        if kind in ("!s ", "!2 "):
            flush()
            start = natural(line[3:])
            target, position, encoded = (None, 0, []) if start is None else (streams[kind[:2]], start, [])
        elif kind == "!r ":
            flush()
            target, encoded = None, []
            _out.add_run(runs, line[3:])
        else:
            encoded.append(line)
    flush()
    return Job(state, tuple(streams["!s"]), head=head, tail=tail, errors=tuple(streams["!2"]), runs=tuple(runs))
