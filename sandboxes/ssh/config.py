"""The SSH backend's typed config: what a sandbox is made from (`SSHSandboxTemplate`, shared by
`SSHProviderConfig` across its hosts) and that template on one host (`SSHSandboxConfig`)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandboxes._output import DEFAULT_OUTPUT_LIMIT
from sandboxes.ssh._connection import SSHHostConfig

__all__ = ["SSHSandboxConfig", "SSHSandboxTemplate"]


class SSHSandboxTemplate(BaseModel):
    """Everything an SSH sandbox is made from except its host: what `SSHProviderConfig` shares
    across all its hosts (it extends this class, so the fields are declared once)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workspace_root: str | None = None
    """Where workspaces are created on the host; default ``$HOME/sandboxes`` of the login user."""
    isolation: Literal["user", "none"] = "user"
    """``user``: each sandbox runs as its own user leased from ``user_group`` on the host, so
    sandboxes on one host cannot see each other's files (the VM must be prepared: see
    ``images/ssh-vm``). ``none``: every sandbox runs as the login user, or as ``run_as``, and
    can read the others' workspaces; for single-tenant hosts."""
    user_group: str = "sandboxes"
    """The group whose members the login user may ``sudo -n -u`` to (``isolation="user"``)."""
    run_as: str | None = None
    """With ``isolation="none"``: the one user (through ``sudo -n -u``) all sandboxes run as."""
    default_timeout: float = Field(default=120.0, ge=0)
    output_limit: int = Field(default=DEFAULT_OUTPUT_LIMIT, gt=0)
    use_exec_helper: bool = True
    env: dict[str, str] = Field(default_factory=dict)
    """Added to every command's environment (a command's own ``env`` wins)."""

    @model_validator(mode="after")
    def _run_as_only_when_shared(self) -> Self:
        if self.run_as is not None and self.isolation == "user":
            raise ValueError("run_as is the one user of isolation='none'; isolation='user' leases one per sandbox")
        return self

    def on(self, host: SSHHostConfig) -> SSHSandboxConfig:
        """This template, on ``host``."""
        fields = {name: getattr(self, name) for name in SSHSandboxTemplate.model_fields}
        return SSHSandboxConfig(host=host, **fields)


class SSHSandboxConfig(SSHSandboxTemplate):
    host: SSHHostConfig
