"""`Command`: one command below the public ``execute()`` edge, as one value: what the service
hands a sandbox, what a sandbox sends its exec helper and what its fallback runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

__all__ = ["Command", "CommandDefaults", "CommandLimits", "GivenDefaults"]


class CommandLimits(Protocol):
    """A sandbox's limits for a command that names none."""

    @property
    def default_timeout(self) -> float: ...
    @property
    def output_limit(self) -> int: ...


class CommandDefaults(CommandLimits, Protocol):
    """What a sandbox fills in for what a command leaves out."""

    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def workdir(self) -> str: ...


@dataclass(frozen=True)
class GivenDefaults:
    """`CommandDefaults` as values, for a sandbox whose defaults are not all its config's."""

    default_timeout: float
    output_limit: int
    env: Mapping[str, str]
    workdir: str


@dataclass(frozen=True, slots=True)
class Command:
    """One command, its limits numbers: no ``cwd`` is the sandbox's working directory, and ``env``
    goes over the sandbox's own environment (`within` fills in both)."""

    command: str
    timeout: float
    """Seconds; 0: none."""
    output_limit: int
    """Bytes of output kept (head and tail)."""
    stdin: bytes | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None

    @classmethod
    def given(
        cls,
        limits: CommandLimits,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int | None = None,
    ) -> Command:
        """``execute_streaming``'s arguments as one value, its limits taken from ``limits``
        where they leave them out; `within` fills in the rest."""
        return cls(
            command,
            timeout=limits.default_timeout if timeout is None else timeout,
            output_limit=limits.output_limit if output_limit is None else output_limit,
            stdin=stdin.encode("utf-8") if isinstance(stdin, str) else stdin,
            env=dict(env or {}),
            cwd=cwd or None,
        )

    def within(self, defaults: CommandDefaults) -> Command:
        """This command as a sandbox with ``defaults`` runs it: its environment over the
        sandbox's, and the sandbox's working directory if it names none."""
        env, cwd = {**defaults.env, **self.env}, self.cwd or defaults.workdir
        return Command(self.command, self.timeout, self.output_limit, self.stdin, env, cwd)

    @property
    def workdir(self) -> str:
        """Its working directory, once `within` a sandbox's defaults (`ValueError` before)."""
        if self.cwd is None:
            raise ValueError("a command's working directory is the sandbox's: fill it in with `within`")
        return self.cwd

    def with_env(self, name: str, value: str) -> Command:
        """This command with one more environment variable (over one of the same name)."""
        return replace(self, env={**self.env, name: value})
