"""Two replicas of the service on ONE data directory: what one records there, the other reads
from its next request on. A revoked preview token (`sandboxes.server.previews`) is refused by
both, and by the one that revoked it after a restart; a sandbox's network read again from its
state file does not undo a change made meanwhile (the replicas over Docker:
``test_service_egress.py``)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import SecretStr
from service_harness import ManualClock, create, error_of, running, settings_for
from support import HAS_BWRAP

from sandboxes.server.previews import REVOKED_DIR, PreviewAccess
from sandboxes.server.store import SandboxState

PORT = 8000
"""A port nothing listens on: a request a token lets through answers 502, one it does not 401."""


@pytest.mark.needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
def test_a_revoked_preview_token_is_refused_by_every_replica_and_after_a_restart(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    with running(settings) as a, a.client("alice") as alice:
        sandbox_id = create(alice)["id"]
        base = f"/v1/sandboxes/{sandbox_id}/ports/{PORT}"
        token = alice.post(f"{base}/tokens", json={}).json()
        headers = {"X-Preview-Token": token["token"]}
        with running(settings) as b, b.client(None) as stranger:  # B adopts the sandbox from the shared state
            assert stranger.get(f"{base}/", headers=headers).status_code == 502  # let through: nothing listens
            assert alice.delete(f"{base}/tokens/{token['token_id']}").status_code == 204
            refused = stranger.get(f"{base}/", headers=headers)
            assert (refused.status_code, error_of(refused)) == (401, "unauthorized")
        with a.client(None) as stranger:
            assert stranger.get(f"{base}/", headers=headers).status_code == 401
    kept = tmp_path / REVOKED_DIR / token["token_id"]
    assert stat.S_IMODE(os.stat(kept.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(kept).st_mode) == 0o600
    with running(settings) as again, again.client(None) as stranger, again.client("alice") as alice:
        assert stranger.get(f"{base}/", headers=headers).status_code == 401  # after a restart too
        assert alice.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204


@pytest.mark.needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
def test_a_revocation_that_cannot_be_recorded_is_an_error_not_a_204(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    with running(settings) as a, a.client("alice") as alice:
        sandbox_id = create(alice)["id"]
        base = f"/v1/sandboxes/{sandbox_id}/ports/{PORT}"
        token = alice.post(f"{base}/tokens", json={}).json()
        revoked = tmp_path / REVOKED_DIR
        revoked.rmdir()
        revoked.write_text("")  # a file, not a directory: nothing can be recorded in it (even by root)
        try:
            failed = alice.delete(f"{base}/tokens/{token['token_id']}")
            with a.client(None) as stranger:  # whether it was revoked cannot be read: refused
                assert stranger.get(f"{base}/", headers={"X-Preview-Token": token["token"]}).status_code == 401
        finally:
            revoked.unlink()
            revoked.mkdir(mode=0o700)
        assert (failed.status_code, error_of(failed)) == (500, "internal")
        with a.client(None) as stranger:  # not revoked, as the answer said
            assert stranger.get(f"{base}/", headers={"X-Preview-Token": token["token"]}).status_code == 502
        assert alice.delete(f"{base}/tokens/{'0' * 23}x").status_code == 422  # no token's id: no file name either
        assert alice.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204


def test_a_revocation_is_dropped_once_its_token_would_have_expired_anyway(tmp_path: Path) -> None:
    clock = ManualClock()
    revoked = tmp_path / REVOKED_DIR
    a, b = (PreviewAccess(SecretStr("shared"), revoked, clock) for _ in range(2))
    old, new = a.mint("alice", "sbx", PORT, ttl=7 * 24 * 3600), a.mint("alice", "sbx", PORT, ttl=60)
    a.revoke(old.token_id)
    assert b.tenant_of(old.token, "sbx", PORT) is None
    clock.advance(7 * 24 * 3600)
    b.revoke(new.token_id)
    assert sorted(path.name for path in revoked.iterdir()) == [new.token_id]  # the first's token expired


@pytest.mark.needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
def test_a_reread_of_the_network_in_flight_does_not_undo_a_change_made_here_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state file read again (another replica's change, `Holdings._reread_network`) while a
    request here changes the network: the older file read back is not taken over the change."""
    with running(settings_for(tmp_path)) as a, a.client("alice") as alice:
        sandbox_id = create(alice)["id"]
        registry = a.registry
        entry = registry.entries[sandbox_id]
        theirs = dataclasses.replace(entry.state, preview_public=[9000], network_set=True)
        registry.store.save(theirs)  # what another replica sharing the directory wrote
        reading, landed = threading.Event(), threading.Event()
        load: Callable[[str], SandboxState | None] = registry.store.load

        def held_load(wanted: str) -> SandboxState | None:
            found = load(wanted)  # read before the change below
            reading.set()
            landed.wait(30)
            return found

        monkeypatch.setattr(registry.store, "load", held_load)
        reread = asyncio.run_coroutine_threadsafe(registry._reread_network(entry), registry._loop)
        assert reading.wait(30)
        assert alice.put(f"/v1/sandboxes/{sandbox_id}/ports/{PORT}", json={"public": True}).status_code == 200
        landed.set()
        reread.result(30)
        monkeypatch.undo()
        assert entry.state.preview_public == [PORT]
        kept = load(sandbox_id)
        assert kept is not None
        assert kept.preview_public == [PORT]
        theirs = dataclasses.replace(entry.state, preview_public=[9000])
        registry.store.save(theirs)  # another replica's change, after this one's: taken
        asyncio.run_coroutine_threadsafe(registry._reread_network(entry), registry._loop).result(30)
        assert entry.state.preview_public == [9000]
        assert alice.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204
