"""The sandbox pod's manifest, each secure default on its own (no cluster needed), and the
manifest accepted by the official client's own model (what the API server would be sent)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from sandboxes.kubernetes import (
    ANNOTATION_EXPIRES,
    LABEL_EXPIRES,
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_SANDBOX,
    KubernetesSandboxConfig,
    Toleration,
    pod_manifest,
)

NOW = 1_800_000_000.0


def _pod(**overrides: Any) -> dict[str, Any]:
    return pod_manifest(KubernetesSandboxConfig(**overrides), "sandbox-abc", now=NOW)


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    containers = pod["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]  # type: ignore[no-any-return]


def test_runs_as_non_root_uid_and_gid_1000() -> None:
    pod = _pod()
    for context in (pod["spec"]["securityContext"], _container(pod)["securityContext"]):
        assert context["runAsNonRoot"] is True
        assert context["runAsUser"] == 1000
        assert context["runAsGroup"] == 1000
    assert pod["spec"]["securityContext"]["fsGroup"] == 1000


def test_no_privilege_escalation_no_capabilities_not_privileged() -> None:
    context = _container(_pod())["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["privileged"] is False
    assert "add" not in context["capabilities"]


def test_seccomp_runtime_default() -> None:
    pod = _pod()
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert _container(pod)["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_read_only_root_with_size_limited_workspace_and_tmp() -> None:
    pod = _pod(workspace_size="2Gi", tmp_size="64Mi")
    container = _container(pod)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    assert mounts == {"/workspace": "workspace", "/tmp": "tmp"}
    volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
    assert volumes["workspace"]["emptyDir"] == {"sizeLimit": "2Gi", "medium": "Memory"}
    assert volumes["tmp"]["emptyDir"] == {"sizeLimit": "64Mi", "medium": "Memory"}
    assert container["workingDir"] == "/workspace"
    on_disk = {volume["name"]: volume for volume in _pod(memory_backed=False)["spec"]["volumes"]}
    assert on_disk["workspace"]["emptyDir"] == {"sizeLimit": "1Gi"}


def test_memory_backed_volumes_count_in_the_memory_limit() -> None:
    resources = _container(_pod(memory_limit="512Mi", workspace_size="1Gi", tmp_size="256Mi"))["resources"]
    assert resources["limits"]["memory"] == str((512 + 1024 + 256) << 20)
    assert resources["limits"]["cpu"] == "1"
    assert resources["requests"] == {"cpu": "100m", "memory": "128Mi"}
    on_disk = _container(_pod(memory_limit="512Mi", memory_backed=False))["resources"]
    assert on_disk["limits"]["memory"] == str(512 << 20)


def test_a_request_above_its_limit_is_lowered_to_the_limit() -> None:
    """A real API server refuses a pod whose request exceeds its limit ("must be less than or
    equal to cpu limit of 50m"): a small template under the default requests made no sandbox."""
    resources = _container(_pod(cpu_limit="50m", memory_limit="64Mi", memory_backed=False))["resources"]
    assert resources["limits"] == {"cpu": "50m", "memory": str(64 << 20)}
    assert resources["requests"] == {"cpu": "50m", "memory": str(64 << 20)}
    below = _container(_pod(cpu_limit="2", memory_limit="1Gi", memory_backed=False))["resources"]
    assert below["requests"] == {"cpu": "100m", "memory": "128Mi"}


def test_no_service_account_token_no_service_links_no_host_namespaces() -> None:
    spec = _pod()["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["hostNetwork"] is False
    assert spec["hostPID"] is False
    assert spec["hostIPC"] is False
    assert spec["shareProcessNamespace"] is True  # a PID 1 (pause) that reaps orphans
    assert "serviceAccountName" not in spec


def test_short_grace_never_restarts_deadline_from_ttl() -> None:
    spec = _pod(ttl=900)["spec"]
    assert spec["terminationGracePeriodSeconds"] == 1
    assert spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == 900
    assert "activeDeadlineSeconds" not in _pod(ttl=None)["spec"]


def test_labels_record_manager_owner_id_expiry_and_the_callers_labels() -> None:
    config = KubernetesSandboxConfig(owner="tenant-a", ttl=60, labels={"team": "x"})
    pod = pod_manifest(config, "sandbox-abc", labels={"tenant": "t1"}, ttl=120, now=NOW)
    labels = pod["metadata"]["labels"]
    assert labels[LABEL_MANAGED] == "sandboxes"
    assert labels["app.kubernetes.io/component"] == "sandbox"  # what the chart's NetworkPolicy selects
    assert labels[LABEL_OWNER] == "tenant-a"
    assert labels[LABEL_SANDBOX] == "sandbox-abc"
    assert labels[LABEL_EXPIRES] == str(int(NOW + 120))  # the options' ttl beats the template's
    assert labels["team"] == "x"
    assert labels["tenant"] == "t1"
    assert pod["metadata"]["annotations"][ANNOTATION_EXPIRES].startswith("2027-01-15T08:")
    assert pod["spec"]["activeDeadlineSeconds"] == 120


def test_callers_cannot_overwrite_our_labels() -> None:
    config = KubernetesSandboxConfig(owner="mine", labels={LABEL_OWNER: "someone-else"})
    labels = pod_manifest(config, "sandbox-abc", labels={LABEL_EXPIRES: "99999999999"}, now=NOW)["metadata"]["labels"]
    assert labels[LABEL_OWNER] == "mine"
    assert labels[LABEL_EXPIRES] == str(int(NOW + 3600))


def test_template_options_reach_the_pod() -> None:
    pod = _pod(
        namespace="agents",
        image="registry.example/runtime:1",
        image_pull_policy="Never",
        runtime_class_name="gvisor",
        node_selector={"pool": "sandboxes"},
        tolerations=(Toleration(key="sandboxes", operator="Exists", effect="NoSchedule"),),
        env={"A": "1"},
        annotations={"note": "n"},
    )
    container = _container(pod)
    assert pod["metadata"]["namespace"] == "agents"
    assert container["image"] == "registry.example/runtime:1"
    assert container["imagePullPolicy"] == "Never"
    assert container["env"] == [{"name": "A", "value": "1"}]
    assert pod["spec"]["runtimeClassName"] == "gvisor"
    assert pod["spec"]["nodeSelector"] == {"pool": "sandboxes"}
    assert pod["spec"]["tolerations"] == [{"key": "sandboxes", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["metadata"]["annotations"]["note"] == "n"
    assert "runtimeClassName" not in _pod()["spec"]


def test_the_official_client_reads_it_back_as_a_pod() -> None:
    import json

    from kubernetes.client import ApiClient

    pod = ApiClient().deserialize(json.dumps(_pod()), "V1Pod", "application/json")
    context = pod.spec.containers[0].security_context
    assert context.read_only_root_filesystem is True
    assert context.allow_privilege_escalation is False
    assert pod.spec.automount_service_account_token is False


@pytest.mark.parametrize(
    "overrides",
    [
        {"memory_limit": "lots"},
        {"workspace_size": "1g"},  # Docker's spelling, not a Kubernetes quantity
        {"owner": "has spaces"},
        {"workdir": "relative"},
        {"workdir": "/tmp"},
        {"unknown": 1},
    ],
)
def test_bad_config_is_refused(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        KubernetesSandboxConfig(**overrides)
