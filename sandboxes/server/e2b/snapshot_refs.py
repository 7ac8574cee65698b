"""The tenant's snapshots (`sandboxes.server.snapshots`) as the E2B API names them: a snapshot
is an E2B "snapshot template", referred to by its id or by its name (the newest of that name),
either qualified as E2B qualifies template names (``namespace/name:tag``: the namespace and the
tag are ignored, a tenant's snapshots being its own). The snapshot a hibernated sandbox keeps
its files in is none of them: it belongs to that sandbox, which a delete would lose."""

from __future__ import annotations

import asyncio

from fastapi import Request

from sandboxes.server.auth import Tenant
from sandboxes.server.e2b.common import service
from sandboxes.server.snapshots import Snapshot

__all__ = ["bare", "find_snapshot", "referred", "snapshot_json", "visible"]


async def visible(request: Request, tenant: Tenant) -> list[Snapshot]:
    """The tenant's snapshots, oldest first, without its hibernated sandboxes' own."""
    registry = service(request).registry
    kept = await asyncio.to_thread(registry.snapshots.of_tenant, tenant.id)
    held = {entry.state.hibernated for entry in await registry.list(tenant) if entry.state.hibernated}
    return [snapshot for snapshot in kept if snapshot.id not in held]


def bare(ref: str) -> str:
    """``ref`` without E2B's ``namespace/`` and ``:tag``."""
    return ref.rpartition("/")[2].partition(":")[0]


def referred(snapshots: list[Snapshot], ref: str) -> list[Snapshot]:
    """What of ``snapshots`` (oldest first) ``ref`` names: the one of that id, else those of
    that name, newest first."""
    wanted = bare(ref)
    by_id = [snapshot for snapshot in snapshots if snapshot.id == wanted]
    return by_id or [snapshot for snapshot in reversed(snapshots) if wanted and snapshot.name == wanted]


async def find_snapshot(request: Request, tenant: Tenant, ref: str) -> Snapshot | None:
    """The tenant's snapshot ``ref`` names (the newest of a name); ``None`` if none."""
    found = referred(await visible(request, tenant), ref)
    return found[0] if found else None


def snapshot_json(snapshot: Snapshot) -> dict[str, object]:
    """E2B's ``SnapshotInfo``: its id, and its name (its id if it has none)."""
    return {"snapshotID": snapshot.id, "names": [snapshot.name or snapshot.id]}
