"""Streamed commands followed from their sandbox's record, for when this replica does not hold
them: it restarted (``kill -9`` too), or another replica started them.

Every streamed command asks the sandbox's exec helper for a record (`sandboxes._helper._record`,
`with_record`): the helper keeps the head and the tail of its output (stdout and stderr in the
order they came, with where each run of one stream starts; at most `RECORD_LIMIT` bytes) and
its status in the sandbox, and when its client (this service)
goes away it runs the command on to its end or its timeout with no client, writing the record.
A re-attach that finds no command in memory follows that record (`recorded_events`): it polls
the sandbox (one ``execute`` a poll, every `POLL_FIRST` seconds while output comes, backing off
to `POLL_MAX` while it does not) and sends what it read as the stream's ``output`` events, each
with its stream as the live stream named it, at the same offsets (over stdout and stderr
together, in the order they came: a re-attach from an offset gets each byte once), then the
``exit``. A record that names no streams (one past its runs, or an older helper's) sends
``merged``. A record whose helper vanished without its status
answers ``connection_lost``. What a poll reads is bounded (`EVENT_BYTES`, and the record's
bound for the exit's output) and parsed as the hostile bytes it may be (`sandboxes.jobs`). A
kill of such a command (`kill_recorded`) kills by the marker its record names.

Where it holds: a sandbox whose helper outlives the service's connection to it: Docker, SSH;
Kubernetes where the API server leaves an exec running once its connection closed (the tests'
fake one kills it: the record then reads ``lost``, with the output recorded until then). A local
jail dies with the service process that holds it (``bwrap --die-with-parent``), its commands
and records with it: a re-attach there answers ``not_found``. A sandbox without an exec helper
(an image without python3) keeps no record. Sandboxes that share one SSH user (``isolation``
``none``) share ``/tmp``, and so each other's records, as they share their background jobs.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from sandboxes import protocol as p
from sandboxes._helper._kill import RECORD_ENV
from sandboxes._helper._record import RECORD_LIMIT
from sandboxes._output import Stream
from sandboxes.api import ExecuteResult, StreamEvent
from sandboxes.base import BaseSandbox
from sandboxes.jobs import Job, JobError, JobNotFound, JobRunner
from sandboxes.server.errors import ServiceError
from sandboxes.server.processes import Command, result_of
from sandboxes.server.streamed import (
    EVENT_BYTES,
    KILL_WAIT,
    StreamedCommand,
    StreamedCommands,
    event_line,
    kill_streamed,
    stream_events,
)

logger = logging.getLogger(__name__)

__all__ = [
    "POLL_FIRST",
    "POLL_MAX",
    "RECORD_LIMIT",
    "attach_events",
    "kill_command",
    "kill_recorded",
    "recorded_events",
    "with_record",
]

POLL_FIRST = 0.05
"""Seconds between polls of a record while its output comes."""
POLL_MAX = 1.0
"""Most seconds between polls of a record whose command is quiet."""


def with_record(command: Command, command_id: str) -> Command:
    """``command`` asking the sandbox's helper to record it under ``command_id``."""
    return replace(command, env={**command.env, RECORD_ENV: f"{command_id}:{command.output_limit}"})


def _held(streamed: StreamedCommands, sandbox_id: str, command_id: str) -> tuple[StreamedCommand | None, ServiceError]:
    """(the command as this replica holds it, unless its helper's connection was lost under it:
    the sandbox's record then knows more; the `not_found` to answer if the record is missing)."""
    try:
        command = streamed.find(sandbox_id, command_id)
    except ServiceError as missing:
        if missing.code != "not_found":
            raise
        return None, missing
    return command, ServiceError("not_found", f"no record of streamed command {command_id!r} in this sandbox")


def _lost(command: StreamedCommand) -> bool:
    """Whether it ended as ``connection_lost``: its helper may run it on (`_record.linger`)."""
    return command.result is not None and command.result.error == p.CONNECTION_LOST


async def attach_events(
    streamed: StreamedCommands, sandbox: BaseSandbox, sandbox_id: str, command_id: str, offset: int, keepalive: float
) -> AsyncIterator[bytes]:
    """The events of a re-attach (``GET .../execute/{id}/stream``): from this replica's memory,
    else (not held here, or its helper's connection lost) from the sandbox's record."""
    command, missing = _held(streamed, sandbox_id, command_id)
    if command is not None and not _lost(command):
        return stream_events(command, offset, keepalive)
    try:
        return await recorded_events(sandbox, command_id, offset, keepalive, missing)
    except ServiceError as absent:
        if command is None or absent is not missing:
            raise
        return stream_events(command, offset, keepalive)


async def kill_command(
    streamed: StreamedCommands,
    sandbox: BaseSandbox,
    kill_marked: Callable[[str], None],
    sandbox_id: str,
    command_id: str,
) -> ExecuteResult:
    """A kill (``DELETE .../execute/{id}``): `kill_streamed` on the command this replica holds,
    else (not held here, or its helper's connection lost) `kill_recorded`."""
    command, missing = _held(streamed, sandbox_id, command_id)
    if command is not None and not _lost(command):
        return await kill_streamed(command)
    try:
        return await kill_recorded(sandbox, kill_marked, command_id, missing)
    except ServiceError as absent:
        if command is None or absent is not missing:
            raise
        return await kill_streamed(command)


async def recorded_events(
    sandbox: BaseSandbox, command_id: str, offset: int, keepalive: float, missing: ServiceError
) -> AsyncIterator[bytes]:
    """NDJSON lines of `StreamEvent` for the command recorded under ``command_id``, from byte
    ``offset`` (as `sandboxes.server.streamed.stream_events`); ``missing`` is raised, before any
    line, when the sandbox has no such record."""
    runner = JobRunner(sandbox, max_read=max(EVENT_BYTES, RECORD_LIMIT))
    first = await _read(runner, command_id, offset, EVENT_BYTES, missing)
    return _events(runner, command_id, offset, keepalive, first, missing)


async def kill_recorded(
    sandbox: BaseSandbox,
    kill_marked: Callable[[str], None],
    command_id: str,
    missing: ServiceError,
    wait: float = KILL_WAIT,
) -> ExecuteResult:
    """Kill the command recorded under ``command_id`` by the marker its record names (as
    `sandboxes.server.streamed.kill_streamed` does) and answer its result once its record says
    it ended: at once if it had; ``backend_unavailable`` if it has not ``wait`` seconds later."""
    runner = JobRunner(sandbox, max_read=RECORD_LIMIT)
    job = await _read(runner, command_id, 0, RECORD_LIMIT, missing)
    if not job.state.finished:
        try:
            marker = await asyncio.to_thread(runner.record_marker, command_id)
            await asyncio.to_thread(kill_marked, marker)
        except (JobError, OSError) as failed:
            logger.warning("killing recorded command %s failed", command_id, exc_info=True)
            raise ServiceError(
                "backend_unavailable", f"streamed command {command_id!r} could not be killed: the backend failed"
            ) from failed
    deadline = asyncio.get_running_loop().time() + wait
    delay = POLL_FIRST
    while not job.state.finished:
        if asyncio.get_running_loop().time() >= deadline:
            raise ServiceError(
                "backend_unavailable",
                f"streamed command {command_id!r} was killed but had not ended {wait:g} s later; retry",
                headers={"Retry-After": "1"},
            )
        await asyncio.sleep(delay)
        delay = min(2 * delay, POLL_MAX)
        job = await _read(runner, command_id, 0, RECORD_LIMIT, missing)
    return result_of(job.response())


async def _read(runner: JobRunner, command_id: str, offset: int, limit: int, missing: ServiceError) -> Job:
    try:
        return await asyncio.to_thread(runner.read_record, command_id, offset, limit)
    except JobNotFound as absent:
        raise missing from absent
    except JobError as failed:
        logger.warning("reading the record of streamed command %s failed: %s", command_id, failed.message)
        raise ServiceError(
            "backend_unavailable", "the sandbox's record of the command could not be read; retry"
        ) from failed


async def _events(
    runner: JobRunner, command_id: str, offset: int, keepalive: float, job: Job, missing: ServiceError
) -> AsyncIterator[bytes]:
    yield event_line(StreamEvent(type="output", data="", id=command_id, offset=offset))
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    position, delay, quiet = offset, POLL_FIRST, 0.0
    current: Stream = "stdout"
    while True:
        for start, data, stream in job.pieces():
            if start != position:  # the record dropped the middle: a character cut by the gap is lost
                decoder.reset()
            if stream != current:  # a character cut where the other stream began ends here
                if cut := decoder.decode(b"", final=True):
                    yield _output(cut, current, start)
                decoder.reset()
                current = stream
            position = start + len(data)
            if text := decoder.decode(data):
                yield _output(text, current, position - len(decoder.getstate()[0]))
        if job.chunks:
            delay, quiet = POLL_FIRST, 0.0
            if len(job.output) < EVENT_BYTES:  # else more is waiting: read on at once
                await asyncio.sleep(POLL_FIRST)
        elif job.state.finished:
            if text := decoder.decode(b"", final=True):
                yield _output(text, current, position)
            whole = await _read(runner, command_id, 0, RECORD_LIMIT, missing)
            yield event_line(StreamEvent(type="exit", result=result_of(whole.response())))
            return
        else:
            await asyncio.sleep(delay)
            quiet += delay
            delay = min(2 * delay, POLL_MAX)
            if quiet >= keepalive:
                quiet = 0.0
                yield event_line(StreamEvent(type="output", data="", offset=position - len(decoder.getstate()[0])))
        job = await _read(runner, command_id, position, EVENT_BYTES, missing)


def _output(text: str, stream: Stream, offset: int) -> bytes:
    """An ``output`` event's line, as a live stream sends it (stdout's without ``stream``)."""
    return event_line(
        StreamEvent(type="output", data=text, offset=offset, stream=None if stream == "stdout" else stream)
    )
