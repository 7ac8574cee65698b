"""Tenants' volumes: named directories that outlive sandboxes, held by a template's backend
(`sandboxes.lifecycle.VolumeProvider`: a Docker named volume, a directory of the local host)
and mounted into new sandboxes of that template (`CreateSandbox.volumes`).

One small JSON record per volume under the service's data directory (the tenant's, by a digest
of its name, so no tenant name becomes a path), written atomically; the backend holds the files
and labels them. A tenant's volumes count their ``size_limit`` against its
``max_volume_bytes``. A volume is deleted only while no sandbox this service holds mounts it,
and the backend refuses too where it can tell (Docker: a volume in use). All bookkeeping runs
on the event loop under one lock, so a quota check and the record that follows it never
interleave with another request's; backend calls run in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import posixpath
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from sandboxes import api
from sandboxes.lifecycle import Mount, VolumeInUse, VolumeProvider
from sandboxes.server.backends import ProviderBackend
from sandboxes.server.errors import ServiceError
from sandboxes.server.settings import ServiceSettings

__all__ = ["VolumeRecord", "Volumes"]

LABEL_VOLUME = "io.sandboxes.volume"
LABEL_VOLUME_TENANT = "io.sandboxes.volume-tenant"

UNAVAILABLE = {
    "ssh": "an SSH sandbox is a pooled user of the VM, a different one each time: a directory one "
    "sandbox user owns cannot be handed to the next without root on the VM at every mount, which "
    "the SSH backend does not have",
}
"""Why a backend has no volumes, in a sentence a tenant reads."""


@dataclass
class VolumeRecord:
    tenant: str
    name: str
    template: str
    backend: str
    ref: str
    """The backend's name of the volume (`VolumeProvider.create_volume`'s answer)."""
    size_limit: int
    created_at: float

    def info(self, mounted_by: list[str]) -> api.VolumeInfo:
        return api.VolumeInfo(
            name=self.name,
            template=self.template,
            backend=self.backend,
            size_limit=self.size_limit,
            created_at=self.created_at,
            mounted_by=mounted_by,
        )


MountedBy = Callable[[str, str], list[str]]
"""(tenant, volume name) -> the ids of the held sandboxes that mount it."""


class Volumes:
    """The tenants' volumes of one service, recorded under ``data_dir/volumes``."""

    def __init__(self, settings: ServiceSettings, backends: dict[str, ProviderBackend]) -> None:
        self.settings = settings
        self.backends = backends
        self.directory = settings.data_dir / "volumes"
        self._lock = asyncio.Lock()
        self._mounting: Counter[tuple[str, str]] = Counter()
        """(tenant, name) -> creations in flight that mount it (not held yet, so not `MountedBy`)."""

    # ------------------------------------------------------------------ requests

    async def create(self, tenant: str, body: api.CreateVolume, mounted_by: MountedBy) -> api.VolumeInfo:
        backend = self.backends.get(body.template)
        if backend is None:
            raise ServiceError("invalid_request", f"unknown template {body.template!r}")
        provider = _volumes_of(backend)
        size = body.size_limit or self.settings.default_volume_size
        async with self._lock:
            held = await asyncio.to_thread(self.records, tenant)
            if any(record.name == body.name for record in held):
                raise ServiceError("invalid_request", f"volume {body.name!r} exists", status=409)
            allowed = self.settings.policy_for(tenant).max_volume_bytes
            used = sum(record.size_limit for record in held)
            if used + size > allowed:
                raise ServiceError(
                    "quota_exceeded",
                    f"volumes over quota: {used} of {allowed} bytes held, {size} more asked (delete a volume first)",
                )
            labels = {LABEL_VOLUME: body.name, LABEL_VOLUME_TENANT: _digest(tenant)}
            backend_name = self._backend_name(tenant, body.name)
            ref = await asyncio.to_thread(provider.create_volume, backend_name, labels, size)
            record = VolumeRecord(tenant, body.name, body.template, backend.name, ref, size, time.time())
            await asyncio.to_thread(self._save, record)
        return record.info(mounted_by(tenant, body.name))

    def infos(self, tenant: str, mounted_by: MountedBy) -> list[api.VolumeInfo]:
        return [record.info(mounted_by(tenant, record.name)) for record in self.records(tenant)]

    async def delete(self, tenant: str, name: str, mounted_by: MountedBy) -> None:
        async with self._lock:
            record = self._find(tenant, name)
            users = mounted_by(tenant, name)
            if users:
                raise _in_use(name, ", ".join(users))
            if self._mounting[tenant, name]:
                raise _in_use(name, "a sandbox being created")
            backend = self.backends.get(record.template)
            if backend is None:
                raise ServiceError("backend_unavailable", f"volume {name!r} is on template {record.template!r}, gone")
            try:
                await asyncio.to_thread(_volumes_of(backend).remove_volume, record.ref)
            except VolumeInUse as exc:
                raise _in_use(name, "a sandbox") from exc
            await asyncio.to_thread(self._remove, record)

    @contextlib.contextmanager
    def mounting(self, tenant: str, names: list[str]) -> Iterator[None]:
        """While a sandbox that mounts ``names`` is being created: none of them is deleted."""
        keys = [(tenant, name) for name in set(names)]
        self._mounting.update(keys)
        try:
            yield
        finally:
            self._mounting.subtract(keys)
            for key in keys:
                if self._mounting[key] <= 0:
                    del self._mounting[key]

    def mounts(self, tenant: str, template: str, wanted: Iterable[api.VolumeMount]) -> tuple[Mount, ...]:
        """The backend's mounts for a new sandbox of ``template``, each path normalized:
        `not_found` for a volume the tenant does not have, `invalid_request` for one of another
        template, `permission_denied` for ``/``, 409 for two volumes at one path."""
        wanted = list(wanted)
        if not wanted:
            return ()
        _volumes_of(self.backends[template])
        mounts, paths = [], set()
        for mount in wanted:
            record = self._find(tenant, mount.name)
            if record.template != template:
                raise ServiceError(
                    "invalid_request", f"volume {mount.name!r} is for template {record.template!r}, not {template!r}"
                )
            path = "/" + posixpath.normpath(mount.path).lstrip("/")
            if path == "/":
                raise ServiceError(
                    "permission_denied", f"mount path {mount.path!r}: a volume cannot be the sandbox's /"
                )
            if path in paths:
                raise ServiceError("invalid_request", f"mount path {path!r}: two volumes at one path", status=409)
            paths.add(path)
            mounts.append(Mount(volume=record.ref, path=path, read_only=mount.read_only))
        return tuple(mounts)

    # ------------------------------------------------------------------ records

    def records(self, tenant: str) -> list[VolumeRecord]:
        found = []
        for path in sorted((self.directory / _digest(tenant)).glob("*.json")):
            with contextlib.suppress(OSError, ValueError, TypeError):
                found.append(VolumeRecord(**json.loads(path.read_text(encoding="utf-8"))))
        return [record for record in found if record.tenant == tenant]

    def _find(self, tenant: str, name: str) -> VolumeRecord:
        """The tenant's volume ``name``; `not_found` for a missing one as for another tenant's."""
        for record in self.records(tenant):
            if record.name == name:
                return record
        raise ServiceError("not_found", f"no volume {name!r}")

    def _path(self, record: VolumeRecord) -> Path:
        return self.directory / _digest(record.tenant) / f"{record.name}.json"

    def _save(self, record: VolumeRecord) -> None:
        path = self._path(record)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_text(json.dumps(asdict(record)), encoding="utf-8")
        os.replace(temporary, path)

    def _remove(self, record: VolumeRecord) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(record).unlink()

    def _backend_name(self, tenant: str, name: str) -> str:
        """Unique per service owner, tenant and name: ``<owner digest>-<tenant digest>-<name>``."""
        return f"{_digest(self.settings.owner)[:8]}-{_digest(tenant)[:16]}-{name}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _volumes_of(backend: ProviderBackend) -> VolumeProvider:
    provider = backend.provider
    if not isinstance(provider, VolumeProvider):
        kind = backend.template.backend
        reason = UNAVAILABLE.get(kind, "its provider has no volumes")
        raise ServiceError("unavailable", f"volumes are unavailable on the {kind} backend: {reason}", status=501)
    return provider


def _in_use(name: str, users: str) -> ServiceError:
    return ServiceError("invalid_request", f"volume {name!r} is mounted by {users}: delete them first", status=409)
