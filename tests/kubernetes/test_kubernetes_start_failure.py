"""Why a pod cannot start, in the cluster's words: over the wire, from the FAKE API server's
node reporting each failure in the pod's status as a kubelet and a scheduler do (and the pod
deleted after); and from pod status objects as the API server sends them (parsed by the
official client, as a watch delivers them). And the exit status an exec's error channel carries."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from fake_apiserver import FakeKubernetes, StartFault
from kubernetes.client import ApiClient
from support import SESSION_OWNER

from sandboxes.kubernetes import KubernetesSandbox, KubernetesSandboxConfig, PodStartError
from sandboxes.kubernetes._exec import exit_code, status_message
from sandboxes.kubernetes._pods import is_ready, new_pod_name, pending_reason, start_failure, wait_ready

NS = "sandboxes"


@pytest.fixture(scope="module")
def api_client(fake_kubernetes: FakeKubernetes) -> Any:
    from kubernetes import client

    return client.ApiClient(client.Configuration(host=fake_kubernetes.url))


@pytest.fixture
def template(runtime_image: str) -> KubernetesSandboxConfig:
    return KubernetesSandboxConfig(namespace=NS, image=runtime_image, owner=SESSION_OWNER, startup_timeout=60)


def _fails_to_start(config: KubernetesSandboxConfig, api_client: Any, fake: FakeKubernetes) -> PodStartError:
    """The `PodStartError` of creating a sandbox from ``config``, once its pod is deleted."""
    before = fake.pod_names(NS)
    with pytest.raises(PodStartError) as raised:
        KubernetesSandbox.create(config, api_client=api_client)
    assert raised.value.pod not in before
    pod = fake.pod(NS, raised.value.pod)
    assert pod is None or pod["metadata"].get("deletionTimestamp"), "the pod that failed was left behind"
    return raised.value


def test_a_missing_image_is_err_image_pull_over_the_wire(
    template: KubernetesSandboxConfig, api_client: Any, fake_kubernetes: FakeKubernetes
) -> None:
    config = template.model_copy(update={"image": "sandboxes-test/no-such-image:never"})
    failure = _fails_to_start(config, api_client, fake_kubernetes)
    # ErrImagePull first, ImagePullBackOff a back-off later: the first one the watch shows.
    assert failure.reason in ("ErrImagePull", "ImagePullBackOff")
    assert "sandboxes-test/no-such-image:never" in failure.message


def test_too_big_a_request_is_unschedulable_in_the_schedulers_words(
    template: KubernetesSandboxConfig, api_client: Any, fake_kubernetes: FakeKubernetes
) -> None:
    config = template.model_copy(update={"cpu_request": "64", "cpu_limit": "64"})
    failure = _fails_to_start(config, api_client, fake_kubernetes)
    assert failure.reason == "Unschedulable"
    assert failure.message.startswith("0/1 nodes are available: 1 Insufficient cpu.")


@pytest.mark.parametrize(
    ("fault", "words"), [("OOMKilled", "exit code 137"), ("Evicted", "The node was low on resource: memory.")]
)
def test_a_node_fault_at_start_in_the_kubelets_words(
    template: KubernetesSandboxConfig, api_client: Any, fake_kubernetes: FakeKubernetes, fault: StartFault, words: str
) -> None:
    mark = uuid.uuid4().hex[:12]
    fake_kubernetes.inject_start_failure(f"fault-test={mark}", fault)
    config = template.model_copy(update={"labels": {"fault-test": mark}})
    failure = _fails_to_start(config, api_client, fake_kubernetes)
    assert failure.reason == fault
    assert words in failure.message


def test_a_command_that_cannot_run_is_start_error(
    template: KubernetesSandboxConfig, api_client: Any, fake_kubernetes: FakeKubernetes
) -> None:
    config = template.model_copy(update={"command": ("/no/such/command",)})
    failure = _fails_to_start(config, api_client, fake_kubernetes)
    assert failure.reason == "StartError"
    assert failure.message.startswith("exit code 128: ")
    assert "/no/such/command" in failure.message


def test_a_crash_loop_is_a_start_failure(api_client: Any, fake_kubernetes: FakeKubernetes, runtime_image: str) -> None:
    """Our pods never restart (``restartPolicy: Never``); a pod that does (attached, or made by
    another controller) and cannot start backs off, and waiting for it says so."""
    from kubernetes import client

    api = client.CoreV1Api(api_client)
    name = new_pod_name()
    container = {"name": "sandbox", "image": runtime_image, "command": ["/no/such/command"]}
    api.create_namespaced_pod(NS, {"metadata": {"name": name}, "spec": {"containers": [container]}})
    try:
        with pytest.raises(PodStartError) as raised:
            wait_ready(api, NS, name, 60)
        assert raised.value.reason == "CrashLoopBackOff"
        assert "back-off" in raised.value.message
        assert f"pod={name}_{NS}" in raised.value.message
    finally:
        api.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def _pod(status: dict[str, Any], **metadata: Any) -> Any:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sandbox-x", **metadata}, "status": status}
    return ApiClient().deserialize(json.dumps(body), "V1Pod", "application/json")


def _waiting(reason: str, message: str) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "containerStatuses": [
            {
                "name": "sandbox",
                "image": "i",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}},
            }
        ],
    }


def _terminated(reason: str, code: int, *, last: bool = False) -> dict[str, Any]:
    state = {"terminated": {"reason": reason, "exitCode": code}}
    status = {"name": "sandbox", "image": "i", "imageID": "", "ready": False, "restartCount": 1}
    status.update(
        {"lastState": state, "state": {"waiting": {"reason": "PodInitializing"}}} if last else {"state": state}
    )
    return {"phase": "Running" if last else "Failed", "containerStatuses": [status]}


@pytest.mark.parametrize(
    ("status", "reason", "words"),
    [
        (_waiting("ErrImagePull", "pull access denied for nope/nope"), "ErrImagePull", "pull access denied"),
        (_waiting("ImagePullBackOff", 'Back-off pulling image "nope"'), "ImagePullBackOff", "Back-off pulling"),
        (_waiting("InvalidImageName", 'couldn\'t parse image name "A B"'), "InvalidImageName", "parse image"),
        (_waiting("ErrImageNeverPull", "image not present with pull policy Never"), "ErrImageNeverPull", "Never"),
        (_waiting("CrashLoopBackOff", "back-off 10s restarting failed container"), "CrashLoopBackOff", "back-off"),
        (_waiting("CreateContainerConfigError", 'secret "s" not found'), "CreateContainerConfigError", "secret"),
        (_terminated("OOMKilled", 137), "OOMKilled", "exit code 137"),
        (_terminated("OOMKilled", 137, last=True), "OOMKilled", "exit code 137"),
        (_terminated("Error", 1), "Error", "exit code 1"),
        (
            {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."},
            "Evicted",
            "low on resource",
        ),
        (
            {"phase": "Failed", "reason": "DeadlineExceeded", "message": "Pod was active on the node longer than"},
            "DeadlineExceeded",
            "longer than",
        ),
        (  # as a kubelet reports an eviction: the killed container's end beside the pod's reason
            {**_terminated("Error", 137), "reason": "Evicted", "message": "The node was low on resource: memory."},
            "Evicted",
            "low on resource",
        ),
        (
            {**_terminated("Error", 137), "reason": "DeadlineExceeded", "message": "Pod was active on the node longer"},
            "DeadlineExceeded",
            "longer",
        ),
        (
            {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes are available: 3 Insufficient cpu.",
                    }
                ],
            },
            "Unschedulable",
            "Insufficient cpu",
        ),
        ({"phase": "Succeeded"}, "Completed", "Succeeded"),
    ],
)
def test_start_failures_in_the_clusters_words(status: dict[str, Any], reason: str, words: str) -> None:
    failure = start_failure(_pod(status))
    assert failure is not None
    assert failure[0] == reason
    assert words in failure[1]


def test_a_pod_being_deleted_will_not_start() -> None:
    pod = _pod({"phase": "Pending"}, deletionTimestamp="2026-01-01T00:00:00Z")
    assert start_failure(pod) == ("Deleted", "the pod is being deleted")


@pytest.mark.parametrize(
    "status",
    [
        {},
        {"phase": "Pending"},
        {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]},
        _waiting("ContainerCreating", ""),
        _waiting("PodInitializing", ""),
        {"phase": "Running", "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}]},
    ],
)
def test_a_pod_on_its_way_is_not_a_failure(status: dict[str, Any]) -> None:
    pod = _pod(status)
    assert start_failure(pod) is None
    assert not is_ready(pod)


def test_unschedulable_may_wait_for_an_autoscaler() -> None:
    pod = _pod(
        {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1"}],
        }
    )
    assert start_failure(pod, fail_unschedulable=False) is None
    assert "Unschedulable" in pending_reason(pod)


def test_ready_means_running_and_the_ready_condition() -> None:
    running = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    assert is_ready(_pod(running))
    assert not is_ready(_pod({**running, "phase": "Pending"}))


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (b'{"metadata":{},"status":"Success"}', 0),
        (
            b'{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: 3",'
            b'"reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}',
            3,
        ),
        (
            b'{"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"137"}]}}',
            137,
        ),
        (b'{"status":"Failure","message":"exec: \\"python3\\": executable file not found in $PATH"}', None),
        (b"", None),
        (b"not json", None),
        (b"[1, 2]", None),
        (b'{"status":"Failure","details":{"causes":[{"reason":"ExitCode","message":"x"}]}}', None),
    ],
)
def test_exit_status_from_the_error_channel(status: bytes, code: int | None) -> None:
    assert exit_code(status) == code


def test_status_message_is_bounded() -> None:
    assert status_message(b'{"message":"' + b"m" * 10_000 + b'"}') == "m" * 500
    assert status_message(b"\xff" * 1000) == "\ufffd" * 500
