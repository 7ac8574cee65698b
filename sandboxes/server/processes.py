"""Background commands of one sandbox: start, poll, kill, as jobs living IN the sandbox.

Each background process is a `sandboxes.jobs` job: a supervisor process and a directory inside
the sandbox, started with one ``execute()`` and polled or killed with one more. The service holds
no thread, no output and no table for them: a process id IS the job's id, so any replica of the
service, or this one after a restart, answers a poll or a kill from the sandbox alone, and the
commands keep running while the service is down (Docker, SSH and Kubernetes; a local sandbox's
jail, and so its jobs, die with the service process that holds it).

Limits, and where they live:

- ``max_processes`` running per sandbox: counted by the start script in the sandbox, over every
  replica's jobs (two starts at the same moment may both pass it).
- ``output_limit`` per process (the request's, under ``max_output_bytes``): the job keeps that
  many bytes of its stdout and as many of its stderr, head and tail, in the sandbox's own
  bounded ``/tmp`` and keeps running past it; a poll reads at most ``max_output_bytes`` of each
  and answers them apart (``stdout``, ``stderr``) and as one text (``output``: the stdout, then
  the stderr). No output is held in the service between polls.
- A tenant's ``max_commands`` (its commands running at once): a background process holds one of
  the tenant's slots in the replica that started it until that replica sees it end: through a
  poll or a kill, or through a watcher thread that lists the sandbox's jobs (one ``execute``) every
  second while it holds slots. A replica that did not start a process (another one, or this one
  after a restart) does not count it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Literal

from sandboxes import protocol as p
from sandboxes._mux import Command as Command  # re-exported: the service's commands are the one value
from sandboxes._output import OutputHook
from sandboxes.api import ExecuteResult, ProcessInfo
from sandboxes.base import BaseSandbox
from sandboxes.jobs import CannotFork, Job, JobError, JobNotFound, JobRunner, JobSurvived, TooManyJobs
from sandboxes.server.errors import ServiceError

logger = logging.getLogger(__name__)

Status = Literal["running", "exited", "killed", "timeout"]
_KEEP_FINISHED = 64
_WATCH_INTERVAL = 1.0


def result_of(response: p.ExecuteResponse) -> ExecuteResult:
    return ExecuteResult(
        output=response.output,
        exit_code=response.exit_code,
        truncated=response.truncated,
        error=response.error,
        message=response.message,
        duration_ms=response.duration_ms,
    )


def run_marked(sandbox: BaseSandbox, command: Command, token: str, on_output: OutputHook | None) -> p.ExecuteResponse:
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


def info_of(job: Job) -> ProcessInfo:
    """A job as the API's `ProcessInfo`: a job whose supervisor vanished reads as killed (its
    result says why), one that could not start (its cwd is missing) as exited with the error."""
    state = job.state
    status: Status
    if state.status == "running":
        return ProcessInfo(id=state.id, status="running", output=job.text(), stdout=job.stdout(), stderr=job.stderr())
    if state.status in ("exited", "failed"):
        status = "exited"
    elif state.status == "timeout":
        status = "timeout"
    else:
        status = "killed"
    response = job.response()
    return ProcessInfo(
        id=state.id,
        status=status,
        output=response.output,
        result=result_of(response),
        stdout=job.stdout(),
        stderr=job.stderr(),
    )


class ProcessTable:
    """The background processes of one sandbox, for one replica of the service: the jobs in the
    sandbox, plus the tenant's command slots this replica holds for the ones it started."""

    def __init__(self, sandbox: BaseSandbox, max_running: int, max_read: int) -> None:
        self.runner = JobRunner(sandbox, keep=_KEEP_FINISHED, max_running=max_running, max_read=max_read)
        self._slots: dict[str, Callable[[], None]] = {}
        """Job id -> release of the tenant's command slot it holds, until seen ended."""
        self._lock = threading.Lock()
        self._watching = False
        self._closed = threading.Event()

    def start(self, command: Command, on_end: Callable[[], None] | None = None) -> ProcessInfo:
        """Start ``command`` in the sandbox (blocking: call from a thread); ``on_end`` is called
        once this replica sees it end."""
        try:
            state = self.runner.start_command(command)
        except TooManyJobs as full:
            raise ServiceError("quota_exceeded", full.message) from full
        except JobError as failed:
            raise _service_error(failed) from failed
        if on_end is not None:
            with self._lock:
                self._slots[state.id] = on_end
            self._watch()
        return ProcessInfo(id=state.id, status="running")

    def get(self, process_id: str) -> ProcessInfo:
        """The process's status and output so far (blocking)."""
        return self._seen(self._call(self.runner.poll, process_id))

    def kill(self, process_id: str) -> ProcessInfo:
        """Kill the process's whole tree and answer its final state (blocking). A process that
        already finished is reported as it finished."""
        return self._seen(self._call(self.runner.kill, process_id))

    def close(self) -> None:
        """The sandbox is gone (its processes with it), or the service stops: release the slots."""
        self._closed.set()
        with self._lock:
            releases, self._slots = list(self._slots.values()), {}
        for release in releases:
            release()

    def _call(self, operation: Callable[[str], Job], process_id: str) -> Job:
        try:
            return operation(process_id)
        except JobNotFound as missing:
            raise ServiceError("not_found", f"no process {process_id!r} in this sandbox") from missing
        except JobError as failed:
            raise _service_error(failed) from failed

    def _seen(self, job: Job) -> ProcessInfo:
        if job.state.finished:
            self._release(job.state.id)
        return info_of(job)

    def _release(self, job_id: str) -> None:
        with self._lock:
            release = self._slots.pop(job_id, None)
        if release is not None:
            release()

    def _watch(self) -> None:
        """One thread per table while it holds slots: lists the sandbox's jobs every second and
        releases the slots of those that ended, so a process nobody polls frees its slot too."""
        with self._lock:
            if self._watching or self._closed.is_set():
                return
            self._watching = True
        threading.Thread(target=self._watch_loop, name="sandboxes-bg-watch", daemon=True).start()

    def _watch_loop(self) -> None:
        while not self._closed.wait(_WATCH_INTERVAL):
            with self._lock:
                held = set(self._slots)
                if not held:
                    self._watching = False
                    return
            try:
                running = {state.id for state in self.runner.list() if not state.finished}
            except CannotFork:  # a full sandbox, for as long as it stays full: not worth a traceback a second
                continue
            except Exception:
                logger.warning("listing background jobs of %s failed", self.runner.sandbox.id, exc_info=True)
                continue
            for job_id in held - running:
                self._release(job_id)


def _service_error(failed: JobError) -> ServiceError:
    if failed.code == p.FILE_NOT_FOUND:
        return ServiceError("not_found", failed.message)
    if failed.code == p.INVALID_ARGUMENT:  # the request's (its environment): not the backend's fault
        return ServiceError("invalid_request", failed.message)
    if failed.code == p.CONNECTION_LOST:  # a start whose answer was lost: it may run, do not start it again blind
        return ServiceError(p.CONNECTION_LOST, failed.message, status=503)
    if isinstance(failed, (CannotFork, JobSurvived)):  # the tenant's own sandbox: say so, they can act
        return ServiceError("backend_unavailable", failed.message)
    logger.warning("background job operation failed: %s", failed.message)
    return ServiceError("backend_unavailable", "the sandbox's backend failed; the service log has the request id")
