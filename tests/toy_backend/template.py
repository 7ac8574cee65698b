"""The toy backend's template arm: ``{"backend": "toy"}``."""

from __future__ import annotations

from typing import Literal

from sandboxes.lifecycle import Provider, Sandbox
from sandboxes.templates import ProviderContext, TemplateConfig
from toy_backend.sandbox import ToyProvider


class ToyTemplate(TemplateConfig):
    """Toy sandboxes: directories under the service's data directory (a FAKE backend for tests)."""

    backend: Literal["toy"]

    def provider(self, context: ProviderContext) -> Provider[Sandbox]:
        base = context.data_dir / "toy"
        return ToyProvider(base, env=self.env, default_timeout=self.default_timeout, output_limit=context.output_limit)
