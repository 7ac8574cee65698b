"""File watches on any sandbox that holds the exec helper (`sandboxes._mux.HoldsHelper`: Local,
Docker, SSH, Kubernetes): `watch` (or `awatch` on an event loop) watches a directory of the
sandbox and gives what happens under it as `sandboxes.api.WatchEvent`s, through a `Watcher` that
is both a sync and an async iterator.

The helper sends one JSON line per event (`sandboxes._helper._watch`); every byte of it is the
sandbox's, so lines are bounded (`MAX_LINE`) and each is parsed once. Events wait in a bounded
queue until taken: past ``max_queued``, one ``overflow`` event stands for what is dropped.

The watch runs as the sandbox's command user, like its commands: it sees what that user may
list, nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from types import TracebackType

import pydantic

from sandboxes import protocol as p
from sandboxes._mux import Channel, Command, HoldsHelper, MuxBroken, open_channel, watch_spec
from sandboxes._output import Stream
from sandboxes.api import WatchEvent

__all__ = ["MAX_LINE", "MAX_QUEUED", "START_TIMEOUT", "WatchError", "Watcher", "awatch", "watch"]

MAX_LINE = 1 << 16
"""The longest line of the helper's taken as an event (a path is at most 4 KiB, escaped at most
six times): a longer one is dropped, as an overflow."""
MAX_QUEUED = 4096
"""Events a `Watcher` holds for its reader by default."""
START_TIMEOUT = 30.0
"""Seconds `watch` waits for the helper to put the watch in place."""
_STARTED = "start"


class WatchError(Exception):
    """A watch that could not start or broke: ``code`` from the protocol's vocabulary
    (``unavailable``: the sandbox holds no exec helper now), ``message`` a sentence."""

    def __init__(self, code: p.ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: p.ErrorCode = code
        self.message = message


class Watcher:
    """One watch: its events in order, as a sync (``for``) or async (``async for``) iterator,
    which ends once the watch ended and every queued event was taken. The queue never holds more
    than ``max_queued`` events and one overflow. `close` (or leaving its ``with``) ends it."""

    def __init__(self, max_queued: int = MAX_QUEUED) -> None:
        self._max_queued = max(1, max_queued)
        self._events: deque[WatchEvent] = deque()
        self._dropping = False
        self._partial = bytearray()
        self._skipping = False
        self._changed = threading.Condition()
        self._wakers: list[Callable[[], None]] = []
        self._ended = False
        self._started = threading.Event()
        self._channel: Channel | None = None
        self.method: str | None = None
        """How the helper watches: ``inotify`` or ``poll`` (no inotify in the sandbox)."""
        self.error: p.ErrorCode | None = None
        """Once ended: why, when it was not `close` (``timeout``, ``connection_lost``...)."""
        self.message: str | None = None

    # ------------------------------------------------------------ fed by the reader's thread

    def _take(self, chunk: bytes, stream: Stream = "stdout") -> None:
        """The helper's output (on the reader's thread: never blocks). Each byte is copied into
        a line once: a chunk without an end of line only extends the partial line."""
        if stream != "stdout":
            return
        if b"\n" not in chunk:
            if not self._skipping:
                self._partial += chunk
                self._bound_partial()
            return
        first, *lines, rest = chunk.split(b"\n")
        if self._skipping:  # the end of a line dropped as too long
            self._skipping = False
        else:
            lines.insert(0, bytes(self._partial) + first)
        self._partial = bytearray(rest)
        events = [event for event in (self._parse(line) for line in lines if line) if event is not None]
        if events:
            self._queue(events)
        self._bound_partial()

    def _bound_partial(self) -> None:
        """A partial line past `MAX_LINE` is dropped, as an overflow, up to its end."""
        if len(self._partial) > MAX_LINE:
            self._partial.clear()
            self._skipping = True
            self._queue([WatchEvent(type="overflow")])

    def _parse(self, line: bytes) -> WatchEvent | None:
        if len(line) > MAX_LINE:
            return WatchEvent(type="overflow")
        try:
            raw = json.loads(line)
            if isinstance(raw, dict) and raw.get("type") == _STARTED:
                self.method = str(raw.get("method"))
                self._started.set()
                return None
            return WatchEvent.model_validate(raw)
        except (ValueError, pydantic.ValidationError):  # not the helper's: dropped, said
            return WatchEvent(type="overflow")

    def _queue(self, events: list[WatchEvent]) -> None:
        with self._changed:
            for event in events:
                if event.type == "overflow" and self._dropping:
                    continue
                if len(self._events) >= self._max_queued:
                    if not self._dropping:
                        self._dropping = True
                        self._events.append(WatchEvent(type="overflow"))
                    continue
                self._dropping = event.type == "overflow"
                self._events.append(event)
            self._wake()

    def _end(self) -> None:
        """The channel ended (on the reader's thread)."""
        with self._changed:
            self._ended = True
            self._started.set()
            self._wake()

    def _wake(self) -> None:
        self._changed.notify_all()
        wakers, self._wakers = self._wakers, []
        for waker in wakers:
            waker()

    # ------------------------------------------------------------ taken by the caller

    def get(self, timeout: float | None = None) -> WatchEvent | None:
        """The next event, waiting at most ``timeout`` seconds (``None``: until one comes or
        the watch ends); ``None`` when none came in time or the watch ended with none left."""
        with self._changed:
            self._changed.wait_for(lambda: self._events or self._ended, timeout)
            return self._pop()

    def _pop(self) -> WatchEvent | None:
        if not self._events:
            return None
        event = self._events.popleft()
        if not self._events:
            self._dropping = False
        return event

    def __iter__(self) -> Iterator[WatchEvent]:
        return self

    def __next__(self) -> WatchEvent:
        event = self.get()
        if event is None:
            raise StopIteration
        return event

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self

    async def __anext__(self) -> WatchEvent:
        loop = asyncio.get_running_loop()
        while True:
            arrived: asyncio.Future[None] = loop.create_future()

            def settle(future: asyncio.Future[None] = arrived) -> None:
                if not future.done():
                    future.set_result(None)

            def wake() -> None:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(settle)

            with self._changed:
                event = self._pop()
                if event is not None:
                    return event
                if self._ended:
                    raise StopAsyncIteration
                self._wakers.append(wake)
            try:
                await arrived
            finally:  # cancelled (a timeout around it): no waker left behind
                with self._changed, contextlib.suppress(ValueError):
                    self._wakers.remove(wake)

    @property
    def ended(self) -> bool:
        """Whether the watch ended (events may still be queued)."""
        return self._ended

    def stop(self) -> None:
        """End the watch without waiting for the helper to confirm (never blocks for long)."""
        if self._channel is not None and not self._ended:
            self._channel.kill()

    def close(self, timeout: float = 10.0) -> None:
        """End the watch (its queued events stay to be taken), waiting at most ``timeout``
        seconds for the helper to confirm."""
        if self._channel is not None and not self._ended:
            self._channel.kill()
            with contextlib.suppress(MuxBroken):
                self._channel.wait(timeout)

    async def aclose(self) -> None:
        """`close` on an event loop."""
        if self._channel is not None and not self._ended:
            self._channel.kill()
            with contextlib.suppress(MuxBroken):
                await self._channel.wait_async()

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    async def __aenter__(self) -> Watcher:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def watch(
    sandbox: object,
    path: str,
    *,
    recursive: bool = False,
    timeout: float | None = None,
    max_queued: int = MAX_QUEUED,
) -> Watcher:
    """Watch the directory ``path`` of ``sandbox`` (with its subdirectories when
    ``recursive``), for ``timeout`` seconds at most (``None``: until closed); returned once the
    watch is in place, so that whatever happens after is reported. `WatchError` when it cannot
    start: ``unavailable`` (no exec helper), ``file_not_found``, ``not_a_directory``,
    ``permission_denied``, ``invalid_path``."""
    if not path.startswith("/"):
        raise WatchError(p.INVALID_PATH, f"{path!r} is not absolute: a watch needs an absolute path")
    if "\0" in path:
        raise WatchError(p.INVALID_PATH, f"{path!r} holds a NUL byte: no path may")
    helper = sandbox.exec_helper() if isinstance(sandbox, HoldsHelper) else None
    if helper is None:
        reason = "it runs no exec helper now" if isinstance(sandbox, HoldsHelper) else "it holds no exec helper"
        raise WatchError(p.UNAVAILABLE, f"cannot watch files in {type(sandbox).__name__}: {reason}")
    watcher = Watcher(max_queued)
    try:
        channel = open_channel(
            helper,
            Command("", timeout or 0, output_limit=0),
            on_output=watcher._take,
            spec=watch_spec(path, recursive=recursive),
        )
    except MuxBroken as broken:
        raise WatchError(p.CONNECTION_LOST, f"the exec helper broke: {broken}") from broken
    watcher._channel = channel
    channel.on_end(lambda: _ended(watcher, channel, timeout))
    if not watcher._started.wait(START_TIMEOUT):
        channel.kill()
        raise WatchError(p.TIMEOUT, f"the watch of {path} did not start within {START_TIMEOUT:g} s")
    if watcher.method is None:  # it ended before it started
        _start_failed(channel, path)
    return watcher


async def awatch(
    sandbox: object,
    path: str,
    *,
    recursive: bool = False,
    timeout: float | None = None,  # noqa: ASYNC109 (the watch's lifetime in the helper, not a wait here)
    max_queued: int = MAX_QUEUED,
) -> Watcher:
    """`watch` from an event loop (the helper's start, if one is needed, runs on a thread)."""
    return await asyncio.to_thread(watch, sandbox, path, recursive=recursive, timeout=timeout, max_queued=max_queued)


def _start_failed(channel: Channel, path: str) -> None:
    """Raise the `WatchError` of a watch the helper refused (its E frame's reason)."""
    try:
        answer = channel.wait(START_TIMEOUT)
    except MuxBroken as broken:
        raise WatchError(p.CONNECTION_LOST, f"the exec helper broke: {broken}") from broken
    message = (answer.message if answer is not None else None) or "the watch ended before it started"
    reason = message.removeprefix("could not start command: ")
    for name, code in _REFUSALS:
        if reason.startswith(name):
            raise WatchError(code, f"cannot watch {path}: {reason}")
    raise WatchError(p.BACKEND_ERROR, f"cannot watch {path}: {reason}")


_REFUSALS: tuple[tuple[str, p.ErrorCode], ...] = (
    ("FileNotFoundError", p.FILE_NOT_FOUND),
    ("NotADirectoryError", p.NOT_A_DIRECTORY),
    ("PermissionError", p.PERMISSION_DENIED),
)


def _ended(watcher: Watcher, channel: Channel, timeout: float | None) -> None:
    """The watch ended (on the reader's thread): why, when it was not asked to, then its end."""
    try:
        answer = channel.wait(0)
    except MuxBroken as broken:
        watcher.error, watcher.message = p.CONNECTION_LOST, f"the exec helper broke: {broken}"
    else:
        if answer is not None and answer.error == p.TIMEOUT:
            watcher.error, watcher.message = p.TIMEOUT, f"the watch reached its timeout ({timeout or 0:g} s)"
        elif answer is not None and answer.error is not None:
            watcher.error, watcher.message = answer.error, answer.message
    watcher._end()
