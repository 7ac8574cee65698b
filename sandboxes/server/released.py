"""`Released`: what the service holds of a hibernated sandbox it found recorded at start-up. Its
container, pod or jail was released when it hibernated (its files are in a snapshot), so there
is nothing to run in until `sandboxes.server.keeping.Keeping.resume` makes it again; every
command answers ``paused``, and closing or destroying it does nothing."""

from __future__ import annotations

from collections.abc import Mapping

from sandboxes import protocol as p
from sandboxes._output import OutputHook
from sandboxes.base import StreamingSandbox
from sandboxes.lifecycle import Sandbox
from sandboxes.server.store import SandboxState

__all__ = ["Released"]


class Released(StreamingSandbox, Sandbox):
    """A hibernated sandbox's stand-in: its id, ref and workdir as recorded, nothing that runs."""

    def __init__(self, state: SandboxState) -> None:
        self._id, self._ref, self._workdir = state.id, state.ref, state.workdir

    @property
    def id(self) -> str:
        return self._id

    @property
    def ref(self) -> str:
        return self._ref

    @property
    def workdir(self) -> str:
        return self._workdir

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
        return p.ExecuteResponse("", error=p.PAUSED, message=f"sandbox {self._id} is hibernated: resume it first")

    def close(self) -> None:
        """Nothing is held."""

    def destroy(self) -> None:
        """Nothing runs: the provider's ``destroy`` of its ref removes whatever is left."""
