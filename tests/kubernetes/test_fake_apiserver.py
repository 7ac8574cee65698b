"""The FAKE Kubernetes API server, driven through the official ``kubernetes`` client only."""

from __future__ import annotations

import contextlib
import gc
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fake_apiserver import FakeKubernetes
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream

NS = "sandboxes"


def _exec(core_v1: Any, pod: str, command: list[str], *, stdin: bool = False, **options: Any) -> Any:
    """``command`` run in ``pod`` through the client's exec stream, its stdout and stderr taken and
    no TTY: what it printed, or (``_preload_content=False``) the stream itself."""
    return stream(
        core_v1.connect_get_namespaced_pod_exec,
        pod,
        NS,
        command=command,
        stdout=True,
        stderr=True,
        stdin=stdin,
        tty=False,
        **options,
    )


def pod_body(name: str, image: str = "sandboxes/runtime:latest", **spec: Any) -> dict[str, Any]:
    container = {
        "name": "sandbox",
        "image": image,
        "command": ["sleep", "infinity"],
        "securityContext": {
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "resources": {"limits": {"memory": "256Mi", "cpu": "500m"}},
        **spec.pop("container", {}),
    }
    return {
        "metadata": {"name": name, "labels": {"app": "fake-test", "run": name}},
        "spec": {
            "containers": [container],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}}],
            "terminationGracePeriodSeconds": 1,
            **spec,
        },
    }


def wait_for(core_v1: Any, name: str, done: Any, timeout: int = 60) -> Any:
    """Watch the pod until ``done(pod)`` holds; the watch starts from a list's resourceVersion."""
    pods = core_v1.list_namespaced_pod(NS, field_selector=f"metadata.name={name}")
    for pod in pods.items:
        if done(pod):
            return pod
    w = watch.Watch()
    for event in w.stream(
        core_v1.list_namespaced_pod,
        NS,
        field_selector=f"metadata.name={name}",
        resource_version=pods.metadata.resource_version,
        timeout_seconds=timeout,
    ):
        if done(event["object"]):
            w.stop()
            return event["object"]
    raise AssertionError(f"pod {name} never reached the state")


def running(pod: Any) -> bool:
    return pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []
    )


def waiting_reason(pod: Any) -> str | None:
    statuses = pod.status.container_statuses or []
    return statuses[0].state.waiting.reason if statuses and statuses[0].state.waiting else None


@pytest.fixture
def pod(core_v1: Any, fake_kubernetes: FakeKubernetes) -> Iterator[str]:
    name = f"p-{uuid.uuid4().hex[:8]}"
    core_v1.create_namespaced_pod(NS, pod_body(name))
    wait_for(core_v1, name, running)
    yield name
    with contextlib.suppress(ApiException):  # a test may have deleted it
        core_v1.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_discovery_and_kubeconfig(core_v1: Any, kube_api_client: Any) -> None:
    assert client.VersionApi(kube_api_client).get_code().git_version.endswith("-fake")


def test_create_get_list_delete_with_labels(core_v1: Any, pod: str) -> None:
    got = core_v1.read_namespaced_pod(pod, NS)
    assert got.spec.node_name == "fake-node"
    assert int(got.metadata.resource_version) > 0
    assert [p.metadata.name for p in core_v1.list_namespaced_pod(NS, label_selector=f"run={pod}").items] == [pod]
    assert pod in [
        p.metadata.name for p in core_v1.list_namespaced_pod(NS, label_selector="app in (fake-test,x)").items
    ]
    assert not core_v1.list_namespaced_pod(NS, label_selector=f"run={pod},app!=fake-test").items
    assert pod not in [p.metadata.name for p in core_v1.list_namespaced_pod(NS, label_selector="!app").items]
    assert pod not in [
        p.metadata.name for p in core_v1.list_namespaced_pod(NS, label_selector="app notin (fake-test)").items
    ]
    with pytest.raises(ApiException) as exc:
        core_v1.create_namespaced_pod(NS, pod_body(pod))
    assert exc.value.status == 409
    assert json.loads(exc.value.body)["reason"] == "AlreadyExists"
    deleted = core_v1.delete_namespaced_pod(pod, NS)
    assert deleted.metadata.deletion_timestamp is not None
    w = watch.Watch()
    for event in w.stream(
        core_v1.list_namespaced_pod,
        NS,
        label_selector=f"run={pod}",
        resource_version=deleted.metadata.resource_version,
        timeout_seconds=30,
    ):
        if event["type"] == "DELETED":
            w.stop()
            break
    else:
        raise AssertionError("no DELETED event")
    with pytest.raises(ApiException) as exc:
        core_v1.read_namespaced_pod(pod, NS)
    assert exc.value.status == 404
    assert json.loads(exc.value.body)["reason"] == "NotFound"


def test_security_settings_reach_docker(core_v1: Any, pod: str, docker_client: Any) -> None:
    (container,) = docker_client.containers.list(filters={"label": f"io.sandboxes.fake-k8s.pod={NS}.{pod}"})
    host = container.attrs["HostConfig"]
    assert container.attrs["Config"]["User"] == "1000:1000"
    assert host["ReadonlyRootfs"]
    assert host["CapDrop"] == ["ALL"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["NetworkMode"] == "none"
    assert host["Memory"] == 256 << 20
    assert host["NanoCpus"] == 500_000_000
    assert host["Tmpfs"]["/tmp"] == f"rw,exec,nosuid,nodev,uid=1000,gid=1000,mode=1777,size={16 << 20}"


def test_watch_from_a_compacted_version_is_gone(core_v1: Any, fake_kubernetes: FakeKubernetes, pod: str) -> None:
    fake_kubernetes.compact()
    with pytest.raises(ApiException) as exc:
        for _ in watch.Watch().stream(core_v1.list_namespaced_pod, NS, resource_version="1", timeout_seconds=5):
            pass
    assert exc.value.status == 410


def test_invalid_spec_is_422(core_v1: Any) -> None:
    body = pod_body("bad")
    body["spec"]["containers"][0]["image"] = ""
    with pytest.raises(ApiException) as exc:
        core_v1.create_namespaced_pod(NS, body)
    status = json.loads(exc.value.body)
    assert exc.value.status == 422
    assert status["reason"] == "Invalid"
    assert status["details"]["causes"][0]["field"] == "spec.containers[0].image"


def test_missing_image_is_err_image_pull_then_back_off(core_v1: Any) -> None:
    name = f"img-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespaced_pod(NS, pod_body(name, image="sandboxes-test/does-not-exist:1"))
    pod = wait_for(core_v1, name, lambda p: waiting_reason(p) == "ImagePullBackOff")
    assert pod.status.phase == "Pending"
    core_v1.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_unschedulable_node_selector(core_v1: Any) -> None:
    name = f"sel-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespaced_pod(NS, pod_body(name, nodeSelector={"disk": "ssd"}))
    pod = wait_for(core_v1, name, lambda p: any(c.reason == "Unschedulable" for c in p.status.conditions or []))
    (cond,) = pod.status.conditions
    assert cond.status == "False"
    assert cond.message.startswith("0/1 nodes are available: 1 node(s) didn't match")
    core_v1.delete_namespaced_pod(name, NS)


def test_crash_loop(core_v1: Any) -> None:
    name = f"crash-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespaced_pod(NS, pod_body(name, container={"command": ["sh", "-c", "exit 3"]}))
    pod = wait_for(core_v1, name, lambda p: waiting_reason(p) == "CrashLoopBackOff")
    status = pod.status.container_statuses[0]
    assert status.restart_count >= 1
    assert status.last_state.terminated.exit_code == 3
    core_v1.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_exit_never_restart_is_failed(core_v1: Any) -> None:
    name = f"fail-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespaced_pod(
        NS, pod_body(name, restartPolicy="Never", container={"command": ["sh", "-c", "exit 4"]})
    )
    pod = wait_for(core_v1, name, lambda p: p.status.phase == "Failed")
    assert pod.status.container_statuses[0].state.terminated.exit_code == 4
    core_v1.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_eviction(core_v1: Any, fake_kubernetes: FakeKubernetes, pod: str) -> None:
    fake_kubernetes.evict(NS, pod)
    evicted = core_v1.read_namespaced_pod(pod, NS)
    assert evicted.status.phase == "Failed"
    assert evicted.status.reason == "Evicted"


def test_active_deadline(core_v1: Any) -> None:
    name = f"dl-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespaced_pod(NS, pod_body(name, activeDeadlineSeconds=2))
    pod = wait_for(core_v1, name, lambda p: p.status.phase == "Failed")
    assert pod.status.reason == "DeadlineExceeded"
    core_v1.delete_namespaced_pod(name, NS, grace_period_seconds=0)


@pytest.mark.parametrize("protocol", [None, "v4.channel.k8s.io"])
def test_exec_preloaded(core_v1: Any, pod: str, protocol: str | None) -> None:
    headers = {"sec-websocket-protocol": protocol} if protocol else None
    out = _exec(core_v1, pod, ["sh", "-c", "echo hi; id -u"], _headers=headers)
    assert out == "hi\n1000\n"


@pytest.mark.parametrize("protocol", ["v5.channel.k8s.io", "v4.channel.k8s.io"])
def test_exec_interactive_exit_code_and_stdin(core_v1: Any, pod: str, protocol: str) -> None:
    headers = {"sec-websocket-protocol": protocol}
    ws = _exec(core_v1, pod, ["sh", "-c", "cat; exit 7"], stdin=True, _preload_content=False, _headers=headers)
    assert ws.subprotocol == protocol
    ws.write_stdin("ping\n")
    assert ws.readline_stdout(timeout=10) == "ping"
    if protocol.startswith("v5"):
        ws.close_channel(0)  # stdin EOF: cat ends, the command exits 7
        ws.run_forever(timeout=10)
        assert ws.returncode == 7
    else:
        ws.close()  # v4 cannot close stdin alone


def test_exec_binary_stdout(core_v1: Any, pod: str) -> None:
    script = "import sys; sys.stdout.buffer.write(bytes(range(256)) * 16384)"
    ws = _exec(core_v1, pod, ["python3", "-c", script], _preload_content=False, binary=True)
    ws.run_forever(timeout=60)
    assert ws.read_stdout() == bytes(range(256)) * 16384
    assert ws.returncode == 0


def test_unschedulable_requests_above_allocatable(core_v1: Any) -> None:
    name = f"big-{uuid.uuid4().hex[:6]}"
    body = pod_body(name, container={"resources": {"requests": {"memory": "100Gi"}}})
    core_v1.create_namespaced_pod(NS, body)
    pod = wait_for(core_v1, name, lambda p: any(c.reason == "Unschedulable" for c in p.status.conditions or []))
    assert "1 Insufficient memory" in pod.status.conditions[0].message
    core_v1.delete_namespaced_pod(name, NS)


def test_oom_killed(core_v1: Any) -> None:
    name = f"oom-{uuid.uuid4().hex[:6]}"
    command = ["python3", "-c", "b = bytearray(1 << 30)"]
    core_v1.create_namespaced_pod(NS, pod_body(name, restartPolicy="Never", container={"command": command}))
    pod = wait_for(core_v1, name, lambda p: p.status.phase == "Failed")
    assert pod.status.container_statuses[0].state.terminated.reason == "OOMKilled"
    core_v1.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_relabelled_pod_leaves_a_selective_watch(core_v1: Any, pod: str) -> None:
    pods = core_v1.list_namespaced_pod(NS, label_selector=f"run={pod}")
    core_v1.patch_namespaced_pod(pod, NS, {"metadata": {"labels": {"run": "elsewhere"}}})
    w = watch.Watch()
    events = w.stream(
        core_v1.list_namespaced_pod,
        NS,
        label_selector=f"run={pod}",
        resource_version=pods.metadata.resource_version,
        timeout_seconds=10,
    )
    first = next(iter(events))
    w.stop()
    assert first["type"] == "DELETED"
    assert first["object"].metadata.labels["run"] == "elsewhere"


def test_unsupported_subprotocol_is_refused(fake_kubernetes: FakeKubernetes, pod: str) -> None:
    import websocket

    url = (
        fake_kubernetes.url.replace("http", "ws") + f"/api/v1/namespaces/{NS}/pods/{pod}/exec?command=true&stdout=true"
    )
    with pytest.raises(websocket.WebSocketBadStatusException) as exc:
        websocket.create_connection(url, subprotocols=["base64.channel.k8s.io"])
    assert exc.value.status_code == 400


def test_closing_the_stream_kills_the_command(core_v1: Any, pod: str) -> None:
    ws = _exec(core_v1, pod, ["sleep", "4321"], stdin=True, _preload_content=False)
    ws.close()
    # The pattern is built at run time so that the probe's own command line does not match it.
    probe = 'for i in $(seq 100); do n=43; pgrep -f "^sleep ${n}21" >/dev/null || exit 0; sleep 0.1; done; exit 1'
    ws = _exec(core_v1, pod, ["sh", "-c", probe], _preload_content=False)
    ws.run_forever(timeout=30)
    assert ws.returncode == 0


def test_exec_with_a_long_command_line(core_v1: Any, pod: str) -> None:
    """The exec helper travels as ``python3 -c <script>``: tens of KiB in the query string."""
    out = _exec(core_v1, pod, ["sh", "-c", "printf %s " + "x" * 40000 + " | wc -c"])
    assert out.strip() == "40000"


def test_a_v4_only_server_refuses_v5_and_serves_v4(fake_kubernetes_v4: FakeKubernetes) -> None:
    import websocket

    api = client.CoreV1Api(client.ApiClient(client.Configuration(host=fake_kubernetes_v4.url)))
    name = f"p-{uuid.uuid4().hex[:8]}"
    api.create_namespaced_pod(NS, pod_body(name))
    try:
        wait_for(api, name, running)
        url = fake_kubernetes_v4.url.replace("http", "ws") + f"/api/v1/namespaces/{NS}/pods/{name}/exec"
        url += "?command=true&stdout=true"
        with pytest.raises(websocket.WebSocketBadStatusException) as exc:
            websocket.create_connection(url, subprotocols=["v5.channel.k8s.io"])
        assert exc.value.status_code == 400
        ws = websocket.create_connection(url, subprotocols=["v5.channel.k8s.io", "v4.channel.k8s.io"])
        assert ws.getsubprotocol() == "v4.channel.k8s.io"
        ws.close()
    finally:
        api.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_requests_are_counted_by_verb(core_v1: Any, fake_kubernetes: FakeKubernetes, pod: str) -> None:
    before = fake_kubernetes.requests.copy()
    core_v1.read_namespaced_pod(pod, NS)
    listed = core_v1.list_namespaced_pod(NS, field_selector=f"metadata.name={pod}")
    for _ in watch.Watch().stream(
        core_v1.list_namespaced_pod,
        NS,
        field_selector=f"metadata.name={pod}",
        resource_version=listed.metadata.resource_version,
        timeout_seconds=1,
    ):
        pass
    core_v1.patch_namespaced_pod(pod, NS, {"metadata": {"labels": {"counted": "yes"}}})
    _exec(core_v1, pod, ["true"])
    made = fake_kubernetes.requests - before
    assert made == {"get": 1, "list": 1, "watch": 1, "patch": 1, "exec": 1}


def test_a_finalizer_holds_a_deleted_pod_until_patched_away(
    core_v1: Any, fake_kubernetes: FakeKubernetes, pod: str
) -> None:
    core_v1.patch_namespaced_pod(pod, NS, {"metadata": {"finalizers": ["example.com/hold"]}})
    core_v1.delete_namespaced_pod(pod, NS, grace_period_seconds=0)

    def stopped(p: Any) -> bool:
        return p.metadata.deletion_timestamp is not None and p.status.container_statuses[0].state.terminated is not None

    held = wait_for(core_v1, pod, stopped)  # the containers ended, the object stays
    assert held.metadata.finalizers == ["example.com/hold"]
    assert core_v1.read_namespaced_pod(pod, NS).metadata.deletion_timestamp is not None
    core_v1.patch_namespaced_pod(pod, NS, {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as gone:
        core_v1.read_namespaced_pod(pod, NS)
    assert gone.value.status == 404


def test_dropping_exec_streams_cuts_them_off_without_a_status(
    core_v1: Any, fake_kubernetes: FakeKubernetes, pod: str
) -> None:
    ws = _exec(core_v1, pod, ["sh", "-c", "echo started; sleep 30"], stdin=True, _preload_content=False)
    while "started" not in ws.read_stdout(timeout=10):  # the command runs
        pass
    assert fake_kubernetes.drop_exec_streams(NS, pod) == 1
    ws.run_forever(timeout=30)
    assert not ws.is_open()
    assert ws.read_channel(3) == ""  # no exit status: its fate is unknown to the client


def test_the_servers_sockets_do_not_delay_small_writes(core_v1: Any, fake_kubernetes: FakeKubernetes, pod: str) -> None:
    """TCP_NODELAY on every connection the fake holds, an exec stream's included."""
    import socket

    ws = _exec(core_v1, pod, ["sleep", "30"], stdin=True, _preload_content=False)
    try:
        flags = fake_kubernetes.connection_options(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        assert flags
        assert all(flags), flags
    finally:
        ws.close()


def test_an_exec_left_with_output_unread_does_not_hold_up_the_next(core_v1: Any, pod: str) -> None:
    """The engine (dockerd 20.10) handles a container's events one at a time, and an exec's exit
    only once its output was copied out: a command left by its client with output still on the
    way must have its engine connection closed at once (not whenever the garbage collector
    frees it), or every later exec in the pod never ends. With the collector off, the old
    bridge held the connection for good."""
    gc.collect()
    gc.disable()
    try:
        left = _exec(core_v1, pod, ["sh", "-c", "head -c 16777216 /dev/zero"], _preload_content=False, binary=True)
        assert left.read_stdout(timeout=30)
        left.close()
        after = _exec(core_v1, pod, ["echo", "next"], _preload_content=False, binary=True)
        after.run_forever(timeout=30)
        assert (after.returncode, after.read_stdout()) == (0, b"next\n"), "the next exec never ended"
    finally:
        gc.enable()
