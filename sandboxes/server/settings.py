"""Configuration of the service: environment variables ``SANDBOXES_*`` over an optional config
file (TOML or JSON) over defaults.

API keys are configured by their SHA-256 only (``python -m sandboxes.server --hash-key`` prints
it), so neither the config file nor the environment holds a usable credential. Nested values
come from the environment as JSON (``SANDBOXES_TEMPLATES='{"default": {"backend": "docker"}}'``)
or one field at a time (``SANDBOXES_DEFAULT_POLICY__RATE=20``).
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from sandboxes._output import DEFAULT_OUTPUT_LIMIT

if TYPE_CHECKING:
    from sandboxes.kubernetes import KubernetesSandboxConfig
    from sandboxes.ssh.provider import SSHProviderConfig

CONFIG_FILE_ENV = "SANDBOXES_CONFIG_FILE"
DEPRECATED = ("max_process_output_bytes", "max_process_output")
"""Settings still accepted, so a config file naming them still starts the service (unknown
settings are refused), and ignored: they budgeted background processes' output held in the
service's memory, where none is held since processes became jobs in their sandbox
(`sandboxes.server.processes`). Each process keeps at most its ``output_limit`` (under
``max_output_bytes``) in its sandbox, and a poll reads at most ``max_output_bytes``. The
service warns at start about each one set."""
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)i?b?\s*$", re.IGNORECASE)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
"""A Kubernetes label value: what a tenant and a client's label must be on a `kubernetes`
template, where they are recorded (and selected) as pod labels."""


def parse_memory(value: str) -> int:
    """Bytes in a Docker-style size (``512m``, ``2g``, ``1048576``), for quota arithmetic."""
    match = _MEMORY.match(value)
    if match is None:
        raise ValueError(f"not a memory size: {value!r} (use e.g. 512m, 2g)")
    number, unit = match.groups()
    return int(float(number) * (1 << (10 * "bkmgt".index(unit.lower() or "b"))))


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _Template(_Frozen):
    """What every template has: clients choose a template by name and nothing else."""

    cpus: float = Field(default=1.0, gt=0)
    """Enforced by the backend (Docker, the local backend's cgroup where cgroups can be
    written); always counted against the tenant's quota. ``memory`` likewise."""
    memory: str = "512m"
    ttl: float = Field(default=3600.0, gt=0)
    """Default lifetime in seconds when the client asks for none."""
    env: dict[str, str] = Field(default_factory=dict)
    default_timeout: float = Field(default=120.0, ge=0)

    @field_validator("memory")
    @classmethod
    def _memory_parses(cls, value: str) -> str:
        parse_memory(value)
        return value

    @property
    def memory_bytes(self) -> int:
        return parse_memory(self.memory)


class LocalTemplate(_Template):
    """Sandboxes as directories on the service's host, in a bubblewrap jail."""

    backend: Literal["local"] = "local"
    isolation: Literal["bwrap", "none"] = "bwrap"
    """``none`` runs commands as the service's own user with access to everything it can read
    (its keys included), so it is refused unless the service is ``insecure``."""


class DockerTemplate(_Template):
    """Sandboxes as containers of the service's Docker engine."""

    backend: Literal["docker"]
    image: str = "sandboxes/runtime:latest"
    disk: str | None = "1g"
    """The workspace's size (a tmpfs volume; see `DockerSandboxConfig.disk`); ``None``: a
    persistent volume on the engine's disk, unbounded."""
    labels: dict[str, str] = Field(default_factory=dict)
    """The operator's own labels on every container and volume of the template."""

    @field_validator("disk")
    @classmethod
    def _disk_parses(cls, value: str | None) -> str | None:
        if value is not None:
            parse_memory(value)
        return value


class SSHTemplate(_Template):
    """Sandboxes as workspaces on SSH hosts. Its other fields are `SSHProviderConfig`'s
    (``hosts`` with their keys and known_hosts, ``workspace_root``, ``isolation``, ...), checked
    by it when the config is loaded; kept apart so that a service without SSH templates does not
    need paramiko. ``cpus`` and ``memory`` are only counted against quotas: an SSH host enforces
    neither per sandbox."""

    model_config = ConfigDict(frozen=True, extra="allow")

    backend: Literal["ssh"]

    @model_validator(mode="after")
    def _provider_config_loads(self) -> SSHTemplate:
        self.provider_config(DEFAULT_OUTPUT_LIMIT)
        return self

    def provider_config(self, output_limit: int) -> SSHProviderConfig:
        """The provider's config: this template's SSH fields, and the service's limits. Its
        sandboxes get no expiry of the provider's: the service enforces (and renews) TTLs."""
        from sandboxes.ssh.provider import SSHProviderConfig

        shared = {"default_timeout": self.default_timeout, "env": self.env, "output_limit": output_limit}
        return SSHProviderConfig.model_validate({**(self.model_extra or {}), **shared})


class KubernetesTemplate(_Template):
    """Sandboxes as pods of a Kubernetes cluster (the service's own, in-cluster credentials,
    or a kubeconfig). Its other fields are `KubernetesSandboxConfig`'s (``namespace``,
    ``image``, ``image_pull_policy``, ``runtime_class_name``, ``node_selector``, ...), checked
    when the config is loaded; kept apart so that a service without them needs no kubernetes
    client. ``cpus`` and ``memory`` become the pod's limits and count against quotas."""

    model_config = ConfigDict(frozen=True, extra="allow")

    backend: Literal["kubernetes"]

    @model_validator(mode="after")
    def _sandbox_config_loads(self) -> KubernetesTemplate:
        self.sandbox_config(owner="sandboxes-service", output_limit=DEFAULT_OUTPUT_LIMIT)
        return self

    def sandbox_config(self, *, owner: str, output_limit: int) -> KubernetesSandboxConfig:
        """The pods' config: this template's fields, and the service's owner and limits. No
        expiry of the provider's: the service enforces (and renews) TTLs."""
        from sandboxes.kubernetes import KubernetesSandboxConfig

        shared = {
            "cpu_limit": f"{self.cpus:g}",
            "memory_limit": str(self.memory_bytes),
            "env": self.env,
            "default_timeout": self.default_timeout,
            "output_limit": output_limit,
            "owner": owner,
            "ttl": None,
        }
        return KubernetesSandboxConfig.model_validate({**(self.model_extra or {}), **shared})


def _backend_of(value: Any) -> str:
    """Templates without ``backend`` are local ones, as before templates had per-backend types."""
    if isinstance(value, dict):
        return str(value.get("backend", "local"))
    if isinstance(value, LocalTemplate | DockerTemplate | SSHTemplate | KubernetesTemplate):
        return value.backend
    return "local"


Template = Annotated[
    Annotated[LocalTemplate, Tag("local")]
    | Annotated[DockerTemplate, Tag("docker")]
    | Annotated[SSHTemplate, Tag("ssh")]
    | Annotated[KubernetesTemplate, Tag("kubernetes")],
    Discriminator(_backend_of),
]
"""A template, by its ``backend``."""


def _default_templates() -> dict[str, Template]:
    return {"default": LocalTemplate()}


class TenantPolicy(_Frozen):
    max_sandboxes: int = Field(default=10, ge=0)
    max_cpus: float = Field(default=8.0, ge=0)
    max_memory: str = "16g"
    rate: float = Field(default=100.0, gt=0)
    """Requests per second, sustained (token bucket refill rate)."""
    burst: int = Field(default=200, ge=1)
    """Requests allowed at once before the rate applies (token bucket size)."""
    max_process_output: str = "256m"
    """Deprecated, ignored (`DEPRECATED`): background processes' output is no longer held in the
    service's memory, but in their sandbox, at most ``output_limit`` per process."""
    max_commands: int = Field(default=16, ge=1)
    """Commands of the tenant running at once, in all its sandboxes (execute, streamed and
    background); one more waits its turn while they keep ending, and is refused with
    ``rate_limited`` (429, ``Retry-After``) once none ended for ``command_slot_wait``. Also
    the most re-attached streams of streamed commands it may have open at once (one more is
    refused the same way)."""
    max_file_operations: int = Field(default=16, ge=1)
    """File operations of the tenant running at once, in all its sandboxes; one more waits for
    one of them to end, and is refused with ``rate_limited`` (429) if none does soon
    (`sandboxes.server.fairness`). They run in threads of their own, as many as the tenants'
    caps together (created as needed), apart from `worker_threads`."""

    @field_validator("max_memory", "max_process_output")
    @classmethod
    def _memory_parses(cls, value: str) -> str:
        parse_memory(value)
        return value

    @property
    def max_memory_bytes(self) -> int:
        return parse_memory(self.max_memory)


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SANDBOXES_", env_nested_delimiter="__", extra="forbid")

    config_file: Path | None = None
    """TOML or JSON file with any of these fields; also from ``SANDBOXES_CONFIG_FILE``."""
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    data_dir: Path = Field(default_factory=lambda: Path.home() / ".local" / "share" / "sandboxes")
    """Local sandboxes' directories and the state that survives a restart."""
    owner: str = "sandboxes-service"
    """Value of the ``io.sandboxes.owner`` label on this service's containers: at start-up it
    adopts or reaps exactly these, so two services on one engine need different owners."""
    templates: dict[str, Template] = Field(default_factory=lambda: _default_templates())
    api_keys: dict[str, str] = Field(default_factory=dict)
    """SHA-256 (hex) of each API key -> the tenant it authenticates."""
    tenants: dict[str, TenantPolicy] = Field(default_factory=dict)
    default_policy: TenantPolicy = Field(default_factory=TenantPolicy)
    """Quotas and rate of tenants without an entry in ``tenants``."""
    insecure: bool = False
    """Start without API keys (every request is tenant ``anonymous``) and allow unisolated
    local templates. Only for a laptop."""
    docker_url: str | None = None
    """Docker engine to use; ``None``: the environment's (``DOCKER_HOST`` or the local socket)."""
    max_ttl: float = Field(default=24 * 3600.0, gt=0)
    max_execute_timeout: float = Field(default=3600.0, gt=0)
    """Ceiling on a command's timeout; a request for none (0) gets this."""
    max_output_bytes: int = Field(default=16 << 20, gt=0)
    """Ceiling on the output a command keeps (and streams) when its request asks for more; a
    request that names no ``output_limit`` keeps `DEFAULT_OUTPUT_LIMIT`, as on every backend."""
    stream_keepalive: float = Field(default=15.0, gt=0)
    """Seconds without output after which a streamed execute sends a keep-alive (an ``output``
    event with no text), so that proxies which cut idle connections keep a quiet command's stream."""
    max_body_bytes: int = Field(default=64 << 20, gt=0)
    """Largest JSON request body (uploads travel base64 in it)."""
    max_inline_download_bytes: int = Field(default=8 << 20, gt=0)
    """Largest file ``files/download`` answers (base64 in JSON); bigger ones answer
    ``file_too_large``, and the client streams them through ``GET /archive``."""
    max_archive_bytes: int = Field(default=4 << 30, gt=0)
    """Largest tar stream accepted by ``PUT /archive`` (streamed, so this bounds disk, not memory)."""
    max_archive_file_bytes: int = Field(default=4 << 30, gt=0)
    """Largest file ``GET /archive`` streams: an archive with a bigger one is refused
    (``too_large``) at its header, before its first byte (`sandboxes.server.members`)."""
    max_archive_members: int = Field(default=100_000, gt=0)
    """Most members a ``PUT /archive`` tar may have."""
    max_archive_expansion: int = Field(default=256 << 20, ge=0)
    """Most bytes an archive may expand to beyond its own size (sparse holes, compression):
    what a small upload may cost the service host's disk while it is spooled."""
    max_processes: int = Field(default=16, gt=0)
    """Background processes running at once per sandbox."""
    max_process_output_bytes: int = Field(default=64 << 20, gt=0)
    """Deprecated, ignored (`DEPRECATED`): background processes' output is no longer held in the
    service's memory, but in their sandbox, at most ``output_limit`` per process."""
    sweep_interval: float = Field(default=10.0, gt=0)
    """Seconds between sweeps: expired sandboxes reaped, and (Docker, Kubernetes) what this
    replica holds compared with what the backend records (deleted or renewed elsewhere)."""
    confirm_interval: float = Field(default=1.0, ge=0)
    """Seconds a replica trusts what it holds of a Docker or Kubernetes sandbox (that it exists,
    its expiry) before a request re-reads its record: another replica may have deleted or
    renewed it. ``0``: every request reads it (one label-selected list per request)."""
    worker_threads: int = Field(default=64, gt=0)
    """Threads for blocking backend calls (archives, lifecycle); file operations have their own
    (`TenantPolicy.max_file_operations`)."""
    file_operation_timeout: float = Field(default=30.0, gt=0)
    """Seconds one file operation may run in a sandbox before it is killed and answered
    ``timeout`` (the library's default, `BaseSandbox.operation_timeout`, is 300)."""
    command_threads: int = Field(default=256, gt=0)
    """Threads for commands that are waited on by a thread (local sandboxes; Docker ones whose
    exec helper is not up yet: on Docker commands are otherwise awaited and hold none). Each
    holds one for its duration, so tenants' ``max_commands`` together should stay under it.
    Apart from `worker_threads`, so file operations never wait behind commands."""
    command_slot_wait: float = Field(default=5.0, ge=0)
    """Seconds a command waiting for one of its tenant's ``max_commands`` slots waits with none
    of the tenant's commands ending before it is refused (``0``: at once); waiters get slots in
    the order they came, and a queue that moves is never refused."""
    max_header_bytes: int = Field(default=16 << 10, gt=0)
    """Largest request head (request line and headers); a bigger one is refused before it is
    parsed to the end."""
    metrics_access: Literal["key", "open"] = "key"
    """``/metrics`` needs an API key (``key``, like every ``/v1`` route) or answers anyone
    (``open``: only behind a network that keeps strangers off the port)."""
    drain_timeout: float = Field(default=30.0, ge=0)
    """Seconds a shutdown waits for in-flight requests."""
    log_level: str = "INFO"

    @field_validator("api_keys")
    @classmethod
    def _hashes_only(cls, value: dict[str, str]) -> dict[str, str]:
        normalized = {}
        for digest, tenant in value.items():
            if not _SHA256.match(digest.lower()):
                raise ValueError("api_keys maps the SHA-256 hex digest of a key (not the key) to a tenant")
            if not tenant:
                raise ValueError("every API key needs a tenant")
            normalized[digest.lower()] = tenant
        return normalized

    @model_validator(mode="after")
    def _check(self) -> ServiceSettings:
        if not self.templates:
            raise ValueError("at least one template is needed")
        for name, template in self.templates.items():
            if isinstance(template, LocalTemplate) and template.isolation == "none" and not self.insecure:
                raise ValueError(f"template {name!r} has isolation 'none': allowed only with insecure")
        if any(isinstance(template, KubernetesTemplate) for template in self.templates.values()):
            for tenant in sorted({*self.api_keys.values(), *self.tenants}):
                if not LABEL_VALUE.match(tenant):
                    raise ValueError(
                        f"tenant {tenant!r} cannot be a pod label (the record of whose a sandbox is): "
                        "63 characters at most, [A-Za-z0-9._-], starting and ending alphanumeric"
                    )
        return self

    def policy_for(self, tenant: str) -> TenantPolicy:
        return self.tenants.get(tenant, self.default_policy)

    def deprecated_set(self) -> list[str]:
        """The `DEPRECATED` settings this configuration sets, which the service ignores."""
        found = [name for name in DEPRECATED if name in self.model_fields_set]
        policies = {"default_policy": self.default_policy} | {f"tenants.{k}": v for k, v in self.tenants.items()}
        found += [
            f"{where}.{name}" for where, p in policies.items() for name in DEPRECATED if name in p.model_fields_set
        ]
        return found

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        explicit = getattr(init_settings, "init_kwargs", {}).get("config_file")
        path = explicit or os.environ.get(CONFIG_FILE_ENV)
        return init_settings, env_settings, _ConfigFile(settings_cls, Path(path) if path else None)


class _ConfigFile(PydanticBaseSettingsSource):
    """The config file, below the environment: an operator overrides one value with one
    variable without editing the file."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self._data = _read_config(path) if path is not None else {}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


def _read_config(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the config file must hold a table/object")
    return data
