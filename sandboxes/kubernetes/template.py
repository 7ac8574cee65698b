"""The Kubernetes backend's template: sandboxes as pods of a cluster."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Literal

from pydantic import ConfigDict, model_validator

from sandboxes._output import DEFAULT_OUTPUT_LIMIT
from sandboxes.kubernetes.config import KubernetesSandboxConfig, is_label_value
from sandboxes.kubernetes.provider import KubernetesProvider
from sandboxes.lifecycle import Provider, Sandbox
from sandboxes.templates import ProviderContext, TemplateConfig

__all__ = ["KubernetesTemplate"]


class KubernetesTemplate(TemplateConfig):
    """Sandboxes as pods of a Kubernetes cluster (the service's own, in-cluster credentials,
    or a kubeconfig). Its other fields are `KubernetesSandboxConfig`'s (``namespace``,
    ``image``, ``image_pull_policy``, ``runtime_class_name``, ``node_selector``, ...), checked
    when the config is loaded. ``cpus`` and ``memory`` become the pod's limits and count
    against quotas. Tenants and labels are recorded (and selected) as pod labels."""

    model_config = ConfigDict(frozen=True, extra="allow")

    backend: Literal["kubernetes"]
    label_values_only: ClassVar[bool] = True

    @model_validator(mode="after")
    def _sandbox_config_loads(self) -> KubernetesTemplate:
        self.sandbox_config(owner="sandboxes-service", output_limit=DEFAULT_OUTPUT_LIMIT)
        return self

    def sandbox_config(self, *, owner: str, output_limit: int, ttl: float | None = None) -> KubernetesSandboxConfig:
        """The pods' config: this template's fields, and the caller's owner and limits. No
        expiry of the provider's unless ``ttl``: the service enforces (and renews) TTLs."""
        shared = {
            "cpu_limit": f"{self.cpus:g}",
            "memory_limit": str(self.memory_bytes),
            "env": self.env,
            "default_timeout": self.default_timeout,
            "output_limit": output_limit,
            "owner": owner,
            "ttl": ttl,
        }
        return KubernetesSandboxConfig.model_validate({**(self.model_extra or {}), **shared})

    def provider(self, context: ProviderContext) -> Provider[Sandbox]:
        ttl = self.ttl if context.own_expiry else None
        pods = self.sandbox_config(owner=context.owner or "sandboxes", output_limit=context.output_limit, ttl=ttl)
        if context.own_expiry:
            return KubernetesProvider(pods, pool_size=0)
        return KubernetesProvider(pods, pool_size=0, sweep_interval=None, sweep_on_start=False)

    def check_service(self, *, insecure: bool, tenants: Iterable[str]) -> None:
        for tenant in sorted(tenants):
            if not is_label_value(tenant):
                raise ValueError(
                    f"tenant {tenant!r} cannot be a pod label (the record of whose a sandbox is): "
                    "63 characters at most, [A-Za-z0-9._-], starting and ending alphanumeric"
                )
