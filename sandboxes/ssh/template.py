"""The SSH backend's template: sandboxes as workspaces on SSH hosts."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, model_validator

from sandboxes._output import DEFAULT_OUTPUT_LIMIT
from sandboxes.lifecycle import Provider, Sandbox
from sandboxes.ssh.provider import SSHProvider, SSHProviderConfig
from sandboxes.templates import ProviderContext, TemplateConfig

__all__ = ["SSHTemplate"]


class SSHTemplate(TemplateConfig):
    """Sandboxes as workspaces on SSH hosts. Its other fields are `SSHProviderConfig`'s
    (``hosts`` with their keys and known_hosts, ``workspace_root``, ``isolation``, ...), checked
    by it when the config is loaded. ``cpus`` and ``memory`` are only counted against quotas:
    an SSH host enforces neither per sandbox."""

    @property
    def own_loopback(self) -> bool:
        """No: a host's sandboxes share its network namespace."""
        return False

    model_config = ConfigDict(frozen=True, extra="allow")

    backend: Literal["ssh"]

    @model_validator(mode="after")
    def _provider_config_loads(self) -> SSHTemplate:
        self.provider_config(DEFAULT_OUTPUT_LIMIT)
        return self

    def provider_config(self, output_limit: int) -> SSHProviderConfig:
        """The provider's config: this template's SSH fields, and the service's limits. Its
        sandboxes get no expiry of the provider's: the service enforces (and renews) TTLs."""
        shared = {"default_timeout": self.default_timeout, "env": self.env, "output_limit": output_limit}
        return SSHProviderConfig.model_validate({**(self.model_extra or {}), **shared})

    def provider(self, context: ProviderContext) -> Provider[Sandbox]:
        return SSHProvider(self.provider_config(context.output_limit))
