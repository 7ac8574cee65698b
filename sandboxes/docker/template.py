"""The Docker backend's template: sandboxes as containers of the service's Docker engine."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from sandboxes.docker.config import DockerSandboxConfig
from sandboxes.docker.provider import DockerProvider
from sandboxes.lifecycle import Provider, Sandbox
from sandboxes.templates import ProviderContext, TemplateConfig, parse_memory

__all__ = ["DockerTemplate"]

CLIENT_KEY = "docker"
"""The key of the Docker client in `ProviderContext.shared`: one per service."""
ENGINE_CONNECTIONS = 64
"""Connections to the engine the service's client keeps open for reuse: as many as its
threads may hold at once in a burst (the default, 10, closes and reopens one per call past it)."""


class DockerTemplate(TemplateConfig):
    """Sandboxes as containers of the service's Docker engine (``docker_url``, else the
    environment's)."""

    backend: Literal["docker"]
    image: str = "sandboxes/runtime:latest"
    disk: str | None = "1g"
    """The workspace's size (a tmpfs volume; see `DockerSandboxConfig.disk`); ``None``: a
    persistent volume on the engine's disk, unbounded."""
    labels: dict[str, str] = Field(default_factory=dict)
    """The operator's own labels on every container and volume of the template."""
    workdir: str = "/workspace"
    """Where the workspace is mounted, and where commands start (``/home/user`` for the
    ``sandboxes/e2b`` image, as E2B's ``base`` template runs them)."""

    @field_validator("disk")
    @classmethod
    def _disk_parses(cls, value: str | None) -> str | None:
        if value is not None:
            parse_memory(value)
        return value

    def provider(self, context: ProviderContext) -> Provider[Sandbox]:
        config = DockerSandboxConfig(
            owner=DockerSandboxConfig.model_fields["owner"].default if context.owner is None else context.owner,
            image=self.image,
            cpus=self.cpus,
            memory=self.memory,
            disk=self.disk,
            env=self.env,
            labels=self.labels,
            workdir=self.workdir,
            ttl=self.ttl if context.own_expiry else None,
            default_timeout=self.default_timeout,
            output_limit=context.output_limit,
        )
        if context.own_expiry:
            return DockerProvider(config, client=_client(context))
        return DockerProvider(config, client=_client(context), sweep_interval=None, sweep_on_start=False)


def _client(context: ProviderContext) -> Any:
    """The service's one Docker client, made by the first Docker template that needs it."""
    client = context.shared.get(CLIENT_KEY)
    if client is None:
        import docker

        url = context.options.get("docker_url")
        pool = {"max_pool_size": ENGINE_CONNECTIONS}
        client = docker.DockerClient(base_url=url, **pool) if url else docker.from_env(**pool)
        context.shared[CLIENT_KEY] = client
    return client
