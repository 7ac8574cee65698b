"""KubernetesSandbox's lifecycle and KubernetesProvider (create, attach, list, destroy, sweep,
warm pool, start failures) against the FAKE API server of ``tests/kubernetes/fake_apiserver``
(fixture ``fake_kubernetes``), whose pods are Docker containers: pods created, watched until
Ready, deleted and watched until gone."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fake_apiserver import FakeKubernetes
from support import SESSION_OWNER

from sandboxes.kubernetes import (
    LABEL_EXPIRES,
    LABEL_POOL,
    KubernetesProvider,
    KubernetesSandbox,
    KubernetesSandboxConfig,
    PodStartError,
)
from sandboxes.lifecycle import (
    FINAL_EXPIRY,
    NETWORK_RECORD_LIMIT,
    CreateOptions,
    PooledProvider,
    Provider,
    RecordsNetwork,
)
from sandboxes.testing import LifecycleConformance, ProviderConformance, SharedProviderConformance

NS = "sandboxes"


@pytest.fixture(scope="module")
def cluster(fake_kubernetes: FakeKubernetes) -> FakeKubernetes:
    return fake_kubernetes


@pytest.fixture(scope="module")
def api_client(cluster: FakeKubernetes) -> Any:
    from kubernetes import client

    return client.ApiClient(client.Configuration(host=cluster.url))


@pytest.fixture(scope="module")
def template(runtime_image: str) -> KubernetesSandboxConfig:
    return KubernetesSandboxConfig(namespace="sandboxes", image=runtime_image, owner=SESSION_OWNER, startup_timeout=60)


def _exists(cluster: FakeKubernetes, name: str) -> bool:
    return cluster.pod(NS, name) is not None


def _gone_or_going(cluster: FakeKubernetes, name: str) -> bool:
    pod = cluster.pod(NS, name)
    return pod is None or bool(pod["metadata"].get("deletionTimestamp"))


class TestKubernetesLifecycle(LifecycleConformance):
    @pytest.fixture
    def create(self, template: KubernetesSandboxConfig, api_client: Any) -> Callable[[], KubernetesSandbox]:
        return lambda: KubernetesSandbox.create(template, api_client=api_client)

    @pytest.fixture
    def attach(self, api_client: Any) -> Callable[[KubernetesSandbox], KubernetesSandbox]:
        return lambda sandbox: KubernetesSandbox.attach(sandbox.id, config=sandbox.config, api_client=api_client)

    @pytest.fixture
    def exists(self, cluster: FakeKubernetes) -> Callable[[KubernetesSandbox], bool]:
        return lambda sandbox: _exists(cluster, sandbox.id)


@pytest.fixture
def provider(template: KubernetesSandboxConfig, api_client: Any) -> Iterator[KubernetesProvider]:
    made = KubernetesProvider(template, api_client=api_client, sweep_interval=None, sweep_on_start=False)
    yield made
    made.close()


class TestKubernetesProvider(ProviderConformance):
    """The promises every provider keeps, as Docker's, SSH's and Local's are checked
    (tests/test_provider_conformance.py), under an owner of its own so that its sweeps
    reach only what it made."""

    @pytest.fixture
    def provider(self, template: KubernetesSandboxConfig, api_client: Any) -> Iterator[KubernetesProvider]:
        owned = template.model_copy(update={"owner": f"{SESSION_OWNER}-pc-{uuid.uuid4().hex[:6]}"})
        with KubernetesProvider(owned, api_client=api_client, sweep_interval=None, sweep_on_start=False) as made:
            yield made


class TestKubernetesSharedProvider(SharedProviderConformance):
    """Selection is the API server's label selector; a moved expiry is a patched label."""

    @pytest.fixture
    def provider(self, provider: KubernetesProvider) -> KubernetesProvider:
        return provider


def test_is_a_pooled_provider(provider: KubernetesProvider) -> None:
    assert isinstance(provider, Provider)
    assert isinstance(provider, PooledProvider)


def test_create_list_attach_destroy(provider: KubernetesProvider, cluster: FakeKubernetes) -> None:
    options = CreateOptions(labels={"tenant": "t1"}, env={"GREETING": "hello"}, ttl=600)
    with provider.create(options) as sandbox:
        assert sandbox.owned
        assert sandbox.execute('printf %s "$GREETING"').output == "hello"
        records = {record.ref: record for record in provider.list()}
        record = records[sandbox.id]
        assert record.id == sandbox.id
        assert dict(record.labels) == {"tenant": "t1"}
        assert record.running
        assert record.expires_at is not None
        assert 500 < record.expires_at - record.created_at <= 660
        attached = provider.attach(sandbox.id)
        assert not attached.owned
        assert attached.execute('printf %s "$GREETING"').output == "hello"
        attached.close()
        assert _exists(cluster, sandbox.id)
    assert not _exists(cluster, sandbox.id)  # `with` on what it created waited for it to be gone
    assert sandbox.id not in {record.ref for record in provider.list()}
    provider.destroy(sandbox.id)  # gone already is fine


def test_attach_to_nothing_raises_lookup_error(provider: KubernetesProvider) -> None:
    with pytest.raises(LookupError):
        provider.attach("sandbox-does-not-exist")


def test_sweep_reaps_only_this_owners_expired_pods(
    provider: KubernetesProvider, template: KubernetesSandboxConfig, api_client: Any, cluster: FakeKubernetes
) -> None:
    other = KubernetesProvider(
        template.model_copy(update={"owner": f"{SESSION_OWNER}-other"}),
        api_client=api_client,
        sweep_interval=None,
        sweep_on_start=False,
    )
    short = provider.create(CreateOptions(ttl=60))
    long = provider.create(CreateOptions(ttl=3600))
    foreign = other.create(CreateOptions(ttl=60))
    try:
        assert provider.sweep().removed == []
        report = provider.sweep(now=short_expiry(provider, short.id) + 1)
        assert report.removed == [short.id]
        assert report.errors == []
        assert _exists(cluster, long.id)
        assert _exists(cluster, foreign.id)
    finally:
        for sandbox in (short, long, foreign):
            sandbox.destroy()
        other.close()


def short_expiry(provider: KubernetesProvider, ref: str) -> float:
    expiry = {record.ref: record.expires_at for record in provider.list()}[ref]
    assert expiry is not None
    return expiry


def test_a_pod_that_cannot_start_is_deleted_and_says_why(
    template: KubernetesSandboxConfig, api_client: Any, cluster: FakeKubernetes
) -> None:
    config = template.model_copy(update={"image": "sandboxes-test/no-such-image:never", "image_pull_policy": "Never"})
    before = cluster.pod_names(NS)
    with pytest.raises(PodStartError) as raised:
        KubernetesSandbox.create(config, api_client=api_client)
    assert raised.value.reason == "ErrImageNeverPull"
    assert "no-such-image" in raised.value.message
    assert all(_gone_or_going(cluster, name) for name in cluster.pod_names(NS) - before)


def test_warm_pool_hands_out_ready_pods(
    template: KubernetesSandboxConfig, api_client: Any, cluster: FakeKubernetes
) -> None:
    with KubernetesProvider(template, api_client=api_client, pool_size=1, sweep_interval=None) as pooled:
        assert pooled.wait_filled(120)
        (waiting,) = pooled.idle
        pod = cluster.pod(NS, waiting)
        assert pod is not None
        assert pod["metadata"]["labels"][LABEL_POOL] == pooled.id
        assert waiting not in {record.ref for record in pooled.list()}  # nobody holds it yet
        execs = cluster.requests["exec"]
        sandbox = pooled.acquire()
        try:
            assert sandbox.id == waiting
            assert sandbox.owned
            assert sandbox.execute("echo warm").output == "warm\n"
            assert cluster.requests["exec"] == execs  # its exec helper was already up
            pod = cluster.pod(NS, waiting)
            assert pod is not None
            labels = pod["metadata"]["labels"]
            assert LABEL_POOL not in labels
            assert template.ttl is not None
            assert int(labels[LABEL_EXPIRES]) <= int(__import__("time").time() + template.ttl) + 1
            assert waiting in {record.ref for record in pooled.list()}
            assert pooled.wait_filled(120)  # refilled by the thread
            assert pooled.idle != (waiting,)
        finally:
            sandbox.destroy()
        refill = pooled.idle
    for name in refill:  # close deleted the idle pod
        assert _gone_or_going(cluster, name)


def test_creation_and_deletion_wait_by_watch_not_polling(
    template: KubernetesSandboxConfig, api_client: Any, cluster: FakeKubernetes
) -> None:
    before = cluster.requests.copy()
    sandbox = KubernetesSandbox.create(template, api_client=api_client)
    made = cluster.requests - before
    assert made["create"] == 1
    assert made["list"] == 1  # the state and a resourceVersion, then only watches
    assert made["get"] == 0
    assert 1 <= made["watch"] <= 3
    before = cluster.requests.copy()
    sandbox.destroy()
    assert not _exists(cluster, sandbox.id)  # returned only once the pod was gone
    gone = cluster.requests - before
    assert gone["delete"] == 1
    assert gone["list"] == 1
    assert 1 <= gone["watch"] <= 3


def test_a_kubeconfig_names_the_cluster(
    template: KubernetesSandboxConfig, cluster: FakeKubernetes, tmp_path: Any
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: other\n"
        f"clusters:\n- name: fake\n  cluster:\n    server: {cluster.url}\n"
        "- name: nowhere\n  cluster:\n    server: http://127.0.0.1:9\n"
        "users:\n- name: tester\n  user:\n    token: not-checked-by-the-fake\n"
        "contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: tester\n"
        "- name: other\n  context:\n    cluster: nowhere\n    user: tester\n"
    )
    config = template.model_copy(update={"kubeconfig": str(kubeconfig), "context": "fake"})
    with (
        KubernetesProvider(config, sweep_interval=None, sweep_on_start=False) as provider,
        provider.create() as sandbox,
    ):
        assert sandbox.execute("echo via-kubeconfig").output == "via-kubeconfig\n"


def test_in_cluster_without_a_service_account_says_so(template: KubernetesSandboxConfig) -> None:
    from kubernetes.config import ConfigException

    with pytest.raises(ConfigException):
        KubernetesProvider(template.model_copy(update={"in_cluster": True}))


def test_commands_in_a_deleted_pod_answer_unavailable(
    template: KubernetesSandboxConfig, api_client: Any, cluster: FakeKubernetes
) -> None:
    from sandboxes import protocol as p

    sandbox = KubernetesSandbox.create(template, api_client=api_client)
    attached = KubernetesSandbox.attach(sandbox.id, config=template, api_client=api_client)
    assert attached.execute("true").exit_code == 0
    sandbox.destroy()
    sandbox.destroy()  # idempotent
    gone = attached.execute("echo hello")
    assert gone.error in (p.UNAVAILABLE, p.CONNECTION_LOST)
    assert gone.exit_code is None
    attached.close()


def test_the_pod_runs_as_its_spec_says(
    template: KubernetesSandboxConfig, api_client: Any, cluster: FakeKubernetes
) -> None:
    """End to end through the fake's mapping of the pod spec: uid/gid 1000, no capabilities,
    no new privileges, a read-only root, writable workspace and /tmp."""
    with KubernetesSandbox.create(template, api_client=api_client) as sandbox:
        assert sandbox.execute("id -u; id -g").output == "1000\n1000\n"
        status = sandbox.execute("grep -E '^(CapEff|NoNewPrivs)' /proc/self/status").output.split()
        assert status == ["CapEff:", "0000000000000000", "NoNewPrivs:", "1"]
        assert sandbox.write("/usr/evil", "x").error is not None
        assert sandbox.write("/workspace/ok", "x").error is None
        assert sandbox.write("/tmp/ok", "x").error is None


def test_sweep_reaps_dead_never_ready_and_abandoned_pool_pods(
    template: KubernetesSandboxConfig, api_client: Any, cluster: FakeKubernetes
) -> None:
    import time

    from kubernetes import client

    from sandboxes.kubernetes._pods import new_pod_name, pod_manifest

    forever = template.model_copy(update={"ttl": None})
    provider = KubernetesProvider(forever, api_client=api_client, sweep_interval=None, sweep_on_start=False)
    abandoned = KubernetesProvider(
        forever.model_copy(update={"labels": {LABEL_POOL: "dead-provider"}}),
        api_client=api_client,
        sweep_interval=None,
        sweep_on_start=False,
    )
    evicted, kept = provider.create(), provider.create()
    pooled = abandoned.create()
    # What a provider that died while its pod waited leaves: this owner's pod, never ready
    # (no node has the label it asks for).
    stuck = new_pod_name()
    nowhere = forever.model_copy(update={"node_selector": {"pool": "gpu"}})
    client.CoreV1Api(api_client).create_namespaced_pod(NS, pod_manifest(nowhere, stuck))
    try:
        cluster.evict(NS, evicted.id)  # the node under pressure: phase Failed, reason Evicted
        assert provider.sweep().removed == [evicted.id]  # the others are young
        later = time.time() + provider.config.pool_max_idle + provider.config.orphan_grace + 5
        assert sorted(provider.sweep(now=later).removed) == sorted([stuck, pooled.id])
        assert _exists(cluster, kept.id)
    finally:
        for sandbox in (evicted, kept, pooled):
            sandbox.destroy()
        provider.destroy(stuck)
        provider.close()
        abandoned.close()


def test_destroy_says_what_holds_a_pod_that_does_not_go(
    template: KubernetesSandboxConfig, api_client: Any, cluster: FakeKubernetes, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandboxes.kubernetes import _pods

    monkeypatch.setattr(_pods, "_GONE_GRACE", 1.0)
    sandbox = KubernetesSandbox.create(template, api_client=api_client)
    sandbox.api.patch_namespaced_pod(sandbox.id, template.namespace, {"metadata": {"finalizers": ["example.com/hold"]}})
    with pytest.raises(TimeoutError, match=r"finalizers \['example.com/hold'\]"):
        sandbox.destroy()
    held = cluster.pod(NS, sandbox.id)
    assert held is not None
    assert held["metadata"]["deletionTimestamp"]
    assert held["metadata"]["finalizers"] == ["example.com/hold"]
    # The finalizer's controller lets go, as one does: it patches its finalizer away.
    sandbox.api.patch_namespaced_pod(sandbox.id, template.namespace, {"metadata": {"finalizers": None}})
    sandbox.destroy()
    assert not _exists(cluster, sandbox.id)


def test_an_unschedulable_pod_says_what_the_scheduler_said(
    template: KubernetesSandboxConfig, api_client: Any, cluster: FakeKubernetes
) -> None:
    config = template.model_copy(update={"node_selector": {"pool": "gpu"}, "startup_timeout": 3.0})
    with pytest.raises(PodStartError) as raised:
        KubernetesSandbox.create(config, api_client=api_client)
    assert raised.value.reason == "Unschedulable"
    assert "didn't match Pod's node affinity/selector" in raised.value.message
    assert _gone_or_going(cluster, raised.value.pod)
    patient = KubernetesProvider(config, api_client=api_client, fail_unschedulable=False, sweep_on_start=False)
    with pytest.raises(TimeoutError, match="Unschedulable"):
        patient.create()
    schedulable = template.model_copy(update={"node_selector": {"kubernetes.io/os": "linux"}})
    with KubernetesSandbox.create(schedulable, api_client=api_client) as sandbox:
        assert sandbox.execute("echo placed").output == "placed\n"


def test_sweep_spares_a_pod_renewed_after_its_list(
    provider: KubernetesProvider, cluster: FakeKubernetes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep lists, then deletes what expired one by one: a renewal by another process
    (`set_expiry`) after the list must win. It lands right after the API server's answer."""
    sandbox = provider.create(CreateOptions(ttl=60))
    try:
        now = short_expiry(provider, sandbox.id) + 600
        listed = provider.api.list_namespaced_pod

        def renewed_right_after(*args: Any, **kwargs: Any) -> Any:
            pods = listed(*args, **kwargs)
            provider.set_expiry(sandbox.id, now + 3600)
            return pods

        monkeypatch.setattr(provider.api, "list_namespaced_pod", renewed_right_after)
        report = provider.sweep(now=now)
        monkeypatch.undo()
        assert sandbox.id not in report.removed
        assert _exists(cluster, sandbox.id)
    finally:
        sandbox.destroy()


def test_concurrent_api_calls_keep_their_connections(fake_kubeconfig: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The service makes up to its ``worker_threads`` (64) API calls at once through one client.
    With the client's default pool (5 per CPU) a real cluster's service logged "Connection pool
    is full, discarding connection" 97 times in one e2e run, re-opening TLS for each call."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from sandboxes.kubernetes import KubernetesSandboxConfig
    from sandboxes.kubernetes._pods import core_api, load_api_client

    api = core_api(load_api_client(KubernetesSandboxConfig(kubeconfig=str(fake_kubeconfig), namespace="sandboxes")))
    together = threading.Barrier(64)

    def call(_: int) -> None:
        together.wait(30)
        api.list_namespaced_pod("sandboxes", label_selector="app.kubernetes.io/managed-by=nobody")

    with caplog.at_level("WARNING", logger="urllib3.connectionpool"), ThreadPoolExecutor(64) as pool:
        list(pool.map(call, range(64)))
    assert not [record for record in caplog.records if "Connection pool is full" in record.getMessage()]


def test_a_final_expiry_is_never_moved_by_a_renewal_read_before_it(
    provider: KubernetesProvider, template: KubernetesSandboxConfig, api_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deletion's record (`FINAL_EXPIRY`) lands between another process's read of the pod and
    its patch: the patch, made on the version read, is refused (409), the pod read again, and
    the renewal refused; the record stays."""
    deleting = KubernetesProvider(template, api_client=api_client, sweep_interval=None, sweep_on_start=False)
    sandbox = provider.create(CreateOptions(ttl=60))
    try:
        read = provider.api.read_namespaced_pod
        reads = []

        def deleted_right_after(*args: Any, **kwargs: Any) -> Any:
            pod = read(*args, **kwargs)
            reads.append(pod.metadata.resource_version)
            if len(reads) == 1:
                deleting.set_expiry(sandbox.id, FINAL_EXPIRY)
            return pod

        monkeypatch.setattr(provider.api, "read_namespaced_pod", deleted_right_after)
        with pytest.raises(LookupError, match="final"):
            provider.set_expiry(sandbox.id, time.time() + 600)
        monkeypatch.undo()
        assert len(reads) == 2
        assert short_expiry(provider, sandbox.id) == FINAL_EXPIRY
        with pytest.raises(LookupError, match="final"):  # nor moved by a renewal read after it
            provider.set_expiry(sandbox.id, time.time() + 600)
    finally:
        sandbox.destroy()
        deleting.close()


def test_a_network_record_is_patched_on_the_version_read_and_read_back_with_the_pod(
    provider: KubernetesProvider, template: KubernetesSandboxConfig, api_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`RecordsNetwork.set_network`: another process's change between the read and the patch
    makes the patch a 409, and the pod is read again and the change made again on what it
    records then. The record comes back with the pod's (`SandboxRecord.network`); one too long
    is refused, and none lands on a pod recorded deleted."""
    other = KubernetesProvider(template, api_client=api_client, sweep_interval=None, sweep_on_start=False)
    sandbox = provider.create(CreateOptions(ttl=60))
    try:
        assert isinstance(provider, RecordsNetwork)
        provider.set_network(sandbox.id, lambda current: "first")
        read = provider.api.read_namespaced_pod
        seen: list[str | None] = []

        def changed_right_after(*args: Any, **kwargs: Any) -> Any:
            pod = read(*args, **kwargs)
            if not seen:
                other.set_network(sandbox.id, lambda current: f"{current}+other")
                other.set_expiry(sandbox.id, time.time() + 900)
            return pod

        def change(current: str | None) -> str:
            seen.append(current)
            return f"{current}+mine"

        monkeypatch.setattr(provider.api, "read_namespaced_pod", changed_right_after)
        provider.set_network(sandbox.id, change)
        monkeypatch.undo()
        assert seen == ["first", "first+other"]  # made again on what the other recorded
        (record,) = [found for found in provider.list() if found.ref == sandbox.id]
        assert record.network == "first+other+mine"
        assert record.expires_at is not None
        assert record.expires_at > time.time() + 600  # the other's renewal kept
        with pytest.raises(ValueError, match=str(NETWORK_RECORD_LIMIT)):
            provider.set_network(sandbox.id, lambda current: "x" * (NETWORK_RECORD_LIMIT + 1))
        other.set_expiry(sandbox.id, FINAL_EXPIRY)
        with pytest.raises(LookupError):
            provider.set_network(sandbox.id, lambda current: "{}")
        (record,) = [found for found in provider.list() if found.ref == sandbox.id]
        assert record.network == "first+other+mine"
    finally:
        sandbox.destroy()
        other.close()
