"""The service with a ``kubernetes`` template (what the Helm chart configures by default):
sandboxes as pods of the fake API server (a FAKE, `fake_apiserver`), through the same provider
adapter as the other backends; a restart adopts the pods the cluster still has, and the
client's protocol answers as every other backend's."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
from fake_cluster import fake_template
from processes_apart import assert_background_streams_apart
from service_harness import (
    KEYS,
    UNTHROTTLED,
    Running,
    assert_an_archive_streams_whole,
    create,
    error_of,
    execute,
    running,
    settings_for,
)
from test_service_archive_bound import assert_pseudo_files_are_archived_as_read

from sandboxes.client import RemoteSandbox, SandboxClient
from sandboxes.kubernetes import KubernetesTemplate
from sandboxes.server.auth import hash_key
from sandboxes.testing import SandboxConformance


def _template(kubeconfig: Path, image: str) -> dict[str, Any]:
    """As an operator writes it in the config file (the chart passes its templates as they are)."""
    return fake_template(kubeconfig, image, default_timeout=30)


def _settings(data_dir: Path, kubeconfig: Path, image: str) -> Any:
    template = KubernetesTemplate.model_validate(_template(kubeconfig, image))
    huge = KubernetesTemplate.model_validate({**_template(kubeconfig, image), "cpus": 4, "cpu_request": "4"})
    return settings_for(data_dir, templates={"default": template, "huge": huge}, tenants=UNTHROTTLED)


@pytest.fixture(scope="module")
def service(fake_kubeconfig: Path, runtime_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with running(_settings(tmp_path_factory.mktemp("k8s"), fake_kubeconfig, runtime_image)) as svc:
        yield svc


@pytest.fixture(scope="module")
def client(service: Running) -> Iterator[httpx.Client]:
    with service.client("alice") as made:
        yield made


def test_the_template_loads_from_the_config_file_format(fake_kubeconfig: Path, tmp_path: Path) -> None:
    settings = settings_for(tmp_path, templates={"pods": _template(fake_kubeconfig, "img:1")})
    template = settings.templates["pods"]
    assert isinstance(template, KubernetesTemplate)
    config = template.sandbox_config(owner="svc", output_limit=1 << 20)
    assert (config.namespace, config.image, config.owner, config.ttl) == ("sandboxes", "img:1", "svc", None)
    assert (config.cpu_limit, config.memory_limit) == ("0.5", str(256 << 20))
    with pytest.raises(ValueError, match="image_pull_policy"):
        KubernetesTemplate.model_validate({**_template(fake_kubeconfig, "img:1"), "image_pull_policy": "Sometimes"})


def test_tenants_must_be_pod_label_values(fake_kubeconfig: Path, tmp_path: Path) -> None:
    """A sandbox's tenant is a pod label, which the service selects by: a tenant that cannot
    be one stops the service at start, not every creation with a 503."""
    keys = {hash_key("key-of-acme-0123456789"): "Acme Corp"}
    with pytest.raises(ValueError, match="tenant 'Acme Corp' cannot be a pod label"):
        settings_for(tmp_path, templates={"default": _template(fake_kubeconfig, "img:1")}, api_keys=keys)
    settings_for(tmp_path, api_keys=keys)  # a local template records its tenant elsewhere


@pytest.mark.parametrize("labels", [{"k": "has space"}, {"k": "-dash"}, {"k": "v" * 64}, {"n" * 45: "v"}], ids=str)
def test_labels_that_cannot_be_pod_labels_are_refused(client: httpx.Client, labels: dict[str, str]) -> None:
    refused = client.post("/v1/sandboxes", json={"labels": labels})
    assert (refused.status_code, error_of(refused)) == (422, "invalid_request")
    assert "for a pod" in refused.json()["message"]


def test_labels_as_long_as_a_pod_takes_are_recorded(client: httpx.Client) -> None:
    labels = {"n" * 44: "v" * 63, "role": "a.b_c-d"}
    sandbox = create(client, labels=labels)
    assert client.get(f"/v1/sandboxes/{sandbox['id']}").json()["labels"] == labels
    assert client.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204


def test_create_execute_delete_is_a_pod(client: httpx.Client, core_v1: Any) -> None:
    sandbox = create(client, env={"GREETING": "hello"})
    assert sandbox["backend"] == "kubernetes"
    assert execute(client, sandbox["id"], 'id -u; echo "$GREETING"')["output"] == "1000\nhello\n"
    pods = core_v1.list_namespaced_pod("sandboxes", label_selector="app.kubernetes.io/component=sandbox").items
    ours = [pod for pod in pods if pod.metadata.labels.get("io.sandboxes.service-id") == sandbox["id"]]
    assert len(ours) == 1
    assert client.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
    names = {pod.metadata.name for pod in core_v1.list_namespaced_pod("sandboxes").items}
    assert ours[0].metadata.name not in names
    assert client.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 404


def test_a_pod_that_cannot_start_says_why_to_the_tenant(client: httpx.Client) -> None:
    """The cluster's reason reaches the tenant who asked (it was a bare 'the kubernetes
    backend failed', the scheduler's words only in the service log), and the quota is freed."""
    refused = client.post("/v1/sandboxes", json={"template": "huge"}, timeout=120)
    assert (refused.status_code, error_of(refused)) == (503, "backend_unavailable")
    assert "could not start the sandbox: Unschedulable" in refused.json()["message"]
    sandbox = create(client)
    assert client.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204


def test_a_service_without_paramiko_makes_pods(client: httpx.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart's service image has no paramiko (the ssh extra): on a real cluster every
    create answered 503 because recording the new pod imported the ssh backend."""
    for name in [name for name in sys.modules if name.split(".")[0] == "paramiko" or name.startswith("sandboxes.ssh")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "paramiko", None)  # `import paramiko` raises ImportError
    sandbox = create(client)
    assert execute(client, sandbox["id"], "echo ok")["output"] == "ok\n"
    assert client.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204


def test_an_archive_bigger_than_any_command_output_streams_whole(client: httpx.Client, service: Running) -> None:
    """The archive streams raw over an exec of its own, not as an `execute` answer: the
    service's output ceiling does not bound it."""
    assert_an_archive_streams_whole(client, service.registry.settings.max_output_bytes + (1 << 20))


def test_a_pseudo_file_is_archived_as_a_read_gives_it(client: httpx.Client) -> None:
    sandbox = create(client)
    try:
        assert_pseudo_files_are_archived_as_read(client, sandbox)
    finally:
        client.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_a_background_process_keeps_stdout_and_stderr_apart(
    client: httpx.Client, service: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    sandbox = create(client)
    try:
        assert_background_streams_apart(service, client, sandbox["id"], capsys)
    finally:
        client.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_a_restarted_service_adopts_the_pods(fake_kubeconfig: Path, runtime_image: str, tmp_path: Path) -> None:
    settings = _settings(tmp_path, fake_kubeconfig, runtime_image)
    with running(settings) as first, first.client("alice") as one:
        sandbox = create(one)
        assert sandbox["workdir"] == "/workspace"
        assert execute(one, sandbox["id"], "echo kept > note")["exit_code"] == 0
    with running(settings) as second, second.client("alice") as two:
        assert execute(two, sandbox["id"], "cat note")["output"] == "kept\n"
        assert two.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204


def test_a_restarted_service_finds_what_an_idempotency_key_made(
    fake_kubeconfig: Path, runtime_image: str, tmp_path: Path
) -> None:
    """The key's digest is a pod label: a restarted service (or another replica) selects by it."""
    settings = _settings(tmp_path, fake_kubeconfig, runtime_image)
    key = {"Idempotency-Key": f"k8s-{tmp_path.name}"}
    with running(settings) as first, first.client("alice") as one:
        made = one.post("/v1/sandboxes", json={}, headers=key)
        assert made.status_code == 201, made.text
    with running(settings) as second, second.client("alice") as two:
        again = two.post("/v1/sandboxes", json={}, headers=key)
        assert (again.status_code, again.json()["id"]) == (201, made.json()["id"]), again.text
        assert again.headers["idempotent-replayed"] == "true"
        other = two.post("/v1/sandboxes", json={"ttl": 60}, headers=key)
        assert (other.status_code, error_of(other)) == (422, "invalid_request")
        assert two.delete(f"/v1/sandboxes/{made.json()['id']}").status_code == 204


@pytest.fixture(scope="module")
def remote(service: Running) -> Iterator[RemoteSandbox]:
    with SandboxClient(service.url, KEYS["alice"]) as sandbox_client, sandbox_client.create("default") as sb:
        yield sb


class TestRemoteSandboxOnPods(SandboxConformance):
    """The client's protocol over a Kubernetes-backed service answers as every other backend."""

    @pytest.fixture
    def backend(self, remote: RemoteSandbox) -> RemoteSandbox:
        return remote

    @pytest.fixture
    def base_dir(self, remote: RemoteSandbox) -> str:
        assert remote.workdir is not None
        return remote.workdir
