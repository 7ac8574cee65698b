"""The snapshot store: a directory (``snapshot_dir``, by default ``<data_dir>/snapshots``), one
directory per tenant (named by a digest of its id) holding one directory per snapshot: its
``manifest.json`` and one tar per path it kept (`sandboxes.server.manifest`).

A snapshot is complete or absent: it is written in a temporary directory beside its final
place, every file flushed to disk, then renamed there in one step; a deletion renames it away
first. `SnapshotStore.sweep` (at every start) removes what a killed service left of either:
the temporary directories of this replica (their names carry its ``writer`` tag, from its own
data directory), and another's once nothing in them changed for `ABANDONED_AFTER` (a replica
killed for good, a pod replaced under another name), never those a replica is writing now.
Bytes are counted per tenant against its ``max_snapshot_bytes``: a snapshot being written is
bounded by what was left when it began, and counted again when it is made visible (one at a
time), so snapshots written at once may be refused, never all kept over the quota.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandboxes.server.errors import ServiceError
from sandboxes.server.manifest import FileEntry

__all__ = ["KeptNetwork", "Part", "Snapshot", "SnapshotStore", "Writing"]

MANIFEST = "manifest.json"
_TEMP = ".tmp-"
ABANDONED_AFTER = 3600.0
"""Seconds after which another writer's temporary directory in which nothing changed is left
over, not being written (a snapshot being written grows its tar as its bytes arrive)."""
_GONE = ".gone-"
_SAFE_ID = re.compile(r"^[a-z0-9]{1,64}$")


@dataclass
class Part:
    """One path a snapshot kept: ``workspace`` (restored into the new sandbox's own), or an
    absolute path (restored where it was); its tar in the snapshot's directory."""

    path: str
    workspace: bool
    tar: str
    entries: list[FileEntry] = field(default_factory=list)


@dataclass
class KeptNetwork:
    """A sandbox's network as its snapshot recorded it at its taking (`SandboxState`'s fields of
    the same names): what a sandbox made from the snapshot starts with, save what its create
    names of its own (`sandboxes.server.inherited`). The headers are secrets: the manifest that
    holds them is its tenant's and the service's alone."""

    egress_allow: list[str] | None = None
    egress_headers: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)
    public_ports: bool | None = None
    mask_request_host: str | None = None
    preview_public: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "egress_allow": self.egress_allow,
            "egress_headers": self.egress_headers,
            "public_ports": self.public_ports,
            "mask_request_host": self.mask_request_host,
            "preview_public": self.preview_public,
        }

    @classmethod
    def from_json(cls, data: Any) -> KeptNetwork | None:
        """The network a manifest recorded; ``None`` for one written before snapshots kept it."""
        if not isinstance(data, dict):
            return None
        allow, headers = data.get("egress_allow"), data.get("egress_headers") or {}
        return cls(
            egress_allow=None if allow is None else [str(rule) for rule in allow],
            egress_headers={str(host): {str(k): str(v) for k, v in values.items()} for host, values in headers.items()},
            public_ports=None if data.get("public_ports") is None else bool(data["public_ports"]),
            mask_request_host=None if data.get("mask_request_host") is None else str(data["mask_request_host"]),
            preview_public=sorted({int(port) for port in data.get("preview_public") or []}),
        )


@dataclass
class Snapshot:
    id: str
    tenant: str
    sandbox_id: str
    template: str
    backend: str
    created_at: float
    bytes: int
    parts: list[Part]
    directory: Path
    name: str = ""
    """What the caller named it (the E2B API's snapshot names); empty: unnamed."""
    network: KeptNetwork | None = None
    """The sandbox's network when it was taken; ``None``: taken before snapshots kept it."""

    @property
    def files(self) -> int:
        return sum(len(part.entries) for part in self.parts)

    def to_json(self) -> dict[str, Any]:
        head = {key: getattr(self, key) for key in ("id", "tenant", "sandbox_id", "template", "backend", "created_at")}
        parts = [
            {"path": p.path, "workspace": p.workspace, "tar": p.tar, "entries": [e.to_json() for e in p.entries]}
            for p in self.parts
        ]
        network = None if self.network is None else self.network.to_json()
        return {**head, "bytes": self.bytes, "parts": parts, "name": self.name, "network": network}

    @classmethod
    def from_json(cls, data: dict[str, Any], directory: Path) -> Snapshot:
        parts = [
            Part(p["path"], p["workspace"], p["tar"], [FileEntry.from_json(e) for e in p["entries"]])
            for p in data["parts"]
        ]
        head = {key: data[key] for key in ("id", "tenant", "sandbox_id", "template", "backend", "created_at", "bytes")}
        network = KeptNetwork.from_json(data.get("network"))
        return cls(**head, parts=parts, directory=directory, name=str(data.get("name", "")), network=network)


class Writing:
    """A snapshot being written in its temporary directory, in at most ``bound`` bytes (what was
    left of its tenant's quota); `SnapshotStore.commit` or `SnapshotStore.abandon` ends it."""

    def __init__(self, snapshot: Snapshot, bound: int, quota: int) -> None:
        self.snapshot = snapshot
        self.bound = bound
        self.quota = quota

    def path(self, name: str) -> Path:
        return self.snapshot.directory / name


class SnapshotStore:
    def __init__(self, directory: Path, writer: str = "") -> None:
        self.directory = directory
        self.writer = hashlib.sha256(writer.encode()).hexdigest()[:8]
        """Names this replica's temporary directories (`sweep`)."""
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ reading

    def get(self, tenant: str, snapshot_id: str) -> Snapshot:
        """The tenant's snapshot; `not_found` if it has none by that id."""
        if not _SAFE_ID.match(snapshot_id):
            raise _missing(snapshot_id)
        directory = self._tenant_dir(tenant) / snapshot_id
        try:
            data = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise _missing(snapshot_id) from None
        snapshot = Snapshot.from_json(data, directory)
        if snapshot.tenant != tenant:
            raise _missing(snapshot_id)
        return snapshot

    def of_tenant(self, tenant: str) -> list[Snapshot]:
        found = []
        for directory in self._complete(tenant):
            with contextlib.suppress(ServiceError, OSError, ValueError, KeyError):
                found.append(self.get(tenant, directory.name))
        return sorted(found, key=lambda snapshot: (snapshot.created_at, snapshot.id))

    def used(self, tenant: str) -> int:
        """The bytes of the tenant's snapshots."""
        return sum(snapshot.bytes for snapshot in self.of_tenant(tenant))

    # ------------------------------------------------------------------ writing

    def begin(self, tenant: str, quota: int, head: dict[str, Any], snapshot_id: str | None = None) -> Writing:
        """A snapshot to write, its temporary directory made, bounded by what is left of the
        tenant's ``quota``."""
        snapshot_id = snapshot_id or secrets.token_hex(8)
        left = quota - self.used(tenant)
        if left <= 0:
            raise _over(quota)
        tenant_dir = self._tenant_dir(tenant)
        tenant_dir.mkdir(mode=0o700, exist_ok=True)
        directory = tenant_dir / f"{_TEMP}{self.writer}-{snapshot_id}-{secrets.token_hex(4)}"
        directory.mkdir(mode=0o700)
        snapshot = Snapshot(snapshot_id, tenant, parts=[], directory=directory, bytes=0, created_at=time.time(), **head)
        return Writing(snapshot, left, quota)

    def commit(self, writing: Writing) -> Snapshot:
        """Make the written snapshot whole and visible, in one rename."""
        snapshot = writing.snapshot
        try:
            snapshot.bytes = sum(os.path.getsize(writing.path(part.tar)) for part in snapshot.parts)
            _write_synced(writing.path(MANIFEST), json.dumps(snapshot.to_json()).encode())
            for part in snapshot.parts:
                _sync(writing.path(part.tar))
            final = snapshot.directory.parent / snapshot.id
            with self._lock:  # counted with the others made visible meanwhile
                if self.used(snapshot.tenant) + snapshot.bytes > writing.quota:
                    raise _over(writing.quota)
                os.rename(snapshot.directory, final)  # refused if one by that id exists: it stays
            _sync(final.parent)
            snapshot.directory = final
        except BaseException:
            self.abandon(writing)
            raise
        return snapshot

    def abandon(self, writing: Writing) -> None:
        shutil.rmtree(writing.snapshot.directory, ignore_errors=True)

    def delete(self, tenant: str, snapshot_id: str, *, wait: bool = True) -> None:
        """Remove the snapshot: renamed out of sight first, so it is whole or gone; its files
        then removed here, or (``wait=False``) on a thread of their own, which `sweep` finishes
        if the service stops first."""
        snapshot = self.get(tenant, snapshot_id)
        gone = snapshot.directory.with_name(f"{_GONE}{snapshot_id}-{secrets.token_hex(4)}")
        os.rename(snapshot.directory, gone)
        if wait:
            shutil.rmtree(gone, ignore_errors=True)
        else:
            threading.Thread(target=shutil.rmtree, args=(gone, True), name="snapshot-delete", daemon=True).start()

    def sweep(self, *, others_only: bool = False, now: float | None = None) -> list[Path]:
        """Remove what this replica, killed, left half written (unless ``others_only``: it may
        be writing now), what any other writer left untouched for `ABANDONED_AFTER`, and any
        snapshot left half deleted."""
        now = time.time() if now is None else now
        mine = f"{_TEMP}{self.writer}-"
        removed = []
        for tenant_dir in self.directory.iterdir():
            if not tenant_dir.is_dir():
                continue
            for directory in tenant_dir.iterdir():
                name = directory.name
                left = name.startswith(_GONE) or (name.startswith(mine) and not others_only)
                if left or (name.startswith(_TEMP) and not name.startswith(mine) and _untouched(directory, now)):
                    shutil.rmtree(directory, ignore_errors=True)
                    removed.append(directory)
        return removed

    # ------------------------------------------------------------------ paths

    def _tenant_dir(self, tenant: str) -> Path:
        return self.directory / hashlib.sha256(tenant.encode()).hexdigest()[:32]

    def _complete(self, tenant: str) -> Iterator[Path]:
        tenant_dir = self._tenant_dir(tenant)
        if tenant_dir.is_dir():
            yield from (d for d in tenant_dir.iterdir() if _SAFE_ID.match(d.name))


def _untouched(directory: Path, now: float) -> bool:
    """Whether nothing in ``directory`` (one level: a snapshot's parts) changed for
    `ABANDONED_AFTER`; gone meanwhile counts as touched (its writer finished)."""
    try:
        newest = max([directory.stat().st_mtime, *(entry.stat().st_mtime for entry in directory.iterdir())])
    except OSError:
        return False
    return now - newest > ABANDONED_AFTER


def _over(quota: int) -> ServiceError:
    return ServiceError("quota_exceeded", f"the tenant's snapshots would be over their {quota} bytes; delete some")


def _missing(snapshot_id: str) -> ServiceError:
    return ServiceError("not_found", f"no snapshot {snapshot_id!r}")


def _write_synced(path: Path, data: bytes) -> None:
    """``data`` as the whole of ``path``, on disk, readable by the service's user alone (a
    manifest may hold a sandbox's egress headers)."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
