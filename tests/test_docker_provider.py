"""DockerProvider against a real Docker engine: the warm pool (acquisition, refill, cold
fallback, failures, close) and the sweeps (expired sandboxes, orphaned volumes, other owners).

Each test uses its own owner label, so one test's sweep cannot reach another's sandboxes;
every container also carries the session label, so the session sweep reaps what is left."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import docker.errors
import docker.models.containers
import pytest
import requests
from pydantic import ValidationError
from support import SESSION_OWNER

from sandboxes.docker import LABEL_EXPIRES, LABEL_SANDBOX, DockerSandbox, DockerSandboxConfig
from sandboxes.docker.provider import LABEL_POOL, DockerProvider, DockerProviderConfig
from sandboxes.docker.template import CLIENT_KEY, DockerTemplate
from sandboxes.lifecycle import FINAL_EXPIRY
from sandboxes.templates import ProviderContext

SESSION_LABEL = "io.sandboxes.test-session"


@pytest.fixture
def owner() -> str:
    return f"{SESSION_OWNER}-{uuid.uuid4().hex[:6]}"


def _template(image: str, owner: str, **overrides: Any) -> DockerSandboxConfig:
    return DockerSandboxConfig(image=image, owner=owner, labels={SESSION_LABEL: SESSION_OWNER}, **overrides)


def _labelled(client: Any, key: str, value: str) -> tuple[set[str], set[str]]:
    """Ids of the containers and names of the volumes carrying ``key=value``."""
    selector = {"label": f"{key}={value}"}
    containers = {c.id for c in client.containers.list(all=True, filters=selector)}
    return containers, {v.name for v in client.volumes.list(filters=selector)}


def _volume_of(sandbox: DockerSandbox) -> str:
    return f"sandboxes-ws-{sandbox.container.labels[LABEL_SANDBOX]}"


def _exists(client: Any, *, container: str | None = None, volume: str | None = None) -> bool:
    try:
        if container is not None:
            client.containers.get(container)
        if volume is not None:
            client.volumes.get(volume)
    except docker.errors.NotFound:
        return False
    return True


def _eventually(condition: Any, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return bool(condition())


# ---------------------------------------------------------------------- configuration


def test_options_are_validated_and_merged_over_a_config() -> None:
    base = DockerProviderConfig(pool_size=3, sweep_interval=None)
    provider = DockerProvider(client=object(), config=base, pool_size=1)
    assert provider.config.pool_size == 1
    assert provider.config.sweep_interval is None
    with pytest.raises(ValidationError):
        DockerProvider(client=object(), pool_size=-1)
    with pytest.raises(ValidationError):
        DockerProvider(client=object(), pool_sise=1)


# ---------------------------------------------------------------------- warm pool


def test_acquire_hands_out_a_started_helper_warmed_pooled_sandbox(
    docker_client: Any, runtime_image: str, owner: str
) -> None:
    template = _template(runtime_image, owner, ttl=50)
    with DockerProvider(template, client=docker_client, pool_size=2, pool_max_idle=100, sweep_interval=None) as pool:
        assert pool.wait_filled(30)
        pooled = pool.idle
        assert len(pooled) == 2
        assert set(pooled) == _labelled(docker_client, LABEL_POOL, pool.id)[0]
        acquired_at = time.time()
        with pool.acquire() as sandbox:
            assert sandbox.id == pooled[0]  # created before acquire was called
            assert sandbox.helper_alive  # the helper was started by the pool, not by us
            sandbox.container.reload()
            assert sandbox.container.status == "running"
            assert sandbox.config == template  # it behaves like any sandbox of the template
            # Labels are fixed at creation: the pooled expiry leaves the full ttl after acquisition.
            expires = int(sandbox.container.labels[LABEL_EXPIRES])
            assert acquired_at + 50 <= expires + 1
            assert expires <= acquired_at + 50 + 100 + 1  # whole seconds, rounded up
            assert sandbox.execute("id -u").output == "1000\n"


def test_the_pool_refills_after_acquisitions(docker_client: Any, runtime_image: str, owner: str) -> None:
    template = _template(runtime_image, owner)
    with DockerProvider(template, client=docker_client, pool_size=2, refill_interval=0.2, sweep_interval=None) as pool:
        assert pool.wait_filled(30)
        first, second = pool.acquire(), pool.acquire()
        try:
            assert pool.wait_filled(30)
            refilled = set(pool.idle)
            assert len(refilled) == 2
            assert refilled.isdisjoint({first.id, second.id})
            assert _labelled(docker_client, LABEL_POOL, pool.id)[0] == refilled | {first.id, second.id}
        finally:
            first.destroy()
            second.destroy()


def test_an_empty_pool_falls_back_to_a_cold_create(docker_client: Any, runtime_image: str, owner: str) -> None:
    pool = DockerProvider(_template(runtime_image, owner), client=docker_client, pool_size=1)  # never started
    with pool.acquire() as sandbox:
        assert not sandbox.helper_alive  # not warmed: created for this call
        assert LABEL_POOL not in sandbox.container.labels
        assert sandbox.execute("echo cold").output == "cold\n"
    pool.close()
    with pytest.raises(RuntimeError):
        pool.acquire()


def test_close_destroys_the_idle_pool_and_leaves_acquired_sandboxes(
    docker_client: Any, runtime_image: str, owner: str
) -> None:
    template = _template(runtime_image, owner)
    pool = DockerProvider(template, client=docker_client, pool_size=2, sweep_interval=None).start()
    assert pool.wait_filled(30)
    held = pool.acquire()
    pool.close()
    assert _labelled(docker_client, LABEL_POOL, pool.id) == ({held.id}, {_volume_of(held)})
    held.destroy()
    assert _labelled(docker_client, LABEL_POOL, pool.id) == (set(), set())

    # Closed while the thread is still creating: what it finishes is destroyed, not pooled.
    busy = DockerProvider(template, client=docker_client, pool_size=2, sweep_interval=None).start()
    busy.close()
    assert _labelled(docker_client, LABEL_POOL, busy.id) == (set(), set())


def test_refill_failures_are_retried_and_do_not_kill_the_thread(
    docker_client: Any, runtime_image: str, owner: str, caplog: pytest.LogCaptureFixture
) -> None:
    broken = _template(runtime_image, owner, memory="1k", disk=None)  # the daemon refuses such a container
    caplog.set_level(logging.WARNING, logger="sandboxes.docker.provider")
    pool = DockerProvider(broken, client=docker_client, pool_size=1, retry_max_backoff=0.1, sweep_interval=None)
    with pool:
        assert _eventually(lambda: sum("Retrying" in r.getMessage() for r in caplog.records) >= 3)
        assert pool._thread is not None
        assert pool._thread.is_alive()
        assert pool.idle == ()
        started = time.monotonic()
    assert time.monotonic() - started < 5  # close interrupts the backoff
    assert _labelled(docker_client, LABEL_POOL, pool.id) == (set(), set())  # no volume left by a failure


def test_a_container_whose_start_is_unanswered_is_removed_with_its_workspace(
    docker_client: Any, runtime_image: str, owner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine starts it but its answer is lost (a client timeout under load): the create
    raises, and neither the container nor its volume is left for no one to remove."""
    from docker.models.containers import Container

    started = Container.start

    def start_unanswered(self: Any, **kwargs: Any) -> None:
        started(self, **kwargs)
        raise requests.exceptions.ReadTimeout("the engine's answer to the start was lost")

    monkeypatch.setattr(Container, "start", start_unanswered)
    with pytest.raises(requests.exceptions.ReadTimeout):
        DockerProvider(_template(runtime_image, owner), client=docker_client).create()
    selector = {"label": f"io.sandboxes.owner={owner}"}
    assert docker_client.containers.list(all=True, filters=selector) == []
    assert docker_client.volumes.list(filters=selector) == []


def test_an_expiry_moved_while_the_sandbox_is_removed_waits_for_the_removal(
    docker_client: Any, runtime_image: str, owner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal (a rename) asked while the same container's removal is under way, as a claim's
    recorded expiry races its tenant's delete, reaches the engine only once the removal is done,
    and finds it gone: the engine, doing both at once, can keep a ghost listed as "Removal In
    Progress" that no call removes until it restarts."""
    from docker.models.containers import Container

    provider = DockerProvider(_template(runtime_image, owner), client=docker_client)
    ref = provider.create().container.id
    calls: list[str] = []
    removing, renaming = threading.Event(), threading.Event()
    remove, rename = Container.remove, Container.rename

    def remove_slowly(self: Any, **kwargs: Any) -> None:
        calls.append("remove")
        removing.set()
        renaming.wait(1)  # a renewal that does not wait for the removal renames meanwhile
        remove(self, **kwargs)
        calls.append("removed")

    def rename_seen(self: Any, name: str) -> None:
        calls.append("rename")
        renaming.set()
        rename(self, name)

    monkeypatch.setattr(Container, "remove", remove_slowly)
    monkeypatch.setattr(Container, "rename", rename_seen)
    remover = threading.Thread(target=provider.destroy, args=(ref,))
    remover.start()
    assert removing.wait(30)
    with pytest.raises(LookupError):
        provider.set_expiry(ref, time.time() + 3600)
    remover.join()
    assert calls[:2] == ["remove", "removed"], calls


# ---------------------------------------------------------------------- sweeps


def test_sweep_removes_expired_sandboxes_with_their_volumes(docker_client: Any, runtime_image: str, owner: str) -> None:
    provider = DockerProvider(_template(runtime_image, owner, ttl=1), client=docker_client)
    expired = provider.create()
    lasting = DockerProvider(_template(runtime_image, owner, ttl=3600), client=docker_client).create()
    forever = DockerProvider(_template(runtime_image, owner, ttl=None), client=docker_client).create()
    try:
        report = provider.sweep(now=time.time() + 10)
        assert report.containers == [expired.id]
        assert report.orphan_volumes == []
        assert report.errors == []
        assert not _exists(docker_client, container=expired.id)
        assert not _exists(docker_client, volume=_volume_of(expired))
        for kept in (lasting, forever):
            assert _exists(docker_client, container=kept.id, volume=_volume_of(kept))
    finally:
        lasting.destroy()
        forever.destroy()


def test_a_renewal_between_a_sweeps_last_look_and_its_removal_finds_it_gone(
    docker_client: Any, runtime_image: str, owner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep's last look says expired; a renewal asked then waits for the removal and finds
    the container gone (`LookupError`), never answering renewed for a sandbox the sweep removes."""
    provider = DockerProvider(_template(runtime_image, owner, ttl=1), client=docker_client, sweep_interval=None)
    ref = provider.create().id
    looked, renaming = threading.Event(), threading.Event()
    expired_now = DockerProvider._expired_now

    def look_then_linger(self: DockerProvider, container: str, now: float) -> bool:
        answer = expired_now(self, container, now)
        looked.set()
        renaming.wait(1)  # a renewal that does not wait for the removal renames meanwhile
        return answer

    rename = docker.models.containers.Container.rename

    def rename_seen(self: Any, name: str) -> None:
        renaming.set()
        rename(self, name)

    monkeypatch.setattr(DockerProvider, "_expired_now", look_then_linger)
    monkeypatch.setattr(docker.models.containers.Container, "rename", rename_seen)
    sweeper = threading.Thread(target=provider.sweep, kwargs={"now": time.time() + 10})
    sweeper.start()
    assert looked.wait(30)
    with pytest.raises(LookupError):
        provider.set_expiry(ref, time.time() + 3600)
    sweeper.join()
    assert not _exists(docker_client, container=ref)


def test_sweep_removes_orphaned_volumes_after_a_grace(docker_client: Any, runtime_image: str, owner: str) -> None:
    provider = DockerProvider(_template(runtime_image, owner), client=docker_client, orphan_grace=30)
    crashed = provider.create()
    volume = _volume_of(crashed)
    crashed.container.remove(force=True)  # as a crash between container and volume removal leaves it
    assert provider.sweep().orphan_volumes == []  # may still be a creation in progress
    assert _exists(docker_client, volume=volume)
    report = provider.sweep(now=time.time() + 60)
    assert report.orphan_volumes == [volume]
    assert report.containers == []
    assert not _exists(docker_client, volume=volume)


def test_sweep_never_touches_other_owners(docker_client: Any, runtime_image: str, owner: str) -> None:
    other = f"{owner}-other"
    mine = DockerProvider(_template(runtime_image, owner, ttl=1), client=docker_client, orphan_grace=0)
    theirs = DockerProvider(_template(runtime_image, other, ttl=1), client=docker_client, orphan_grace=0)
    my_expired = mine.create()
    their_expired = theirs.create()
    their_orphan = theirs.create()
    their_orphan.container.remove(force=True)
    try:
        report = mine.sweep(now=time.time() + 1000)
        assert report.containers == [my_expired.id]  # the sweep did run, on its own owner
        assert _exists(docker_client, container=their_expired.id, volume=_volume_of(their_expired))
        assert _exists(docker_client, volume=_volume_of(their_orphan))
    finally:
        cleanup = theirs.sweep(now=time.time() + 1000)
    assert cleanup.containers == [their_expired.id]
    assert cleanup.orphan_volumes == [_volume_of(their_orphan)]


def test_start_sweeps_and_the_thread_sweeps_periodically(docker_client: Any, runtime_image: str, owner: str) -> None:
    template = _template(runtime_image, owner, ttl=1)
    before = DockerProvider(template, client=docker_client).create()
    time.sleep(max(0.0, int(before.container.labels[LABEL_EXPIRES]) + 0.1 - time.time()))
    with DockerProvider(template, client=docker_client, sweep_interval=0.3) as provider:
        assert not _exists(docker_client, container=before.id)  # gone by the time start returned
        assert not _exists(docker_client, volume=_volume_of(before))
        after = provider.create()
        assert _exists(docker_client, container=after.id)
        # The sweeper removes the container, then its volume: both gone, in that order, soon.
        assert _eventually(lambda: not _exists(docker_client, container=after.id), timeout=10)
        assert _eventually(lambda: not _exists(docker_client, volume=_volume_of(after)), timeout=10)


def test_sweep_spares_its_own_idle_pool(docker_client: Any, runtime_image: str, owner: str) -> None:
    template = _template(runtime_image, owner, ttl=1)
    with DockerProvider(template, client=docker_client, pool_size=1, pool_max_idle=60, sweep_interval=None) as pool:
        assert pool.wait_filled(30)
        (idle,) = pool.idle
        report = pool.sweep(now=time.time() + 1000)  # long expired, but the pool manages it
        assert idle not in report.containers
        assert pool.idle == (idle,)
        assert _exists(docker_client, container=idle)


def test_set_expiry_racing_another_to_the_same_expiry_succeeds(
    docker_client: Any, runtime_image: str, owner: str
) -> None:
    """Two replicas renew one sandbox to the same second (a client retrying on another
    replica): the second rename finds the name already taken by its own container, which the
    engine answers with a 400 ("same name as its current name"), not a 409. Each looked the
    container up before the other renamed it; the lookup is replayed, the engine is real."""
    provider = DockerProvider(_template(runtime_image, owner), client=docker_client, sweep_interval=None)
    sandbox = provider.create()
    try:
        expires_at = float(int(time.time()) + 600)
        seen_before = docker_client.containers.get(sandbox.id)  # the other replica's lookup
        provider.set_expiry(sandbox.id, expires_at)  # its rename lands first
        racing = DockerProvider(_template(runtime_image, owner), client=_LookedUpBefore(docker_client, seen_before))
        racing.set_expiry(sandbox.id, expires_at)
        assert [r.expires_at for r in provider.select({}) if r.ref == sandbox.id] == [expires_at]
        provider.destroy(sandbox.id)
        with pytest.raises(LookupError):
            racing.set_expiry(sandbox.id, expires_at + 60)
    finally:
        sandbox.destroy()
        provider.close()


class _LookedUpBefore:
    """The engine client, except that the first ``containers.get`` answers an object looked up
    earlier (what a replica holds between its lookup and its rename); later ones ask the engine."""

    def __init__(self, client: Any, container: Any) -> None:
        self._client, self._container = client, container

    def __getattr__(self, name: str) -> Any:
        if name == "containers":
            return self
        return getattr(self._client, name)

    def get(self, ref: str) -> Any:
        earlier, self._container = self._container, None
        return earlier if earlier is not None else self._client.containers.get(ref)


def test_sweep_spares_a_container_renewed_after_its_list(docker_client: Any, runtime_image: str, owner: str) -> None:
    """A sweep lists, then removes what expired one by one (each removal kills a container): a
    renewal by another process after the list must win. The renewal lands right after the
    engine's answer to the list; the engine is real."""
    provider = DockerProvider(_template(runtime_image, owner, ttl=60), client=docker_client, sweep_interval=None)
    renewing = DockerProvider(_template(runtime_image, owner), client=docker_client, sweep_interval=None)
    sandbox = provider.create()
    renewed_until = time.time() + 3600
    try:
        sweeping = DockerProvider(
            _template(runtime_image, owner),
            client=_RenewedAfterList(docker_client, lambda: renewing.set_expiry(sandbox.id, renewed_until)),
            sweep_interval=None,
        )
        report = sweeping.sweep(now=time.time() + 600)  # past the label's expiry, before the renewal's
        assert sandbox.id not in report.containers
        assert _exists(docker_client, container=sandbox.id)
    finally:
        sandbox.destroy()
        provider.close()


class _RenewedAfterList:
    """The engine client, with ``then`` run right after the first container list is answered."""

    def __init__(self, client: Any, then: Any) -> None:
        self._client, self._then = client, then

    def __getattr__(self, name: str) -> Any:
        if name == "containers":
            return self
        return getattr(self._client, name)

    def list(self, *args: Any, **kwargs: Any) -> Any:
        listed = self._client.containers.list(*args, **kwargs)
        then, self._then = self._then, None
        if then is not None:
            then()
        return listed

    def get(self, ref: str) -> Any:
        return self._client.containers.get(ref)


def test_a_final_expiry_is_never_moved(docker_client: Any, runtime_image: str, owner: str) -> None:
    """A deletion's record (`FINAL_EXPIRY` in the name) outlives another replica's renewal: the
    renewal reads the name before it renames."""
    provider = DockerProvider(_template(runtime_image, owner), client=docker_client, sweep_interval=None)
    renewing = DockerProvider(_template(runtime_image, owner), client=docker_client, sweep_interval=None)
    sandbox = provider.create()
    try:
        provider.set_expiry(sandbox.id, FINAL_EXPIRY)  # the deleting replica's record
        with pytest.raises(LookupError, match="final"):
            renewing.set_expiry(sandbox.id, time.time() + 600)
        assert [r.expires_at for r in provider.select({}) if r.ref == sandbox.id] == [FINAL_EXPIRY]
        renewing.set_expiry(sandbox.id, FINAL_EXPIRY)  # recorded again: nothing moves
    finally:
        sandbox.destroy()
        provider.close()
        renewing.close()


def test_the_services_engine_client_keeps_a_connection_for_each_thread_of_a_burst(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The service's one Docker client (`DockerTemplate`'s) reuses a connection per call of a
    burst of 40 at once: none is closed for want of room in its pool (urllib3's "Connection pool
    is full" warning, the default pool of 10's fate)."""
    context = ProviderContext(data_dir=tmp_path, output_limit=1 << 20)
    provider = DockerTemplate(backend="docker").provider(context)
    client = context.shared[CLIENT_KEY]
    start = threading.Barrier(40)

    def ping() -> None:
        start.wait(30)
        client.api.ping()

    try:
        with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
            threads = [threading.Thread(target=ping) for _ in range(40)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
        assert not [r for r in caplog.records if "pool is full" in r.getMessage()]
    finally:
        provider.close()
        client.close()
