"""The local backend's template: sandboxes as directories on the service's host, in a jail."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from typing import Literal

from sandboxes.lifecycle import Provider, Sandbox
from sandboxes.local.provider import LocalProvider, LocalProviderConfig
from sandboxes.templates import ProviderContext, TemplateConfig

__all__ = ["LocalTemplate"]


class LocalTemplate(TemplateConfig):
    """Sandboxes as directories on the service's host, in a bubblewrap jail."""

    backend: Literal["local"] = "local"
    isolation: Literal["bwrap", "none"] = "bwrap"
    """``none`` runs commands as the service's own user with access to everything it can read
    (its keys included), so it is refused unless the service is ``insecure``."""

    def provider(self, context: ProviderContext) -> Provider[Sandbox]:
        return LocalProvider(
            LocalProviderConfig(
                base_dir=context.data_dir / "local",
                isolation=self.isolation,
                default_timeout=self.default_timeout,
                output_limit=context.output_limit,
                env=self.env,
                memory=self.memory_bytes,
                cpus=self.cpus,
            )
        )

    @property
    def own_loopback(self) -> bool:
        """Only a jail with its own network namespace (isolated, without the host's network)."""
        return self.isolation != "none"

    def check_service(self, *, insecure: bool, tenants: Iterable[str]) -> None:
        if self.isolation == "none" and not insecure:
            raise ValueError("it has isolation 'none': allowed only with insecure")

    def missing_on_host(self) -> str | None:
        if self.isolation == "bwrap" and shutil.which("bwrap") is None:
            return "isolation with bubblewrap, which is not installed (apt install bubblewrap)"
        return None
