"""Streamed commands that outlive their stream: each keeps its output (head and tail, bounded by
its output limit) and its result in this replica, so readers can follow it from a byte
offset (a tenant at most its ``max_commands`` re-attached ones at once: `Readers`), and a
client that lost its connection re-attaches where it was.

A command does not depend on its connection: it runs until it ends or its own timeout, and
its record stays for `KEEP_FOR` seconds after (at most `KEEP_FINISHED` ended ones per sandbox,
`KEEP_BYTES` for all).
A stream sends ``output`` events, each with the byte offset its text ends at, then one ``exit``
event. Offsets count the command's stdout and stderr together, in the order they arrived; an
event carries one stream's text, named by its ``stream`` (absent: stdout, the shape clients
that predate it read; ``merged`` where the backend could not keep them apart). Its first
event, and a keep-alive whenever nothing else was sent for the keep-alive interval (so a proxy
never sees an idle connection), are ``output`` events with empty text, the
first carrying the command's id: clients that predate them see nothing new. Records live in
the service's memory; another replica, or this one after a restart, follows the command from
the sandbox's own record of it instead (`sandboxes.server.recorded`).
"""

from __future__ import annotations

import asyncio
import bisect
import codecs
import contextlib
import logging
import threading
import time
from array import array
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

from sandboxes import protocol as p
from sandboxes._output import OutputBuffer, Stream
from sandboxes.api import ExecuteResult, StreamEvent
from sandboxes.server.errors import ServiceError
from sandboxes.server.logs import unique_id
from sandboxes.server.processes import result_of

logger = logging.getLogger(__name__)

__all__ = [
    "EVENT_BYTES",
    "KEEP_BYTES",
    "KEEP_FINISHED",
    "KEEP_FOR",
    "RECORD_BYTES",
    "Readers",
    "Replay",
    "StreamedCommand",
    "StreamedCommands",
    "event_line",
    "kill_streamed",
    "stream_events",
]

KEEP_FINISHED = 8
"""Ended streamed commands kept per sandbox for re-attaching (the newest)."""
KEEP_FOR = 300.0
"""Seconds an ended streamed command is kept for re-attaching."""
KEEP_BYTES = 64 << 20
"""Most bytes of output the ended streamed commands kept for re-attaching hold, together (the
oldest go first)."""
RECORD_BYTES = 16 << 10
"""What an ended record counts for in `KEEP_BYTES` besides its output, so that records that
printed nothing are bounded in number too (at most 4,096)."""
EVENT_BYTES = 256 << 10
"""Most output bytes in one ``output`` event: what a stream whose client stopped reading holds,
with its text and its JSON line (up to six times as big) beside it."""


MAX_SEGMENTS = 1 << 16
"""Most runs of one stream a record keeps apart (nine bytes each); past them, what arrives is
recorded as ``merged`` until the runs kept fall below it again."""
_STREAMS: tuple[Stream, ...] = ("stdout", "stderr", "merged")


class Replay(OutputBuffer):
    """A command's output by absolute byte offset: what `sandboxes._output.OutputBuffer` keeps
    (the first ``limit - limit // 2`` bytes and at least the last ``limit // 2``, at most twice
    that until `compact`), stdout and stderr together; the middle of a longer output is gone.
    Which stream each kept byte came from is kept as runs (at most `MAX_SEGMENTS`)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self._starts = array("q")
        """Offset where each run of one stream starts, ascending."""
        self._tags = bytearray()
        """Each run's stream, as its index in `_STREAMS`."""

    @property
    def kept(self) -> int:
        """Bytes of output kept, and what the runs of streams over them take."""
        return len(self._head) + len(self._tail) + 9 * len(self._starts)

    @property
    def runs(self) -> int:
        return len(self._starts)

    def write(self, data: bytes, stream: Stream = "merged") -> None:
        tag = _STREAMS.index(stream)
        if self._tags and self._tags[-1] != tag and len(self._starts) >= MAX_SEGMENTS:
            tag = _STREAMS.index("merged")
        if data and (not self._tags or self._tags[-1] != tag):
            self._starts.append(self.total)
            self._tags.append(tag)
        super().write(data)
        self._forget_dropped()

    def compact(self) -> None:
        """Keep no more than `sandboxes._output.OutputBuffer` would: the output has ended."""
        if len(self._tail) > self._half:
            del self._tail[: len(self._tail) - self._half]
        self._forget_dropped()

    def _forget_dropped(self) -> None:
        """Drop the runs that lie wholly in the dropped middle."""
        first = bisect.bisect_left(self._starts, len(self._head))
        last = bisect.bisect_right(self._starts, self.total - len(self._tail)) - 1  # the run the tail starts in
        if last > first:
            del self._starts[first:last]
            del self._tags[first:last]

    def read(self, offset: int, size: int) -> tuple[int, bytes, Stream]:
        """Up to ``size`` bytes of one stream from ``offset``, or from the first kept byte past
        it (the returned offset says where they start), and their stream; empty at the end."""
        if offset < len(self._head):
            start, data = offset, self._head
            base = 0
        else:
            base = self.total - len(self._tail)
            start, data = max(offset, base), self._tail
        run = bisect.bisect_right(self._starts, start) - 1
        if run < 0:
            return start, b"", "stdout"
        end = self._starts[run + 1] if run + 1 < len(self._starts) else self.total
        size = min(size, end - start)
        return start, bytes(data[start - base : start - base + size]), _STREAMS[self._tags[run]]


class StreamedCommand:
    """One streamed command's output and, once it ended, its result; written from any thread,
    read by streams on the event loop, which it wakes when either changes."""

    def __init__(self, sandbox_id: str, output_limit: int, loop: asyncio.AbstractEventLoop) -> None:
        self.id = unique_id()
        self.sandbox_id = sandbox_id
        self.result: ExecuteResult | None = None
        self.ended_at: float | None = None
        self._replay = Replay(output_limit)
        self._lock = threading.Lock()
        self._loop = loop
        self._changed = asyncio.Event()
        self._wake_pending = False
        self.kill: Callable[[], None] | None = None
        """Kills the command's whole process tree (blocking); set by `follow`."""

    @property
    def total(self) -> int:
        """Bytes of output so far."""
        with self._lock:
            return self._replay.total

    def write(self, data: bytes, stream: Stream = "merged") -> None:
        """The command's output hook (`sandboxes._output.OutputHook`): never blocks (it may run
        on a transport's thread)."""
        with self._lock:
            self._replay.write(data, stream)
            if self._wake_pending:
                return
            self._wake_pending = True
        with contextlib.suppress(RuntimeError):  # the loop closed: the service stopped, no one reads
            self._loop.call_soon_threadsafe(self._wake)

    @property
    def size(self) -> int:
        """Bytes held: the output kept, and its text in the result."""
        with self._lock:
            return 2 * self._replay.kept

    def finish(self, result: ExecuteResult) -> None:
        """The command ended (on the event loop, after its last output)."""
        with self._lock:
            self._replay.compact()
            self.result = result
            self.ended_at = time.monotonic()
        self._wake()

    def follow(self, work: asyncio.Future[p.ExecuteResponse], kill: Callable[[], None] | None = None) -> None:
        """Record ``work``'s result (the command's) when it ends; ``kill`` (blocking) kills
        its whole process tree."""
        self.kill = kill
        work.add_done_callback(self._ended)

    def _ended(self, work: asyncio.Future[p.ExecuteResponse]) -> None:
        if work.cancelled():
            self.finish(_failed(p.CONNECTION_LOST, "the command was cancelled (the service is stopping)"))
        elif (exc := work.exception()) is not None:
            logger.warning("streamed command %s failed", self.id, exc_info=exc)
            self.finish(_failed(p.UNAVAILABLE, "the sandbox's backend failed; the service log has the request id"))
        else:
            self.finish(result_of(work.result()))

    def read(self, offset: int) -> tuple[int, bytes, Stream, ExecuteResult | None]:
        """Output of one stream from ``offset`` (see `Replay.read`) and, once all of it was
        read, the result."""
        with self._lock:
            start, data, stream = self._replay.read(offset, EVENT_BYTES)
            done = self.result if start + len(data) >= self._replay.total else None
            return start, data, stream, done

    def changed(self) -> asyncio.Event:
        """Set at the next change after this call (on the event loop)."""
        return self._changed

    def _wake(self) -> None:
        with self._lock:
            self._wake_pending = False
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()


class StreamedCommands:
    """This replica's streamed commands, by sandbox and id: the running ones (bounded by the
    tenants' command slots) and the newest ended ones: for `KEEP_FOR` seconds, at most
    `KEEP_FINISHED` a sandbox and `KEEP_BYTES` in all."""

    def __init__(
        self,
        keep: int = KEEP_FINISHED,
        keep_for: float = KEEP_FOR,
        keep_bytes: int = KEEP_BYTES,
        record_bytes: int = RECORD_BYTES,
    ) -> None:
        self._keep = keep
        self._keep_for = keep_for
        self._keep_bytes = keep_bytes
        self._record_bytes = record_bytes
        self._commands: dict[tuple[str, str], StreamedCommand] = {}

    def add(self, command: StreamedCommand) -> None:
        self._prune(command.sandbox_id)
        self._commands[command.sandbox_id, command.id] = command

    def find(self, sandbox_id: str, command_id: str) -> StreamedCommand:
        self._prune(sandbox_id)
        command = self._commands.get((sandbox_id, command_id))
        if command is None:
            raise ServiceError(
                "not_found",
                f"no streamed command {command_id!r} in this sandbox (it ended over {self._keep_for:g} s ago, "
                "or another replica or a restarted service ran it)",
            )
        return command

    def _prune(self, sandbox_id: str) -> None:
        horizon = time.monotonic() - self._keep_for
        ended = sorted(
            (c for c in self._commands.values() if c.ended_at is not None), key=lambda c: -(c.ended_at or 0.0)
        )
        held, mine = 0, 0
        for command in ended:  # newest first
            held += command.size + self._record_bytes
            mine += command.sandbox_id == sandbox_id
            old = command.ended_at is not None and command.ended_at < horizon
            if old or held > self._keep_bytes or (command.sandbox_id == sandbox_id and mine > self._keep):
                del self._commands[command.sandbox_id, command.id]


Close = Callable[[], Awaitable[None]]
"""Ends a reader's stream (a response's last step, whether or not its client stayed)."""


class Readers:
    """Re-attached streams open at once, per tenant, at most its cap: each holds up to an event
    (`EVENT_BYTES` of output, its text and its JSON line) while its client reads, so their
    number, not the clients' goodwill, bounds the memory a tenant's readers take."""

    def __init__(self) -> None:
        self._open: dict[str, int] = {}

    async def follow(self, tenant: str, cap: int, events: AsyncIterator[bytes]) -> tuple[AsyncIterator[bytes], Close]:
        """``events`` counted as one of the tenant's readers until it ends or the returned
        close is called (either may come first), or ``rate_limited`` if ``cap`` are open."""
        if self._open.get(tenant, 0) >= cap:
            raise ServiceError(
                "rate_limited",
                f"tenant {tenant!r} already follows {cap} streamed commands at once, its maximum; retry when one ends",
                headers={"Retry-After": "1"},
            )
        held = self._held(tenant, events)
        first = await anext(held)  # started: its `finally` now runs however the stream ends
        return _chain(first, held), held.aclose

    async def _held(self, tenant: str, events: AsyncIterator[bytes]) -> AsyncGenerator[bytes]:
        self._open[tenant] = self._open.get(tenant, 0) + 1
        try:
            async for line in events:
                yield line
        finally:
            left = self._open.pop(tenant) - 1
            if left:
                self._open[tenant] = left


async def _chain(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for line in rest:
        yield line


def stream_events(command: StreamedCommand, offset: int, keepalive: float) -> AsyncIterator[bytes]:
    """NDJSON lines of `StreamEvent` for ``command`` from byte ``offset``: an empty ``output``
    with its id, ``output`` events (an empty one when ``keepalive`` seconds passed without
    any), then ``exit``.
    Leaving early (the client disconnected) leaves the command running. An offset past the
    output so far is refused here, before any line."""
    total = command.total
    if offset > total:
        raise ServiceError("invalid_request", f"offset {offset} is past the command's output ({total} bytes so far)")
    return _events(command, offset, keepalive)


async def _events(command: StreamedCommand, offset: int, keepalive: float) -> AsyncIterator[bytes]:
    yield event_line(StreamEvent(type="output", data="", id=command.id, offset=offset))
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    position = offset
    current: Stream = "stdout"
    while True:
        changed = command.changed()
        start, data, stream, result = command.read(position)
        if start != position:  # the middle was dropped: a character cut by the gap is lost with it
            decoder.reset()
        if data and stream != current:  # a character cut where the other stream began ends here
            cut = decoder.decode(b"", final=True)
            decoder.reset()
            if cut:
                yield _output(cut, current, start)
            current = stream
        position = start + len(data)
        text = decoder.decode(data, final=result is not None)
        if text:
            yield _output(text, current, position - _pending(decoder))
        if result is not None:
            yield event_line(StreamEvent(type="exit", result=result))
            return
        if data:
            continue
        try:
            await asyncio.wait_for(changed.wait(), keepalive)
        except TimeoutError:
            yield event_line(StreamEvent(type="output", data="", offset=position - _pending(decoder)))


def _output(text: str, stream: Stream, offset: int) -> bytes:
    """An ``output`` event's line; stdout's without ``stream``, the shape clients that predate it read."""
    return event_line(
        StreamEvent(type="output", data=text, offset=offset, stream=None if stream == "stdout" else stream)
    )


KILL_WAIT = 10.0
"""Seconds a kill of a streamed command waits for it to end once its tree was signalled."""


async def kill_streamed(command: StreamedCommand, wait: float = KILL_WAIT) -> ExecuteResult:
    """Kill ``command``'s process tree (as the kill of a plain execute whose client left does)
    and answer its result once it ended: at once if it had; ``backend_unavailable`` if it has not
    ended ``wait`` seconds after the kill. Killing an ended command does nothing."""
    if command.result is None and command.kill is not None:
        try:
            await asyncio.to_thread(command.kill)
        except Exception as exc:
            logger.warning("killing streamed command %s failed", command.id, exc_info=True)
            raise ServiceError(
                "backend_unavailable", f"streamed command {command.id!r} could not be killed: the backend failed"
            ) from exc
    deadline = asyncio.get_running_loop().time() + wait
    while (result := command.result) is None:
        changed = command.changed()
        if command.result is not None:
            continue
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise ServiceError(
                "backend_unavailable",
                f"streamed command {command.id!r} was killed but had not ended {wait:g} s later; retry",
                headers={"Retry-After": "1"},
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), left)
    return result


def _failed(code: p.ErrorCode, message: str) -> ExecuteResult:
    return ExecuteResult(output="", exit_code=None, error=code, message=message)


def _pending(decoder: codecs.IncrementalDecoder) -> int:
    """Bytes the decoder holds back (the start of a character cut by a chunk's end)."""
    buffered: bytes = decoder.getstate()[0]
    return len(buffered)


def event_line(event: StreamEvent) -> bytes:
    """The event's JSON line, without the top-level fields its type does not carry."""
    absent = {name for name in _OPTIONAL if getattr(event, name) is None}
    return event.model_dump_json(exclude=absent).encode("utf-8") + b"\n"


_OPTIONAL = ("data", "result", "id", "offset", "stream")
