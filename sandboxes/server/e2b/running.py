"""The commands started through envd's ``process.Process/Start``, per sandbox, while they run:
what ``List`` answers and what ``SendSignal`` kills (the command's whole tree, through the
marker the service gives every command). A pid is looked up in its own sandbox only."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

from sandboxes import protocol as p

__all__ = ["Running", "RunningCommands"]


@dataclass
class Running:
    pid: int
    token: str
    """Marks the command's processes (`sandboxes.server.entry.Entry.kill_marked`)."""
    config: dict[str, Any]
    """The ``ProcessConfig`` it was started with, as ``List`` answers it."""
    work: asyncio.Future[p.ExecuteResponse]


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
