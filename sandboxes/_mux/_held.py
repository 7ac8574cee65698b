"""`DrivenSandbox`: the protocols a sandbox that holds a `HelperDriver` answers through it, each
forwarded in one line, written once for every such backend."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from sandboxes import protocol as p
from sandboxes._mux._capable import AwaitedCommand
from sandboxes._mux._command import Command
from sandboxes._mux._driver import HelperDriver
from sandboxes._mux._stream import MuxBroken
from sandboxes._mux.client import MuxClient
from sandboxes._output import OutputHook, as_output_hook
from sandboxes.base import Call, StreamingSandbox

__all__ = ["DrivenSandbox"]


class DrivenSandbox(StreamingSandbox):
    """A sandbox whose commands, file ops and helper go through the `HelperDriver` it holds
    (``helper_driver``, set by its ``__init__``): ``execute_streaming``, native file ops,
    `sandboxes._mux.HoldsHelper`, `sandboxes._mux.AwaitsOnHelper`, `sandboxes.base.KillsTagged`
    and `sandboxes.base.MarksAhead`. It has no hooks: what its backend does differently is the
    driver's `sandboxes._mux.HelperTransport`."""

    helper_driver: HelperDriver
    native_file_ops = True

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
        driver = self.helper_driver
        asked = Command.given(
            driver.defaults, command, timeout=timeout, stdin=stdin, env=env, cwd=cwd, output_limit=output_limit
        )
        return driver.execute(asked, as_output_hook(on_output))

    def _run_native(self, call: Call) -> p.ExecuteResponse | None:
        return self.helper_driver.run_native(call, self.operation_timeout)

    def command_context(self) -> tuple[dict[str, str], str]:
        """(environment, working directory) a command that names neither starts with: the
        driver's defaults (`sandboxes.terminal.HasCommandContext`)."""
        defaults = self.helper_driver.defaults
        return dict(defaults.env), defaults.workdir

    @property
    def helper_alive(self) -> bool:
        """Whether commands currently go through a live exec helper (the fast path)."""
        return self.helper_driver.alive

    def close(self) -> None:
        """Drop the exec helper; the sandbox keeps running."""
        self.helper_driver.close()

    def exec_helper(self) -> MuxClient | None:
        """`sandboxes._mux.HoldsHelper`."""
        return self.helper_driver.helper()

    def running_helper(self) -> MuxClient | None:
        """`sandboxes._mux.AwaitsOnHelper`."""
        return self.helper_driver.running()

    def awaited_command(self, command: Command) -> AwaitedCommand | p.ExecuteResponse:
        """`sandboxes._mux.AwaitsOnHelper`."""
        return self.helper_driver.awaited(command)

    def drop_helper(self, mux: MuxClient, broken: MuxBroken) -> None:
        """`sandboxes._mux.AwaitsOnHelper`."""
        self.helper_driver.drop(mux, broken)

    def kill_tagged(self, name: str, value: str) -> bool:
        """`sandboxes.base.KillsTagged`, through the running helper (none is started)."""
        return self.helper_driver.kill_tagged(name, value)

    def command_marker(self, new: Callable[[], str]) -> str:
        """`sandboxes.base.MarksAhead`, announced through the running helper, if any."""
        return self.helper_driver.command_marker(new)
