"""Why a pod cannot start, in the cluster's words, from pod status objects as the API server
sends them (parsed by the official client, as a watch delivers them); and the exit status an
exec's error channel carries."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client import ApiClient

from sandboxes.kubernetes._exec import exit_code, status_message
from sandboxes.kubernetes._pods import is_ready, pending_reason, start_failure


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
