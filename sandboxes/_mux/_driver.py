"""`HelperDriver`: the one exec helper a sandbox holds, and how its commands and file ops are
driven through it, as an object every backend (Docker, Kubernetes, SSH, the local jail) holds;
what differs per backend is its `HelperTransport` (how a helper starts, how a command runs
without one, how an out-of-memory kill shows), its `TransportWords` and, where it can refuse a
command outright, its `Refusal`.

The order of it all lives here alone: fill in the sandbox's defaults, ask the refusal, try the
helper (the resend rule of `run_command_once` and `run_native_once`), fall back to the
transport's own exec, answer
the transport's own failures in the protocol's words, then tell an out-of-memory kill from a
plain exit 137. A helper is held one at a time, started under a lock when a call finds none
alive, as `HelperStarts` allows, and let go of when found broken.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sandboxes import protocol as p
from sandboxes._mux._capable import AwaitedCommand
from sandboxes._mux._command import Command, CommandDefaults
from sandboxes._mux._resend import run_command_once, run_native_once
from sandboxes._mux._starts import HelperStarts
from sandboxes._mux._stream import MuxBroken
from sandboxes._mux.client import MuxClient, command_marker, kill_tagged
from sandboxes._output import OutputHook, out_of_memory

if TYPE_CHECKING:
    from sandboxes.base import Call

Refusal = Callable[[Command], p.ExecuteResponse | None]
"""A command's answer where nothing may run at all (a closed sandbox, a working directory that is
not there); ``None``: run it."""

__all__ = ["HelperDriver", "HelperTransport", "Refusal", "TransportWords"]


class HelperTransport(Protocol):
    """What one backend does that the driver cannot: start a helper, run a command without one,
    answer its own failures, and look at its memory cgroup."""

    @property
    def memory_limit(self) -> str:
        """The memory limit, as `sandboxes._output.out_of_memory` names it to the caller."""
        ...

    def start_helper(self) -> MuxClient | None:
        """A new helper, past its hello; one of the driver's ``start_failures`` if it did not start;
        ``None``: no helper may start now and that is no failure (an SSH connection whose channel
        slots are nearly all taken keeps them for short channels; a closed sandbox), so the call
        runs alone and the next one asks again."""
        ...

    def python_missing(self) -> bool:
        """Whether the sandbox says python3 is not there (then no start is tried again); a
        question that failed cannot tell (``False``)."""
        ...

    def run_alone(self, command: Command, on_output: OutputHook | None) -> p.ExecuteResponse:
        """``command`` without the helper (there is none, or none could start): the transport's
        own exec."""
        ...

    def answer(self, error: Exception) -> p.ExecuteResponse | None:
        """The protocol's answer for ``error``, raised by the transport while a command or a file
        op ran or its helper started; ``None``: not the transport's own, it propagates."""
        ...

    def oom_killed(self) -> bool:
        """Whether the sandbox's memory cgroup killed something since the last look."""
        ...


@dataclass(frozen=True)
class TransportWords:
    """How a transport words its helper's failures, in its own logger."""

    logger: logging.Logger
    subject: str
    """The sandbox, as a log line names it."""
    fallback: str
    """What commands cost while no helper runs (``one docker exec per command``)."""
    restart: str
    """What the next call does after a helper broke (``restarting it``)."""
    command_lost: str
    """``connection_lost``'s message for a command whose helper broke after it was sent."""
    file_op_lost: str
    """``connection_lost``'s message for a file op whose helper broke after it was sent."""


class HelperDriver:
    """The one exec helper of a sandbox, held one at a time, and its commands and file ops.
    Thread-safe. An answer the transport makes of a failure has no exit code, so it is never taken
    for an out-of-memory kill: the memory cgroup is looked at only for a command that exited 137."""

    def __init__(
        self,
        transport: HelperTransport,
        words: TransportWords,
        defaults: CommandDefaults,
        *,
        enabled: bool,
        start_failures: tuple[type[Exception], ...] = (MuxBroken,),
        refuse: Refusal | None = None,
    ) -> None:
        """No helper yet; ``enabled``: whether one may be started at all (``use_exec_helper``);
        ``start_failures``: what `HelperTransport.start_helper` raises for a helper that did not
        start, counted by `HelperStarts` (the call goes on without a helper); ``refuse``: for a
        sandbox that can be closed under its caller or whose fallback needs a working directory
        that is there (SSH, a local jail), the answer to a command where nothing may run, asked
        before `execute` and `awaited` run anything."""
        self.transport = transport
        self.refuse = refuse
        self.words = words
        self.defaults = defaults
        self.starts = HelperStarts(enabled)
        self._start_failures = start_failures
        self._mux: MuxClient | None = None
        self.lock = threading.Lock()
        """Serializes the helper's starts and drops."""

    # ------------------------------------------------------------------ the helper

    @property
    def mux(self) -> MuxClient | None:
        """The helper held now, alive or not; ``None``: none."""
        return self._mux

    @property
    def alive(self) -> bool:
        """Whether commands currently go through a live exec helper (the fast path)."""
        return self._mux is not None and self._mux.alive

    def helper(self) -> MuxClient | None:
        """The running helper, or one started now; ``None``: there is none, run the script."""
        with self.lock:
            if self._mux is not None and self._mux.alive:
                return self._mux
            if self._mux is not None:  # dead: what it holds (a channel slot, a socket) is freed first
                self._mux.close()
                self._mux = None
            if not self.starts.due:
                return None
            try:
                self._mux = self.transport.start_helper()
            except self._start_failures as failed:
                self._mux = None
                self.starts.failed(for_good=self.transport.python_missing())
                self.starts.report(self.words.logger, self.words.subject, failed, self.words.fallback)
                return None
            if self._mux is not None:
                self.starts.started()
            return self._mux

    def probe(self, command: str) -> str | None:
        """A tiny internal command's output, stripped, through the helper (started if need be);
        ``None``: no helper ran it, so the transport runs it its own way."""
        mux = self.helper()
        if mux is not None:
            with contextlib.suppress(MuxBroken):
                return mux.run(Command(command, timeout=10, output_limit=4096, cwd="/")).output.strip()
        return None

    def running(self) -> MuxClient | None:
        """The helper if one is running now (none is started). Read without the lock, which a
        helper's start holds for up to its hello's timeout: the caller may be an event loop."""
        mux = self._mux
        return mux if mux is not None and mux.alive else None

    def drop(self, mux: MuxClient, broken: MuxBroken) -> None:
        """Let go of ``mux``, found broken: closed, and no longer held if it still was (another
        thread may have started a new one meanwhile), so that the next call starts a new one."""
        self.words.logger.warning("exec helper of %s failed (%s); %s", self.words.subject, broken, self.words.restart)
        with self.lock:
            mux.close()
            if self._mux is mux:
                self._mux = None

    def close(self) -> None:
        """Drop the exec helper; the sandbox keeps running."""
        with self.lock:
            if self._mux is not None:
                self._mux.close()
                self._mux = None

    def kill_tagged(self, name: str, value: str) -> bool:
        """`sandboxes.base.KillsTagged` through the running helper (none is started); ``False``
        without one."""
        with self.lock:
            mux = self._mux
        return kill_tagged(mux, name, value)

    def command_marker(self, new: Callable[[], str]) -> str:
        """`sandboxes.base.MarksAhead`, announced through the running helper if any; read
        without the lock (asked on an event loop, for a speed-up only)."""
        return command_marker(self._mux, new)

    # ------------------------------------------------------------------ commands and file ops

    def execute(self, command: Command, on_output: OutputHook | None) -> p.ExecuteResponse:
        """``command`` (`Command.within` the defaults here) on the helper, else alone; the
        transport's failures answered, an out-of-memory kill told apart."""
        run = command.within(self.defaults)
        refused = self.refuse(run) if self.refuse is not None else None
        if refused is not None:
            return refused
        try:
            response = run_command_once(self.helper, self.drop, run, on_output, lost=self.words.command_lost)
            if response is None:
                response = self.transport.run_alone(run, on_output)
        except Exception as error:
            answer = self.transport.answer(error)
            if answer is None:
                raise
            return answer
        return self.oom_checked(response)

    def run_native(self, call: Call, timeout: float) -> p.ExecuteResponse | None:
        """`sandboxes.base.BaseSandbox._run_native` on the helper; ``None``: run the script."""
        try:
            return run_native_once(self.helper, self.drop, call, timeout=timeout, lost=self.words.file_op_lost)
        except Exception as error:
            answer = self.transport.answer(error)
            if answer is None:
                raise
            return answer

    def awaited(self, command: Command) -> AwaitedCommand | p.ExecuteResponse:
        """``command`` as `execute` sends it, for a caller that awaits it on the running helper;
        or its answer where nothing may run (``refuse``)."""
        run = command.within(self.defaults)
        refused = self.refuse(run) if self.refuse is not None else None
        return refused if refused is not None else AwaitedCommand(run, self.words.command_lost, self.oom_checked)

    def oom_checked(self, response: p.ExecuteResponse) -> p.ExecuteResponse:
        """``response``, ``out_of_memory`` if it is an exit 137 the memory cgroup caused."""
        if response.exit_code == 137 and self.transport.oom_killed():
            return out_of_memory(response, self.transport.memory_limit)
        return response
