"""The requests of a sandbox's state (`sandboxes.api`: snapshots and forks), as `_wire.Op`s."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote

from sandboxes import api
from sandboxes.client import _wire as w
from sandboxes.client._ops import IDEMPOTENCY_HEADER

__all__ = ["delete_snapshot", "fork", "get_snapshot", "list_snapshots", "take_snapshot"]

_SNAPSHOTS = f"{api.API_PREFIX}/snapshots"
_SNAPSHOT: w.Answer[api.SnapshotInfo] = w.Answer(api.SnapshotInfo)
_SNAPSHOT_LIST: w.Answer[api.SnapshotList] = w.Answer(api.SnapshotList)
_FORK: w.Answer[api.ForkResult] = w.Answer(api.ForkResult)


def _sandbox(sandbox_id: str) -> str:
    return f"{api.API_PREFIX}/sandboxes/{quote(sandbox_id, safe='')}"


def take_snapshot(sandbox_id: str, workspace: bool, paths: Sequence[str]) -> w.Op[api.SnapshotInfo]:
    """Not repeated: each attempt would keep a snapshot of its own."""
    body = w.model_json(api.CreateSnapshot, workspace=workspace, paths=list(paths))
    return w.Op("POST", f"{_sandbox(sandbox_id)}/snapshots", _SNAPSHOT, json=body)


def list_snapshots() -> w.Op[list[api.SnapshotInfo]]:
    return w.Op("GET", _SNAPSHOTS, lambda response: _SNAPSHOT_LIST(response).snapshots, idempotent=True)


def get_snapshot(snapshot_id: str) -> w.Op[api.SnapshotInfo]:
    return w.Op("GET", f"{_SNAPSHOTS}/{quote(snapshot_id, safe='')}", _SNAPSHOT, idempotent=True)


def delete_snapshot(snapshot_id: str) -> w.Op[None]:
    path = f"{_SNAPSHOTS}/{quote(snapshot_id, safe='')}"
    return w.Op("DELETE", path, w.no_content, idempotent=True, gone_is_done=True)


def fork(sandbox_id: str, count: int, idempotency_key: str) -> w.Op[api.ForkResult]:
    """Retried with its key, which names the fork's snapshot and sandboxes: a retry answers what
    the first attempt made."""
    body = w.model_json(api.ForkSandbox, count=count)
    headers = {IDEMPOTENCY_HEADER: idempotency_key}
    return w.Op("POST", f"{_sandbox(sandbox_id)}/fork", _FORK, json=body, idempotent=True, headers=headers)
