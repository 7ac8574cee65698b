"""``kill -9`` of a real service process (``python -m sandboxes.server``, local backend) in the
middle of a snapshot and of a fork, then a restart: a snapshot is whole or absent (what was
being written is swept, never listed), and a fork leaves no sandbox restored halfway, nor any
directory on the backend that the service does not list; the fork retried with its key then
makes its sandboxes whole.

Slow (about 20 s each): two starts of a service process each (its imports and reconciliation)
around a kill that must land while the work is under way; nothing in-process can stand in for
a ``kill -9``."""

from __future__ import annotations

import contextlib
import threading
import uuid
from pathlib import Path

import httpx
import pytest
from service_harness import ServiceProcess, create, execute, subprocess_config
from support import HAS_BWRAP, needs, wait_for

BIG = "for i in 1 2 3 4 5 6 7 8; do head -c 2000000 /dev/urandom > f$i; done; sha256sum f* | sha256sum | cut -c1-64"
"""Files enough that a snapshot or a restore of them is still under way when looked at (and a
restore cut short has some of them only); prints the digest of them all."""


def _in_background(call: httpx.Client, method: str, url: str, **kwargs: object) -> threading.Thread:
    """The request in a thread of its own; the service is killed under it (it fails then)."""

    def send() -> None:
        with contextlib.suppress(httpx.HTTPError):
            call.request(method, url, **kwargs)  # type: ignore[arg-type]

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _partial(store: Path) -> list[Path]:
    return [path for path in store.glob("*/*") if path.name.startswith(".tmp-")]


@pytest.mark.slow
def test_a_snapshot_cut_by_kill_9_is_absent_and_swept_at_restart(tmp_path: Path) -> None:
    needs(HAS_BWRAP, "bubblewrap is not installed")
    data_dir = tmp_path / "data"
    service = ServiceProcess(subprocess_config(data_dir), tmp_path).start()
    store = data_dir / "snapshots"
    try:
        with service.client() as client, service.client() as background:
            sandbox = create(client, ttl=600)
            assert execute(client, sandbox["id"], BIG)["exit_code"] == 0
            taking = _in_background(background, "POST", f"/v1/sandboxes/{sandbox['id']}/snapshots", json={})
            wait_for(lambda: bool(_partial(store)), "a snapshot being written")
            service.kill()
            taking.join(30)
        assert _partial(store), "the snapshot finished before the kill: nothing was cut"
        assert not [p for p in store.glob("*/*") if not p.name.startswith(".")], "a snapshot made it whole"
        service.start()
        with service.client() as client:
            assert client.get("/v1/snapshots").json()["snapshots"] == []
            assert not _partial(store)
            taken = client.post(f"/v1/sandboxes/{sandbox['id']}/snapshots", json={})
            assert taken.status_code == 201, taken.text
            assert [s["id"] for s in client.get("/v1/snapshots").json()["snapshots"]] == [taken.json()["id"]]
    finally:
        service.stop()


@pytest.mark.slow
def test_a_fork_cut_by_kill_9_leaves_no_sandbox_restored_halfway(tmp_path: Path) -> None:
    needs(HAS_BWRAP, "bubblewrap is not installed")
    data_dir = tmp_path / "data"
    service = ServiceProcess(subprocess_config(data_dir), tmp_path).start()
    key = str(uuid.uuid4())
    try:
        with service.client() as client, service.client() as background:
            source = create(client, ttl=600)
            digest = execute(client, source["id"], BIG)["output"].strip()
            headers = {"Idempotency-Key": key}
            url = f"/v1/sandboxes/{source['id']}/fork"
            forking = _in_background(background, "POST", url, json={"count": 3}, headers=headers)
            restoring, local = data_dir / "restoring", data_dir / "local"
            source_root = Path(source["workdir"])

            def restore_under_way() -> bool:
                """A new sandbox's root with some of the files in it already."""
                roots = [p for p in local.iterdir() if p.is_dir() and "." not in p.name and p != source_root]
                return any(any(root.glob("f*")) for root in roots)

            wait_for(restore_under_way, "a restore under way", limit=60)
            service.kill()
            forking.join(30)
        assert any(restoring.iterdir()), "the fork finished before the kill: nothing was cut"
        service.start()
        with service.client() as client:
            listed = client.get("/v1/sandboxes").json()["sandboxes"]
            for sandbox in listed:  # the source, and forks that were verified before the kill
                assert _sha256_in(client, sandbox["id"]) == digest
            roots = {Path(sandbox["workdir"]).name for sandbox in listed}
            on_disk = {p.name for p in (data_dir / "local").iterdir() if p.is_dir() and "." not in p.name}
            assert on_disk == roots, "a sandbox on the backend that the service does not list"
            assert not any(restoring.iterdir())
            again = client.post(url, json={"count": 3}, headers=headers)
            assert again.status_code == 201, again.text
            for child in again.json()["sandboxes"]:
                assert _sha256_in(client, child["id"]) == digest
    finally:
        service.stop()


def _sha256_in(client: httpx.Client, sandbox_id: str) -> str:
    return str(execute(client, sandbox_id, "sha256sum f* | sha256sum | cut -c1-64")["output"].strip())
