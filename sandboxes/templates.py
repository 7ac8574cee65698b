"""Templates: what an operator configures for one kind of sandbox, and the provider it makes.

A template is one arm of `Template`, chosen by its ``backend`` field. Each arm lives in its
backend's package (``sandboxes.docker.template``...) and makes its own provider
(`TemplateConfig.provider`), so the service holds a `TemplateConfig` and a
`sandboxes.lifecycle.Provider` and never names a backend. A new backend is one package with one
arm, found by its ``backend`` name: a built-in one by `BUILTIN`, another one registered with
`register_template` or declared as an entry point of the group `ENTRY_POINT_GROUP`
(``name = "package.module:TemplateClass"``).

This module imports no backend: an arm is imported when a template names its backend.
"""

from __future__ import annotations

import abc
import importlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, field_validator

from sandboxes.lifecycle import Provider, Sandbox

__all__ = [
    "BUILTIN",
    "DEFAULT_BACKEND",
    "ENTRY_POINT_GROUP",
    "ProviderContext",
    "Template",
    "TemplateConfig",
    "parse_memory",
    "register_template",
    "template_class",
    "validate_template",
]

DEFAULT_BACKEND = "local"
"""The backend of a template that names none."""
BUILTIN: Mapping[str, str] = {
    "local": "sandboxes.local.template:LocalTemplate",
    "docker": "sandboxes.docker.template:DockerTemplate",
    "ssh": "sandboxes.ssh.template:SSHTemplate",
    "kubernetes": "sandboxes.kubernetes.template:KubernetesTemplate",
}
"""Where the built-in backends' arms are, imported only when a template names them."""
ENTRY_POINT_GROUP = "sandboxes.templates"
"""The entry-point group an installed package declares its backend's arm in, by backend name."""

_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)i?b?\s*$", re.IGNORECASE)
_registered: dict[str, type[TemplateConfig]] = {}


def parse_memory(value: str) -> int:
    """Bytes in a Docker-style size (``512m``, ``2g``, ``1048576``), for quota arithmetic."""
    match = _MEMORY.match(value)
    if match is None:
        raise ValueError(f"not a memory size: {value!r} (use e.g. 512m, 2g)")
    number, unit = match.groups()
    return int(float(number) * (1 << (10 * "bkmgt".index(unit.lower() or "b"))))


@dataclass(frozen=True)
class ProviderContext:
    """What the service gives every template's provider beside the template itself."""

    data_dir: Path
    """A directory of the caller's own where a backend may keep what lives on this host."""
    output_limit: int
    """The most output a command may keep (the service's ceiling)."""
    owner: str | None = None
    """The owner label: a provider finds, adopts and reaps exactly its owner's sandboxes;
    ``None``: the backend's default owner."""
    own_expiry: bool = False
    """Whether the provider records the template's ``ttl`` on the sandboxes it makes and
    sweeps them itself (a caller without a service, as the agent); ``False``: the caller
    enforces lifetimes and sweeps (the service)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Service-wide settings a backend may read by name (``docker_url``)."""
    shared: dict[str, Any] = field(default_factory=dict)
    """Clients that the providers of one service share, by a key of their backend's choosing
    (one Docker client for every Docker template); a provider adds the one it makes."""


class TemplateConfig(BaseModel, abc.ABC):
    """What every template has (clients choose a template by name and nothing else), and the
    provider it makes. Its ``backend`` is the name it is registered by."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str
    cpus: float = Field(default=1.0, gt=0)
    """Enforced by the backend where it can; always counted against the tenant's quota.
    ``memory`` likewise."""
    memory: str = "512m"
    ttl: float = Field(default=3600.0, gt=0)
    """Default lifetime in seconds when the client asks for none."""
    env: dict[str, str] = Field(default_factory=dict)
    default_timeout: float = Field(default=120.0, ge=0)
    start: str | None = None
    """A command each new sandbox of this template starts in the background (a job, as
    `sandboxes.jobs` runs them) before its create answers: a server the template offers, such
    as the code interpreter's (`sandboxes.server.startup`)."""
    ready_port: int | None = Field(default=None, ge=1, le=65535)
    """The port inside the sandbox that ``start`` listens on: the create answers once it accepts
    connections, and fails (the sandbox removed) if it does not within ``ready_timeout``."""
    ready_timeout: float = Field(default=60.0, gt=0)
    egress: bool = False
    """Whether its sandboxes may reach out, through the service's egress proxy only
    (`sandboxes.server.egress`): their commands get ``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY``
    pointing at `egress_port` inside the sandbox, which the exec helper relays to the service;
    every destination is checked against the sandbox's allow-list. The sandbox still has no
    network of its own."""
    egress_allow: list[str] = Field(default_factory=list)
    """The allow-list a sandbox starts with (`sandboxes.server.egress.policy.parse_rule`), unless
    its create asks for another; changed at run time through the API."""
    egress_open_ranges: list[str] = Field(default_factory=list)
    """Non-public address ranges (``10.0.0.0/8``, ``127.0.0.0/8``) an allow-list may name; every
    other non-public address (private, loopback, link-local, the metadata address) is refused."""
    egress_port: int = Field(default=3128, ge=1, le=65535)
    """The port inside the sandbox its proxy variables point at."""
    egress_bytes_per_second: int | None = Field(default=None, ge=1)
    """Each sandbox's egress bandwidth: bytes a second through its proxy, both directions of
    all its connections together (a second's worth may pass at once); ``None``: unbounded."""
    relay_connections: int = Field(default=128, ge=1, le=10000)
    """Each sandbox's relayed connections in use at once: preview requests, WebSockets, port
    tunnels and egress connections together (`sandboxes.server.relay_limits`); one more is
    refused at once (a preview 429 with ``Retry-After``, an egress 503)."""
    relay_bytes_per_second: int | None = Field(default=100 << 20, ge=1)
    """Each sandbox's relay bandwidth: bytes a second through all its relayed connections, both
    directions together (a second's worth may pass at once); ``None``: unbounded."""
    pool_size: int = Field(default=0, ge=0, le=1000)
    """Sandboxes of this template the service keeps started and tenant-less, so that a create
    without per-sandbox options claims one instead of making one (`sandboxes.server.pool`);
    ``0``: none, every create is cold. Only a backend whose sandboxes several processes can
    select by label and whose expiry can move (Docker, Kubernetes) pools."""

    label_values_only: ClassVar[bool] = False
    """Whether tenants and clients' labels are recorded where only label values fit
    (``[A-Za-z0-9._-]``, at most 63 characters), so the service must refuse others."""

    @field_validator("memory")
    @classmethod
    def _memory_parses(cls, value: str) -> str:
        parse_memory(value)
        return value

    @property
    def memory_bytes(self) -> int:
        return parse_memory(self.memory)

    @property
    def own_loopback(self) -> bool:
        """Whether each sandbox has a loopback interface of its own (its own network namespace):
        then a port there is its alone, which egress needs (another sandbox could use its proxy)."""
        return True

    @abc.abstractmethod
    def provider(self, context: ProviderContext) -> Provider[Sandbox]:
        """This template's provider, with no expiry and no background threads of its own: the
        service enforces TTLs and sweeps."""

    def check_service(self, *, insecure: bool, tenants: Iterable[str]) -> None:
        """Raise `ValueError` if a service configured so may not use this template."""

    def missing_on_host(self) -> str | None:
        """What this host lacks for the template's sandboxes, in a sentence; ``None``: nothing."""
        return None


def register_template(backend: str, arm: type[TemplateConfig]) -> None:
    """Make ``arm`` the template of ``backend`` (a new backend, or a replacement of one)."""
    _registered[backend] = arm


def template_class(backend: str) -> type[TemplateConfig]:
    """The arm of ``backend``: registered, built in, or declared as an entry point."""
    found = _registered.get(backend)
    if found is not None:
        return found
    target = BUILTIN.get(backend)
    if target is None:
        declared = {point.name: point.value for point in entry_points(group=ENTRY_POINT_GROUP)}
        target = declared.get(backend)
    if target is None:
        known = ", ".join(sorted({*BUILTIN, *_registered}))
        raise ValueError(f"unknown backend {backend!r} (known: {known})")
    module, _, name = target.partition(":")
    arm = getattr(importlib.import_module(module), name)
    if not (isinstance(arm, type) and issubclass(arm, TemplateConfig)):
        raise ValueError(f"{target} is not a template")
    return arm


def validate_template(value: Any) -> TemplateConfig:
    """A template from its config (a mapping, by its ``backend``) or as it is."""
    if isinstance(value, TemplateConfig):
        return value
    if not isinstance(value, Mapping):
        raise ValueError("a template is a table of settings")
    backend = value.get("backend", DEFAULT_BACKEND)
    if not isinstance(backend, str):
        raise ValueError("a template's backend is a name")
    return template_class(backend).model_validate(dict(value))


Template = Annotated[TemplateConfig, PlainValidator(validate_template)]
"""A template, by its ``backend``."""
