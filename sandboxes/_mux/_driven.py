"""A sandbox driven through its exec helper: file ops (`FileOpsOnHelper`) and, for the transports
that fall back to one exec per command, commands too (`CommandsOnHelper`), on the one helper such
a transport holds (`HeldHelper`).

Why one module: ``execute_streaming`` (Docker's and Kubernetes') and ``_run_native`` (those
two's and the local jail's) are one procedure: fill in the config's defaults, try the
helper (`run_command_once`, `run_native_once`), fall back to the transport's own exec, then
tell an out-of-memory kill from a plain exit 137. What differs is small and stays with each
transport: its fallback and the failures it answers for (`CommandsOnHelper._run_alone`, or
`CommandsOnHelper._run_command` wrapped when a helper's start fails in its own words too), its
messages, and how it words its memory limit. The order of it all lives here alone.

Docker and Kubernetes also hold their helper alike: one at a time, started under a lock when a
call finds none alive, as `HelperStarts` allows, let go of when found broken (`HeldHelper`).
How each starts it, what a failed start raises, and how each logs it stay with the transport.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from sandboxes import protocol as p
from sandboxes._mux._command import Command, CommandDefaults
from sandboxes._mux._resend import run_command_once, run_native_once
from sandboxes._mux._starts import HelperStarts
from sandboxes._mux._stream import MuxBroken
from sandboxes._mux.client import MuxClient, command_marker, kill_tagged
from sandboxes._output import OutputHook, as_output_hook, out_of_memory
from sandboxes.base import Call, StreamingSandbox

__all__ = [
    "AwaitedCommand",
    "AwaitsCommands",
    "CommandsOnHelper",
    "FileOpsOnHelper",
    "HeldHelper",
]


@dataclass(frozen=True)
class AwaitedCommand:
    """A command as the sandbox's own ``execute_streaming`` would send it to its helper."""

    command: Command
    """Its defaults filled in (`Command.within`)."""
    lost: str
    """``connection_lost``'s message (then ``: `` and why) when the helper broke once it was sent."""
    checked: Callable[[p.ExecuteResponse], p.ExecuteResponse]
    """Its answer for an exit 137, as ``execute_streaming`` gives it: ``out_of_memory`` when the
    sandbox's memory limit killed it; may block (it may ask the sandbox)."""


class AwaitsCommands(abc.ABC):
    """A sandbox whose commands a caller may await on its running helper
    (`sandboxes._mux.AwaitsOnHelper`), prepared by the very steps its ``execute_streaming``
    takes: `_command_run` fills in what a command leaves out, `_awaited` adds how its helper's
    loss is worded and how an exit 137 is checked for an out-of-memory kill."""

    @abc.abstractmethod
    def _command_run(self, command: Command) -> Command | p.ExecuteResponse:
        """``command`` as this sandbox runs it (`Command.within` its defaults); its answer
        instead where it runs nothing (closed, say). Without blocking."""

    @abc.abstractmethod
    def _awaited(self, command: Command) -> AwaitedCommand:
        """``command`` (filled in) as awaited: `AwaitedCommand.lost` and `AwaitedCommand.checked`
        as ``execute_streaming`` has them. Without blocking."""

    def awaited_command(self, command: Command) -> AwaitedCommand | p.ExecuteResponse:
        """`sandboxes._mux.AwaitsOnHelper`: the command ``execute_streaming`` sends the helper."""
        run = self._command_run(command)
        return run if isinstance(run, p.ExecuteResponse) else self._awaited(run)


class FileOpsOnHelper(StreamingSandbox):
    """A sandbox whose file ops go to its exec helper first (`sandboxes.base.BaseSandbox.
    native_file_ops`), by `run_native_once`: the helper the transport has or starts
    (`_helper`), let go of when found broken (`_drop_broken`)."""

    native_file_ops = True

    _file_op_lost: ClassVar[str]
    """``connection_lost``'s message for a file op whose helper broke after it was sent."""

    @abc.abstractmethod
    def _helper(self) -> MuxClient | None:
        """The running helper, or one started now; ``None``: there is none, run the script."""

    @abc.abstractmethod
    def _drop_broken(self, mux: MuxClient, broken: MuxBroken) -> None:
        """Let go of ``mux``, found broken, so that the next call starts a new one."""

    def exec_helper(self) -> MuxClient | None:
        """`sandboxes._mux.HoldsHelper`: the helper this sandbox's commands and file ops use."""
        return self._helper()

    def drop_helper(self, mux: MuxClient, broken: MuxBroken) -> None:
        """`sandboxes._mux.AwaitsOnHelper`: ``mux``, found broken under an awaited command, let
        go of as under one of this sandbox's own (`_drop_broken`)."""
        self._drop_broken(mux, broken)

    def _run_native(self, call: Call) -> p.ExecuteResponse | None:
        """`sandboxes.base.BaseSandbox._run_native` on the exec helper this sandbox's commands use."""
        return run_native_once(
            self._helper, self._drop_broken, call, timeout=self.operation_timeout, lost=self._file_op_lost
        )


class HeldHelper(FileOpsOnHelper):
    """A sandbox that holds one exec helper at a time (``_mux``), started by the call that finds
    none alive (`_helper`), under the lock that serializes the starts (``_mux_lock``), when
    `HelperStarts` allows (``_starts``): Docker's and Kubernetes'. Each transport keeps how it
    starts its helper (`_start_helper`), what a failed start raises (`_start_failures`), how it
    tells that its python is missing (`_python_missing`), and how it logs a failed start
    (`_report_failed_start`) and a broken helper (`_drop_broken`, which lets go of it by
    `_drop_helper`). Its ``__init__`` calls `_hold_helper`."""

    _mux: MuxClient | None
    _mux_lock: threading.Lock
    _starts: HelperStarts

    _start_failures: ClassVar[tuple[type[Exception], ...]] = (MuxBroken,)
    """What `_start_helper` raises for a helper that did not start: counted by ``_starts``, and
    the call goes on without a helper. Anything else propagates to the caller."""

    def _hold_helper(self, enabled: bool) -> None:
        """No helper yet; ``enabled``: whether one may be started at all (``use_exec_helper``)."""
        self._mux = None
        self._mux_lock = threading.Lock()
        self._starts = HelperStarts(enabled)

    @abc.abstractmethod
    def _start_helper(self) -> MuxClient:
        """A new helper, past its hello; one of `_start_failures` if it did not start."""

    @abc.abstractmethod
    def _python_missing(self) -> bool:
        """Whether the sandbox says python3 is not there (then no start is tried again); a
        question that failed cannot tell (``False``)."""

    @abc.abstractmethod
    def _report_failed_start(self, error: Exception) -> None:
        """Log the start that just failed (`HelperStarts.report`), in the transport's logger
        and words."""

    @property
    def helper_alive(self) -> bool:
        """Whether commands currently go through a live exec helper (the fast path)."""
        return self._mux is not None and self._mux.alive

    def close(self) -> None:
        """Drop the exec helper; the sandbox keeps running."""
        with self._mux_lock:
            if self._mux is not None:
                self._mux.close()
                self._mux = None

    def running_helper(self) -> MuxClient | None:
        """`sandboxes._mux.AwaitsOnHelper`: the helper if one is running now (none is started).
        Read without the lock, which a helper's start holds for up to its hello's timeout: the
        caller is an event loop, and falls back to a thread."""
        mux = self._mux
        return mux if mux is not None and mux.alive else None

    def kill_tagged(self, name: str, value: str) -> bool:
        """`sandboxes.base.KillsTagged`: through the running exec helper (none is started), so
        it works when the sandbox's pids limit is reached. ``False`` without a helper: the
        fallback path's commands are found by their marker alone, by a command."""
        with self._mux_lock:
            mux = self._mux
        return kill_tagged(mux, name, value)

    def command_marker(self, new: Callable[[], str]) -> str:
        """`sandboxes.base.MarksAhead`: announced through the running exec helper, if any. Read
        without the lock, which a helper's start holds for up to its hello's timeout: asked on
        the service's event loop, for a speed-up only."""
        return command_marker(self._mux, new)

    def _helper(self) -> MuxClient | None:
        with self._mux_lock:
            if self._mux is not None and self._mux.alive:
                return self._mux
            if not self._starts.due:
                return None
            try:
                self._mux = self._start_helper()
            except self._start_failures as broken:
                self._mux = None
                self._starts.failed(for_good=self._python_missing())
                self._report_failed_start(broken)
                return None
            self._starts.started()
            return self._mux

    def _drop_helper(self, mux: MuxClient) -> None:
        """Let go of ``mux``, found broken: closed, and no longer held if it still was (another
        thread may have started a new one meanwhile), so that the next call starts a new one."""
        with self._mux_lock:
            mux.close()
            if self._mux is mux:
                self._mux = None


class CommandsOnHelper(AwaitsCommands, FileOpsOnHelper):
    """A sandbox whose commands run on its exec helper, and each in an exec of its own
    (`_run_alone`) where it has none: `execute_streaming` for Docker and Kubernetes.

    An answer the transport makes of a failure (``unavailable``, ``connection_lost``) has no
    exit code, so it is never taken for an out-of-memory kill: the memory cgroup is looked at
    (`_oom_killed`) only for a command that exited 137."""

    config: CommandDefaults

    _command_lost: ClassVar[str]
    """``connection_lost``'s message for a command whose helper broke after it was sent."""

    @property
    @abc.abstractmethod
    def _memory_limit(self) -> str:
        """The memory limit, as `sandboxes._output.out_of_memory` names it to the caller."""

    @abc.abstractmethod
    def _oom_killed(self) -> bool:
        """Whether the sandbox's memory cgroup killed something since the last look."""

    @abc.abstractmethod
    def _run_alone(self, command: Command, on_output: OutputHook | None) -> p.ExecuteResponse:
        """``command`` without the helper (there is none, or none could start): the transport's
        own exec, its failures answered in the protocol's words."""

    def execute_streaming(
        self,
        command: str,
        on_output: OutputHook | None,
        *,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int | None = None,
    ) -> p.ExecuteResponse:
        asked = Command.given(
            self.config, command, timeout=timeout, stdin=stdin, env=env, cwd=cwd, output_limit=output_limit
        )
        return self._oom_checked(self._run_command(self._command_run(asked), as_output_hook(on_output)))

    def _command_run(self, command: Command) -> Command:
        return command.within(self.config)

    def _awaited(self, command: Command) -> AwaitedCommand:
        return AwaitedCommand(command, self._command_lost, self._oom_checked)

    def _oom_checked(self, response: p.ExecuteResponse) -> p.ExecuteResponse:
        """``response``, ``out_of_memory`` if it is an exit 137 the memory cgroup caused."""
        if response.exit_code == 137 and self._oom_killed():
            return out_of_memory(response, self._memory_limit)
        return response

    def command_context(self) -> tuple[dict[str, str], str]:
        """(environment, working directory) a command that names neither starts with: the
        config's (`sandboxes.terminal.HasCommandContext`)."""
        return dict(self.config.env), self.config.workdir

    def _run_command(self, command: Command, on_output: OutputHook | None) -> p.ExecuteResponse:
        """``command`` on the helper, else `_run_alone`. A transport whose helper's start fails
        in its own words too wraps this, to answer for both."""
        response = run_command_once(self._helper, self._drop_broken, command, on_output, lost=self._command_lost)
        return self._run_alone(command, on_output) if response is None else response
