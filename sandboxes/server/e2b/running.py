"""The commands started through envd's ``process.Process/Start``, per sandbox, while they run:
what ``List`` answers, what ``SendSignal`` kills (the command's whole tree, through the marker
the service gives every command) and what ``Connect`` reattaches to (each listener gets every
event from the moment it joined). A pid is looked up in its own sandbox only."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

from sandboxes import protocol as p
from sandboxes._mux import Channel
from sandboxes._output import Stream

__all__ = ["Event", "Running", "RunningCommands", "outcome"]

Event = tuple[Stream, bytes] | p.ExecuteResponse | BaseException
"""What a listener receives: a chunk of output with its stream, then the command's outcome."""


@dataclass
class Running:
    pid: int
    token: str
    """Marks the command's processes (`sandboxes.server.entry.Entry.kill_marked`)."""
    config: dict[str, Any]
    """The ``ProcessConfig`` it was started with, as ``List`` answers it."""
    work: asyncio.Future[p.ExecuteResponse]
    listeners: set[asyncio.Queue[Event]] = field(default_factory=set)
    channel: Channel | None = None
    """Its stdin, held open, when it was started with ``stdin: true`` on the sandbox's helper."""

    def publish(self, event: Event) -> None:
        """``event`` to every listener (on the event loop's thread)."""
        for listener in self.listeners:
            listener.put_nowait(event)

    def listen(self) -> asyncio.Queue[Event]:
        """A new listener's queue: the events from now on, the outcome already there if it ended."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        if self.work.done():
            queue.put_nowait(outcome(self.work))
        else:
            self.listeners.add(queue)
        return queue


def outcome(done: asyncio.Future[p.ExecuteResponse]) -> p.ExecuteResponse | BaseException:
    """How a command's work ended, as its listeners receive it."""
    if done.cancelled():
        return asyncio.CancelledError()
    return done.exception() or done.result()


@dataclass
class RunningCommands:
    _pids: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))
    _by_sandbox: dict[str, dict[int, Running]] = field(default_factory=dict)

    def next_pid(self) -> int:
        return next(self._pids)

    def add(self, sandbox_id: str, running: Running) -> None:
        """Kept until its work ends."""
        self._by_sandbox.setdefault(sandbox_id, {})[running.pid] = running
        running.work.add_done_callback(lambda _: self._drop(sandbox_id, running.pid))

    def _drop(self, sandbox_id: str, pid: int) -> None:
        commands = self._by_sandbox.get(sandbox_id, {})
        commands.pop(pid, None)
        if not commands:
            self._by_sandbox.pop(sandbox_id, None)

    def find(self, sandbox_id: str, pid: int) -> Running | None:
        return self._by_sandbox.get(sandbox_id, {}).get(pid)

    def of(self, sandbox_id: str) -> list[Running]:
        return sorted(self._by_sandbox.get(sandbox_id, {}).values(), key=lambda running: running.pid)
