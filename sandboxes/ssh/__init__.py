"""The SSH backend: `SSHSandbox` (a workspace on a host reached over SSH, run as a user leased
for it), `SSHProvider` (placement over several hosts) and their config.

Private plumbing beside it: pooled connections and housekeeping commands (`_connection`) and
the per-sandbox user pool (`_users`)."""

from sandboxes.ssh._connection import (
    SSHAuthenticationError,
    SSHError,
    SSHHostConfig,
    SSHHostKeyError,
    SSHUnreachableError,
)
from sandboxes.ssh._users import UserPoolError, WorkspaceNotFound
from sandboxes.ssh.provider import SSHProvider, SSHProviderConfig
from sandboxes.ssh.sandbox import SSHSandbox, SSHSandboxConfig, SSHSandboxTemplate
from sandboxes.ssh.template import SSHTemplate

__all__ = [
    "SSHAuthenticationError",
    "SSHError",
    "SSHHostConfig",
    "SSHHostKeyError",
    "SSHProvider",
    "SSHProviderConfig",
    "SSHSandbox",
    "SSHSandboxConfig",
    "SSHSandboxTemplate",
    "SSHTemplate",
    "SSHUnreachableError",
    "UserPoolError",
    "WorkspaceNotFound",
]
