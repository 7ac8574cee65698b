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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from sandboxes.templates import Template as Template
from sandboxes.templates import parse_memory, validate_template

CONFIG_FILE_ENV = "SANDBOXES_CONFIG_FILE"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
"""A Kubernetes label value: what a tenant and a client's label must be on a `kubernetes`
template, where they are recorded (and selected) as pod labels."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _default_templates() -> dict[str, Template]:
    return {"default": validate_template({})}


class EgressCredential(_Frozen):
    """Headers the egress proxy adds to a tenant's plain-HTTP requests for ``host`` (exact, or
    ``*.domain``): a token its sandboxes use without ever holding it."""

    host: str = Field(min_length=1, max_length=253)
    headers: dict[str, SecretStr]


class TenantPolicy(_Frozen):
    max_sandboxes: int = Field(default=10, ge=0)
    max_cpus: float = Field(default=8.0, ge=0)
    max_memory: str = "16g"
    max_volume_bytes: int = Field(default=10 << 30, ge=0)
    """Bytes of volumes (their ``size_limit``s) the tenant may hold."""
    rate: float = Field(default=100.0, gt=0)
    """Requests per second, sustained (token bucket refill rate)."""
    burst: int = Field(default=200, ge=1)
    """Requests allowed at once before the rate applies (token bucket size)."""
    max_commands: int = Field(default=16, ge=1)
    """Commands of the tenant running at once, in all its sandboxes (execute, streamed and
    background); one more waits its turn while they keep ending, and is refused with
    ``rate_limited`` (429, ``Retry-After``) once none ended for ``command_slot_wait``. Also
    the most re-attached streams of streamed commands it may have open at once (one more is
    refused the same way)."""
    max_watchers: int = Field(default=16, ge=1)
    """File watches of the tenant open at once, in all its sandboxes, streamed and polled; one
    more is refused with ``rate_limited`` (429)."""
    max_snapshot_bytes: int = Field(default=10 << 30, ge=0)
    """Bytes the tenant's snapshots may take in the snapshot store, in all."""
    egress_credentials: list[EgressCredential] = Field(default_factory=list)
    """Added by the egress proxy to the tenant's sandboxes' requests (`EgressCredential`)."""
    max_file_operations: int = Field(default=16, ge=1)
    """File operations of the tenant running at once, in all its sandboxes; one more waits for
    one of them to end, and is refused with ``rate_limited`` (429) if none does soon
    (`sandboxes.server.fairness`). They run in threads of their own, as many as the tenants'
    caps together (created as needed), apart from `worker_threads`."""

    @field_validator("max_memory")
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
    console: bool = False
    """Serve the web console at ``/console`` (built by ``console/build.sh``; the same keys as the API)."""
    operators: list[str] = Field(default_factory=list)
    """Tenants whose keys are also an operator's: they see every tenant's usage
    (``GET /v1/operator/overview``, the console's operator page)."""
    docker_url: str | None = None
    """Docker engine to use; ``None``: the environment's (``DOCKER_HOST`` or the local socket)."""
    snapshot_dir: Path | None = None
    """The snapshot store (`sandboxes.server.snapshots`), shared by the service's replicas;
    ``None``: ``<data_dir>/snapshots``."""
    max_ttl: float = Field(default=24 * 3600.0, gt=0)
    max_execute_timeout: float = Field(default=3600.0, gt=0)
    """Ceiling on a command's timeout; a request for none (0) gets this."""
    max_output_bytes: int = Field(default=16 << 20, gt=0)
    """Ceiling on the output a command keeps (and streams) when its request asks for more; a
    request that names no ``output_limit`` keeps `DEFAULT_OUTPUT_LIMIT`, as on every backend."""
    stream_keepalive: float = Field(default=15.0, gt=0)
    """Seconds without output after which a streamed execute sends a keep-alive (an ``output``
    event with no text), so that proxies which cut idle connections keep a quiet command's stream."""
    watcher_idle: float = Field(default=60.0, gt=0)
    """Seconds a polled file watcher lives without a poll: then it is removed."""
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
    mcp: bool = False
    """Serve MCP over streamable HTTP at ``/mcp`` (the ``mcp`` extra): tools that call this API
    as the tenant whose key each request bears (`sandboxes.mcp`)."""
    default_volume_size: int = Field(default=1 << 30, gt=0)
    """A volume's ``size_limit`` when its creator gives none (bytes)."""
    sample_interval: float = Field(default=5.0, ge=0)
    """Seconds between two samples of each running sandbox's usage (CPU, memory, disk) through
    its exec helper, if one runs (none is started to sample); ``0``: no sampling."""
    sample_history: int = Field(default=720, ge=1)
    """Samples kept per sandbox while it lives (the oldest dropped first)."""
    sample_gauges_per_sandbox: bool = False
    """Whether ``/metrics`` has a gauge series per sandbox (labels ``sandbox``, ``tenant``), on
    top of the sums per backend: one series each per live sandbox."""
    drain_timeout: float = Field(default=30.0, ge=0)
    """Seconds a shutdown waits for in-flight requests."""
    preview_domain: str | None = Field(default=None, pattern=r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")
    """A wildcard domain routed to this service (``*.preview.example``): a request whose Host is
    ``{port}-{sandbox id}.{domain}`` is a preview of that port (`sandboxes.server.previews`)."""
    preview_token_secret: SecretStr | None = None
    """Signs preview tokens; replicas must share it. Unset: one kept in the data directory."""
    revoked_previews_dir: Path | None = None
    """Where preview tokens' revocations are recorded (`sandboxes.server.previews`): a directory
    every replica that must refuse them shares (the Helm chart's is on the snapshot store's
    volume); ``None``: ``<data_dir>/revoked-previews``."""
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
            if template.egress and not template.own_loopback:
                raise ValueError(
                    f"template {name!r}: egress needs sandboxes with a loopback of their own, and these share "
                    "their host's (another sandbox could use their proxy)"
                )
        tenants = {*self.api_keys.values(), *self.tenants}
        for name, template in self.templates.items():
            try:
                template.check_service(insecure=self.insecure, tenants=tenants)
            except ValueError as exc:
                raise ValueError(f"template {name!r}: {exc}") from exc
        return self

    def policy_for(self, tenant: str) -> TenantPolicy:
        return self.tenants.get(tenant, self.default_policy)

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
