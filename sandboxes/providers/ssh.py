"""Deprecated: `sandboxes.ssh` holds the SSH provider now; this re-export goes next release."""

from sandboxes.ssh.provider import SSHProvider, SSHProviderConfig

__all__ = ["SSHProvider", "SSHProviderConfig"]
