"""The snapshot store shared by replicas (`sandboxes.server.snapshots`): a snapshot is visible
only once whole; a restart's sweep removes what its own replica left half written, never what
another replica sharing the store is writing now; a deletion is whole or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandboxes.server.errors import ServiceError
from sandboxes.server.snapshots import ABANDONED_AFTER, MANIFEST, KeptNetwork, Part, SnapshotStore

HEAD = {"sandbox_id": "s1", "template": "default", "backend": "local"}


def test_a_sweep_removes_its_own_replicas_leftovers_only(tmp_path: Path) -> None:
    mine, theirs = SnapshotStore(tmp_path, writer="a:/data"), SnapshotStore(tmp_path, writer="b:/data")
    left = mine.begin("alice", 1 << 20, HEAD)  # killed while writing it
    writing = theirs.begin("alice", 1 << 20, HEAD)  # another replica, still at it
    assert mine.of_tenant("alice") == []
    assert mine.sweep() == [left.snapshot.directory]
    assert writing.snapshot.directory.is_dir()
    writing.path("0.tar").write_bytes(b"\0" * 1024)
    writing.snapshot.parts.append(Part("/workspace", True, "0.tar"))
    made = theirs.commit(writing)
    assert [s.id for s in mine.of_tenant("alice")] == [made.id]
    assert mine.get("alice", made.id).bytes == 1024
    with pytest.raises(ServiceError, match="no snapshot"):
        mine.get("bob", made.id)
    mine.delete("alice", made.id)
    assert mine.of_tenant("alice") == []
    assert [p.name for p in tmp_path.glob("*/*")] == []


def test_another_writers_leftovers_go_once_untouched_for_long(tmp_path: Path) -> None:
    """A replica killed for good (a pod replaced under another name) leaves a half-written
    snapshot no start of its own will sweep: another replica's sweep removes it once nothing in
    it changed for `ABANDONED_AFTER`, never while it is written, and the periodic sweep
    (``others_only``) never removes one of its own."""
    mine, gone = SnapshotStore(tmp_path, writer="a:/data"), SnapshotStore(tmp_path, writer="b:/data")
    left = gone.begin("alice", 1 << 20, HEAD)
    left.path("0.tar").write_bytes(b"\0" * 1024)  # its last bytes
    writing = mine.begin("alice", 1 << 20, HEAD)
    written_at = (left.snapshot.directory / "0.tar").stat().st_mtime
    assert mine.sweep(others_only=True, now=written_at + ABANDONED_AFTER - 1) == []  # may still be written
    later = written_at + ABANDONED_AFTER + 1
    assert mine.sweep(others_only=True, now=later) == [left.snapshot.directory]
    assert writing.snapshot.directory.is_dir()  # its own, being written: kept


def test_a_snapshot_over_the_quota_is_not_kept(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, writer="a")
    writing = store.begin("alice", 100, HEAD)
    writing.path("0.tar").write_bytes(b"\0" * 1024)
    writing.snapshot.parts.append(Part("/workspace", True, "0.tar"))
    with pytest.raises(ServiceError, match="over their 100 bytes"):
        store.commit(writing)
    assert [p.name for p in tmp_path.glob("*/*")] == []


def test_a_snapshot_keeps_its_sandboxes_network_in_a_manifest_for_the_service_alone(tmp_path: Path) -> None:
    """The network recorded at its taking reads back as written, headers (secrets) included, from
    a manifest only the service's user reads; one an older service wrote, without it, reads as
    none (its restores start with their create's)."""
    store = SnapshotStore(tmp_path, writer="a")
    network = KeptNetwork(["127.0.0.3"], {"127.0.0.3": {"Authorization": "Bearer x"}}, True, "h:${PORT}")
    writing = store.begin("alice", 1 << 20, {**HEAD, "network": network})
    writing.path("0.tar").write_bytes(b"\0" * 1024)
    writing.snapshot.parts.append(Part("/workspace", True, "0.tar"))
    made = store.commit(writing)
    assert store.get("alice", made.id).network == network
    manifest = made.directory / MANIFEST
    assert manifest.stat().st_mode & 0o777 == 0o600
    older = json.loads(manifest.read_text())
    del older["network"]
    manifest.write_text(json.dumps(older))
    assert store.get("alice", made.id).network is None
