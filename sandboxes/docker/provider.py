"""`DockerProvider`: creates Docker sandboxes from a template, keeps a warm pool of them, and
reaps what expired or was orphaned, by label.

Every container and workspace volume carries ``io.sandboxes.*`` labels (managed, owner,
sandbox id, expiry), so whatever a crash leaves behind can be found and reaped later.

Pooled sandboxes and their expiry. Docker labels cannot change after creation, so a pooled
container cannot learn its acquisition time from its label. Instead a pooled container is
labelled to expire at ``creation + pool_max_idle + ttl``, and the pool never hands out (and
recycles) a container idle longer than ``pool_max_idle``. So every acquired sandbox lives at
least ``ttl`` after its acquisition and at most ``pool_max_idle`` longer; a provider that
crashes leaves pooled containers that the next sweep of the same owner reaps at that expiry.
Pool membership itself lives in memory; ``io.sandboxes.pool=<provider id>`` only tells which
provider made a container, so its leftovers can be listed.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from sandboxes._pool import PoolConfig, WarmPool
from sandboxes.docker._containers import (
    LABEL_POOL,
    changing,
    container_name,
    create_container,
    created_at,
    expired,
    recorded_expiry,
    remove_sandbox,
    workspace_in_memory,
)
from sandboxes.docker._volumes import create_volume, remove_volume
from sandboxes.docker.config import (
    LABEL_EXPIRES,
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_SANDBOX,
    DockerSandboxConfig,
)
from sandboxes.docker.sandbox import DockerSandbox
from sandboxes.lifecycle import FINAL_EXPIRY, CreateOptions, SandboxRecord, Sweep

__all__ = ["DockerProvider", "DockerProviderConfig", "SweepReport"]

LABEL_CALLER_KEYS = "io.sandboxes.caller-labels"
"""JSON list of the label keys a sandbox was created with (`CreateOptions.labels`): a
container's labels also hold its image's and its template's, which are not the caller's."""

_OWN_LABELS = frozenset({LABEL_MANAGED, LABEL_OWNER, LABEL_SANDBOX, LABEL_EXPIRES, LABEL_POOL, LABEL_CALLER_KEYS})

logger = logging.getLogger(__name__)


class DockerProviderConfig(PoolConfig):
    """How a provider pools and sweeps (`PoolConfig`), and how long an orphan volume may wait."""

    orphan_grace: float = Field(default=60.0, ge=0)
    """A workspace volume without a container is only reaped once this old: the volume is
    created just before its container, and a sweep must not reap it in between."""


@dataclass
class SweepReport(Sweep):
    """`Sweep`, with what was removed told apart: ``removed`` lists both."""

    containers: list[str] = field(default_factory=list)
    """Ids of the expired containers removed (each with its workspace volume)."""
    orphan_volumes: list[str] = field(default_factory=list)
    """Names of the workspace volumes removed because their container was gone."""
    errors: list[str] = field(default_factory=list)
    """What could not be removed; the next sweep tries again."""


class DockerProvider(WarmPool[DockerSandbox]):
    """Creates `DockerSandbox` instances from one template; optionally pools and sweeps them.
    A `sandboxes.lifecycle.PooledProvider`, `ResumableProvider` and `SharedProvider`: refs are
    container ids.

    ``DockerProvider(template, client=client, pool_size=2)`` takes any `DockerProviderConfig`
    field as a keyword (or a whole ``config=``). The pool and the periodic sweep run in one
    background thread between `start` and `close` (or ``with provider:``); `create`, `acquire`
    and `sweep` also work without it.
    """

    config: DockerProviderConfig

    def __init__(
        self,
        template: DockerSandboxConfig | None = None,
        *,
        client: Any = None,
        config: DockerProviderConfig | None = None,
        **options: Any,
    ) -> None:
        import docker

        self.template = template or DockerSandboxConfig()
        self.client = client or docker.from_env()
        super().__init__(_merge_config(config, options))
        self._pool_template = _pooled_template(self.template, self.id, self.config.pool_max_idle)

    # ------------------------------------------------------------------ creating

    def create(self, options: CreateOptions | None = None) -> DockerSandbox:
        """A new sandbox, cold: its exec helper starts with its first command. ``options``'
        labels become container labels beside the provider's own, its env and ttl override the
        template's."""
        config = _with_options(self.template, options)
        container = create_container(self.client, config, options.name if options else None)
        return DockerSandbox(container, self.client, config)

    def create_volume(self, name: str, labels: Mapping[str, str], size: int) -> str:
        """`sandboxes.lifecycle.VolumeProvider`: a named volume (`sandboxes.docker._volumes`)."""
        return create_volume(self.client, self.template, name, labels)

    def remove_volume(self, ref: str) -> None:
        remove_volume(self.client, self.template, ref)

    def check_ready(self) -> None:
        """Raise if the Docker engine does not answer a ping."""
        self.client.ping()

    def attach(self, ref: str) -> DockerSandbox:
        """A handle on this owner's container ``ref`` (its id or name); `LookupError` if there
        is none. ``with`` only closes it."""
        import docker.errors

        try:
            container = self.client.containers.get(ref)
        except docker.errors.NotFound as exc:
            raise LookupError(f"no container {ref!r}") from exc
        if not self._mine(container.labels or {}):
            raise LookupError(f"container {ref!r} is not a sandbox of owner {self.template.owner!r}")
        # Its environment, the template's and its `CreateOptions.env`, is the container's own,
        # which every ``docker exec`` inherits: the template's config is enough to run in it.
        return DockerSandbox(container, self.client, self.template, owned=False)

    def select(self, labels: Mapping[str, str]) -> list[SandboxRecord]:
        """This owner's containers carrying all of ``labels``, filtered by the engine."""
        selector = [f"{LABEL_MANAGED}=true", f"{LABEL_OWNER}={self.template.owner}"]
        selector += [f"{key}={value}" for key, value in labels.items()]
        containers = self.client.containers.list(all=True, sparse=True, filters={"label": selector})
        return [self._record(container.attrs) for container in containers]

    @property
    def records_scope(self) -> tuple[str, int, str]:
        """What `select` lists: providers with the same scope (one engine's client, one owner)
        list the same containers, whatever their templates."""
        return ("docker", id(self.client), self.template.owner)

    def list(self) -> list[SandboxRecord]:
        """This owner's containers, running or stopped, from their labels alone."""
        return self.select({})

    def set_expiry(self, ref: str, expires_at: float) -> None:
        """Record a new expiry in the container's name (`container_name`: its labels cannot
        change). Two processes renaming at once: the last rename wins, as a last write would,
        except over a final expiry (`FINAL_EXPIRY`), which the name read just before refuses to
        move. `LookupError` if this owner has no container ``ref``, it is being removed, or its
        expiry is final."""
        import docker.errors

        try:
            container = self.client.containers.get(ref)
            if not self._mine(container.labels or {}):
                raise LookupError(f"container {ref!r} is not a sandbox of owner {self.template.owner!r}")
            recorded = recorded_expiry(container.attrs)
            if recorded is not None and recorded <= FINAL_EXPIRY < expires_at:
                raise LookupError(f"container {ref!r} is recorded deleted: its expiry is final")
            name = container_name(container.labels[LABEL_SANDBOX], expires_at)
            if container.name != name:
                with changing(container.id):  # after a removal under way: then NotFound
                    container.rename(name)
        except docker.errors.NotFound as exc:
            raise LookupError(f"no container {ref!r}") from exc
        except docker.errors.APIError as exc:
            # 400: it has that name already (another process renamed it to the same expiry
            # since our lookup); 409: it is dead or being removed. Only the name tells.
            if exc.status_code not in (400, 409):
                raise
            if self._current_name(ref) != name:
                raise LookupError(f"container {ref!r} could not be renamed: {exc.explanation}") from exc

    def _current_name(self, ref: str) -> str | None:
        import docker.errors

        try:
            return str(self.client.containers.get(ref).name)
        except docker.errors.NotFound:
            return None

    def destroy(self, ref: str) -> None:
        """Remove container ``ref`` and its workspace volume; gone already is fine."""
        remove_sandbox(self.client, ref)

    def resume(self, ref: str) -> bool:
        """Start a stopped container again, unless its workspace was in memory (a tmpfs
        volume, the default ``disk``): stopped, it lost its files, and restarting it would hand
        out an empty workspace as if nothing happened."""
        import docker.errors

        try:
            container = self.client.containers.get(ref)
            if container.status == "running":
                return True
            if workspace_in_memory(self.client, container):
                logger.warning("container %s stopped with its workspace in memory: not resumed", ref[:12])
                return False
            container.start()
        except docker.errors.DockerException as exc:
            logger.warning("cannot resume container %s: %s", ref[:12], exc)
            return False
        return True

    def _mine(self, labels: dict[str, str]) -> bool:
        return labels.get(LABEL_MANAGED) == "true" and labels.get(LABEL_OWNER) == self.template.owner

    def _record(self, attrs: dict[str, Any]) -> SandboxRecord:
        labels: dict[str, str] = attrs.get("Labels") or {}
        caller = {key: labels[key] for key in _caller_keys(labels) if key in labels}
        expires_at = recorded_expiry(attrs)
        created = attrs.get("Created")
        return SandboxRecord(
            id=str(attrs.get("Id")),
            ref=str(attrs.get("Id")),
            labels=caller,
            created_at=float(created) if isinstance(created, int | float) else 0.0,
            expires_at=expires_at,
            running=attrs.get("State") in ("running", "paused"),
            frozen=attrs.get("State") == "paused",
            starting=attrs.get("State") == "created",
        )

    # ------------------------------------------------------------------ sweeping

    def sweep(self, now: float | None = None) -> SweepReport:
        """Remove this owner's containers whose expiry passed (with their volumes), and this
        owner's workspace volumes whose container is gone. Other owners' are never touched;
        this provider's own idle pool is left to the pool, which replaces stale entries."""
        now = time.time() if now is None else now
        owner = self.template.owner
        report = SweepReport()
        pooled = self._pooled_refs()
        # Volumes first: a volume created after this list is not considered, and one created
        # before it whose container does not exist yet is protected by `orphan_grace`.
        volumes = self.client.volumes.list(filters={"label": [f"{LABEL_MANAGED}=true", f"{LABEL_OWNER}={owner}"]})
        containers = self.client.containers.list(all=True, sparse=True, filters={"label": f"{LABEL_MANAGED}=true"})
        live: set[str] = set()
        removed: set[str] = set()
        for container in containers:
            labels: dict[str, str] = container.attrs.get("Labels") or {}
            sandbox_id = labels.get(LABEL_SANDBOX, "")
            if labels.get(LABEL_OWNER) != owner or container.id in pooled or not expired(container.attrs, now):
                live.add(sandbox_id)
                continue
            try:
                with changing(container.id):  # no renewal between this look and the removal
                    if not self._expired_now(container.id, now):  # renewed since the list
                        live.add(sandbox_id)
                        continue
                    remove_sandbox(self.client, container.id)
            except Exception as exc:
                live.add(sandbox_id)
                report.errors.append(f"container {container.id[:12]}: {exc}")
            else:
                removed.add(sandbox_id)
                report.containers.append(container.id)
                report.removed.append(container.id)
        for volume in volumes:
            volume_sandbox = (volume.attrs.get("Labels") or {}).get(LABEL_SANDBOX, "")
            if not volume_sandbox or volume_sandbox in live or volume_sandbox in removed:
                continue
            if created_at(volume.attrs) > now - self.config.orphan_grace:
                continue
            try:
                volume.remove(force=True)
            except Exception as exc:
                if not _is_not_found(exc):
                    report.errors.append(f"volume {volume.name}: {exc}")
            else:
                report.orphan_volumes.append(volume.name)
                report.removed.append(volume.name)
        return report

    def _expired_now(self, ref: str, now: float) -> bool:
        """Whether container ``ref`` is expired as the engine says now: the list a sweep works
        through ages while containers are removed one by one (each a kill), and another process
        may have moved an expiry meanwhile (`set_expiry`). Gone is not expired (nothing to do)."""
        import docker.errors

        try:
            return expired(self.client.containers.get(ref).attrs, now)
        except docker.errors.NotFound:
            return False

    # ------------------------------------------------------------------ the pool's hooks

    def _make_pooled(self) -> DockerSandbox:
        return DockerSandbox(create_container(self.client, self._pool_template), self.client, self.template)

    def _ref(self, sandbox: DockerSandbox) -> str:
        return sandbox.id

    def _usable(self, sandbox: DockerSandbox) -> bool:
        """A live helper stream proves its container runs, for free; otherwise ask the daemon
        (the helper-less fallback, or a death)."""
        if sandbox.helper_alive:
            return True
        try:
            sandbox.container.reload()
        except Exception:
            return False
        return bool(sandbox.container.status == "running")

    def _discard(self, sandbox: DockerSandbox) -> None:
        try:
            sandbox.destroy()
        except Exception:
            logger.warning("could not destroy pooled sandbox %s; a sweep will reap it", sandbox.id[:12], exc_info=True)

    def _log_sweep(self, report: Sweep) -> None:
        containers = report.containers if isinstance(report, SweepReport) else report.removed
        volumes = report.orphan_volumes if isinstance(report, SweepReport) else []
        if containers or volumes:
            logger.info("sweep removed %d containers, %d orphan volumes", len(containers), len(volumes))
        for error in report.errors:
            logger.warning("sweep could not remove %s", error)


def _with_options(template: DockerSandboxConfig, options: CreateOptions | None) -> DockerSandboxConfig:
    """The template with one sandbox's labels, env and ttl (``None``: the template's)."""
    options = options or CreateOptions()
    keys = json.dumps(sorted(options.labels))
    update: dict[str, Any] = {
        "labels": {**template.labels, **options.labels, LABEL_CALLER_KEYS: keys},
        "env": {**template.env, **options.env},
    }
    if options.mounts:
        update["mounts"] = options.mounts
    if options.ttl is not None:
        update["ttl"] = options.ttl
    if options.expires_at is not None:  # a label like the ttl's; `set_expiry` moves it
        update["labels"][LABEL_EXPIRES] = str(math.ceil(options.expires_at))
        update["ttl"] = None
    return template.model_copy(update=update)


def _caller_keys(labels: dict[str, str]) -> list[str]:
    """The keys of `CreateOptions.labels`, as recorded; a container made before they were
    recorded (a service's, by an earlier version) counts its ``io.sandboxes.*`` labels."""
    try:
        keys = json.loads(labels[LABEL_CALLER_KEYS])
    except (KeyError, ValueError):
        return [key for key in labels if key.startswith("io.sandboxes.") and key not in _OWN_LABELS]
    return [key for key in keys if isinstance(key, str) and key not in _OWN_LABELS] if isinstance(keys, list) else []


def _merge_config(config: DockerProviderConfig | None, options: dict[str, Any]) -> DockerProviderConfig:
    if not options:
        return config or DockerProviderConfig()
    base = config.model_dump(exclude_unset=True) if config is not None else {}
    return DockerProviderConfig.model_validate({**base, **options})


def _pooled_template(template: DockerSandboxConfig, provider_id: str, max_idle: float) -> DockerSandboxConfig:
    """The template pooled containers are created from: the pool label, and an expiry pushed
    back by ``max_idle`` so the ttl still counts from acquisition (see the module docstring)."""
    ttl = None if template.ttl is None else template.ttl + max_idle
    labels = {**template.labels, LABEL_POOL: provider_id, LABEL_CALLER_KEYS: "[]"}
    return template.model_copy(update={"labels": labels, "ttl": ttl})


def _is_not_found(exc: Exception) -> bool:
    import docker.errors

    return isinstance(exc, docker.errors.NotFound)
