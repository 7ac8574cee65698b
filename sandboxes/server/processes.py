"""Background commands of one sandbox: start, poll, kill.

Each runs in its own thread through ``execute_streaming``, whose hook fills a bounded output
buffer that polls read while the command runs. Every command carries a marker in its
environment (`MARKER_ENV`), inherited by everything it starts, so a kill takes down the whole
tree, including what left its process group; a timeout still bounds every command, killed or
not. Processes live in the service's memory only: a restart forgets them (their commands die
with the service on the local backend, and with the exec helper's stream on Docker).

Their output is bounded per sandbox (``output_budget``) and per tenant (an `OutputLedger`
shared by its sandboxes' tables): a process reserves its output limit while it runs (granted
less when less is left, refused when almost nothing is) and holds its output's size once
finished; room for a new process is made by dropping the oldest finished outputs, the
sandbox's own first, then the tenant's (their status and exit code stay, with a message
saying the output was dropped).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from sandboxes import protocol as p
from sandboxes._output import OutputBuffer
from sandboxes.api import ExecuteResult, ProcessInfo
from sandboxes.base import BaseSandbox
from sandboxes.server.errors import ServiceError

logger = logging.getLogger(__name__)

Status = Literal["running", "exited", "killed", "timeout"]
_KEEP_FINISHED = 64
_KILL_WAIT = 10.0
_MIN_GRANT = 64 << 10
"""Least output room a process is started with, unless it asked for less."""


@dataclass(frozen=True, slots=True)
class Command:
    """One command with the service's limits already applied."""

    command: str
    timeout: float
    stdin: bytes | None
    env: Mapping[str, str]
    cwd: str | None
    output_limit: int


def result_of(response: p.ExecuteResponse) -> ExecuteResult:
    return ExecuteResult(
        output=response.output,
        exit_code=response.exit_code,
        truncated=response.truncated,
        error=response.error,
        message=response.message,
        duration_ms=response.duration_ms,
    )


def run_marked(
    sandbox: BaseSandbox, command: Command, token: str, on_output: Callable[[bytes], None] | None
) -> p.ExecuteResponse:
    """Run ``command`` with its tree marked by ``token``; a backend failure becomes a result."""
    from sandboxes.server.backends import MARKER_ENV

    try:
        return sandbox.execute_streaming(
            command.command,
            on_output,
            timeout=command.timeout,
            stdin=command.stdin,
            env={**command.env, MARKER_ENV: token},
            cwd=command.cwd,
            output_limit=command.output_limit,
        )
    except Exception:
        logger.exception("execute failed in %s", sandbox.id)
        return p.ExecuteResponse(
            "", error=p.UNAVAILABLE, message="the sandbox's backend failed; the service log has the request id"
        )


@dataclass
class _Process:
    id: str
    token: str
    output: OutputBuffer
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: threading.Event = field(default_factory=threading.Event)
    killed: bool = False
    response: p.ExecuteResponse | None = None
    held: int = 0
    """Bytes of output counted against the sandbox's budget: the limit while it runs, then
    the size of its output."""

    def write(self, chunk: bytes) -> None:
        with self.lock:
            self.output.write(chunk)

    def finish(self, response: p.ExecuteResponse) -> None:
        with self.lock:
            self.response = response
            self.output = OutputBuffer(0)  # the response has the output now: no second copy
            self.held = len(response.output)

    def drop_output(self, budget: int, whose: str = "the sandbox's") -> int:
        """Forget a finished process's output; the bytes freed."""
        with self.lock:
            if self.response is None or not self.response.output:
                return 0
            freed, self.held = self.held, 0
            self.response = dataclasses.replace(
                self.response,
                output="",
                truncated=True,
                message=f"output dropped to make room for newer processes ({whose} budget is {budget} bytes)",
            )
            return freed

    @property
    def status(self) -> Status:
        if self.response is None:
            return "running"
        if self.killed:
            return "killed"
        return "timeout" if self.response.error == p.TIMEOUT else "exited"

    def info(self) -> ProcessInfo:
        with self.lock:
            response = self.response
            output = self.output.text() if response is None else response.output
        return ProcessInfo(
            id=self.id, status=self.status, output=output, result=None if response is None else result_of(response)
        )


class OutputLedger:
    """One tenant's background-process output, across its sandboxes, against its budget."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._processes: dict[int, _Process] = {}  # oldest first
        self._lock = threading.Lock()

    def admit(self, proc: _Process, wanted: int) -> int:
        """Room for ``proc``'s output, up to ``wanted``, made by dropping the tenant's oldest
        finished outputs; ``proc`` then holds what it was granted (maybe 0)."""
        with self._lock:
            held = sum(other.held for other in self._processes.values())
            for other in list(self._processes.values()):
                if self.budget - held >= wanted:
                    break
                if other.done.is_set():
                    held -= other.drop_output(self.budget, "the tenant's")
            granted = max(0, min(wanted, self.budget - held))
            proc.held = granted
            self._processes[id(proc)] = proc
            return granted

    def discard(self, processes: list[_Process]) -> None:
        with self._lock:
            for proc in processes:
                self._processes.pop(id(proc), None)

    def held(self) -> int:
        with self._lock:
            return sum(proc.held for proc in self._processes.values())


class ProcessTable:
    def __init__(self, max_running: int, output_budget: int = 64 << 20, ledger: OutputLedger | None = None) -> None:
        self._max_running = max_running
        self._budget = output_budget
        self._ledger = ledger
        self._processes: OrderedDict[str, _Process] = OrderedDict()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def start(self, sandbox: BaseSandbox, command: Command, on_end: Callable[[], None] | None = None) -> ProcessInfo:
        """Start ``command`` in a thread of its own; ``on_end`` is called when it has ended."""
        with self._lock:
            running = sum(1 for proc in self._processes.values() if proc.response is None)
            if running >= self._max_running:
                raise ServiceError(
                    "quota_exceeded", f"{running} background processes already run in this sandbox (the maximum)"
                )
            proc = _Process(id=f"p{next(self._ids)}", token=uuid.uuid4().hex, output=OutputBuffer(0))
            limit = self._grant(proc, command.output_limit)
            proc.output = OutputBuffer(limit)
            self._processes[proc.id] = proc
            command = dataclasses.replace(command, output_limit=limit)
            self._forget_old()
        threading.Thread(
            target=self._run, args=(sandbox, command, proc, on_end), name=f"sandboxes-bg-{proc.id}", daemon=True
        ).start()
        return proc.info()

    def _run(self, sandbox: BaseSandbox, command: Command, proc: _Process, on_end: Callable[[], None] | None) -> None:
        try:
            proc.finish(run_marked(sandbox, command, proc.token, proc.write))
            proc.done.set()
        finally:
            if on_end is not None:
                on_end()

    def get(self, process_id: str) -> ProcessInfo:
        return self._find(process_id).info()

    def kill(self, process_id: str, kill_marked: Callable[[str], None]) -> ProcessInfo:
        """Kill the process's tree and wait for its result (blocking: call from a thread).
        A process that already finished is reported as it finished."""
        proc = self._find(process_id)
        if not proc.done.is_set():
            with proc.lock:
                proc.killed = proc.response is None
            deadline = time.monotonic() + _KILL_WAIT
            # Again until it ends: a command killed just as it was being started (its shell not
            # yet forked) carries no marker yet, and a kill then finds nothing.
            while True:
                kill_marked(proc.token)
                if proc.done.wait(0.2):
                    break
                if time.monotonic() > deadline:
                    logger.warning("process %s did not end within %ss of its kill", proc.id, _KILL_WAIT)
                    break
        return proc.info()

    def kill_all(self, kill_marked: Callable[[str], None]) -> None:
        with self._lock:
            running = [proc for proc in self._processes.values() if not proc.done.is_set()]
        for proc in running:
            proc.killed = True
            kill_marked(proc.token)

    def _find(self, process_id: str) -> _Process:
        with self._lock:
            proc = self._processes.get(process_id)
        if proc is None:
            raise ServiceError("not_found", f"no process {process_id!r} in this sandbox")
        return proc

    def _grant(self, proc: _Process, wanted: int) -> int:
        """Output room for ``proc`` (under ``self._lock``), dropping the oldest finished
        outputs, the sandbox's then the tenant's, until ``wanted`` fits or none is left."""
        held = sum(other.held for other in self._processes.values())
        for other in list(self._processes.values()):
            if self._budget - held >= wanted:
                break
            if other.done.is_set():
                held -= other.drop_output(self._budget)
        granted = min(wanted, self._budget - held)
        refusal = f"the sandbox's running processes hold its whole output budget ({self._budget} bytes)"
        if granted >= min(wanted, _MIN_GRANT) and self._ledger is not None:
            granted = self._ledger.admit(proc, granted)
            refusal = f"the tenant's running processes hold its whole output budget ({self._ledger.budget} bytes)"
        if granted < min(wanted, _MIN_GRANT):
            if self._ledger is not None:
                self._ledger.discard([proc])
            raise ServiceError("quota_exceeded", refusal)
        proc.held = granted
        return granted

    def close(self) -> None:
        """The sandbox is gone: its processes no longer count against the tenant."""
        if self._ledger is not None:
            with self._lock:
                processes = list(self._processes.values())
            self._ledger.discard(processes)

    def _forget_old(self) -> None:
        finished = [key for key, proc in self._processes.items() if proc.response is not None]
        forgotten = [self._processes.pop(key) for key in finished[: max(0, len(finished) - _KEEP_FINISHED)]]
        if self._ledger is not None and forgotten:
            self._ledger.discard(forgotten)
