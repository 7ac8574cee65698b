"""The chart's rendered pods, run for real: no Kubernetes server can run here, so Docker runs the
rendered Deployment's container as a kubelet would (its image, command, environment from the
rendered ConfigMap and Secret, user, read-only root, emptyDirs as fresh directories, no
capabilities, no privilege escalation) and then the rendered `helm test` pod against it.

One substitution, and only one: the sandboxes come from a `docker` template (the Docker socket
mounted, as images/service documents) instead of the `kubernetes` one, which needs a cluster. So
this checks what the chart owns (the service starts from the chart's config in the chart's
locked-down pod and answers its probes; the helm test script creates a sandbox, runs a command
and deletes it, and fails when it should), not the kubernetes backend."""

from __future__ import annotations

import base64
import json
import os
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from chart_support import FULLNAME, VERSION, Render, one
from support import SESSION_OWNER, needs

RUN = uuid.uuid4().hex[:8]
SANDBOX_LABEL = "io.sandboxes.helm-chart-test"
"""On the sandbox containers of this module's service (and the session's cleanup label)."""
CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}
SOCKET = "/var/run/docker.sock"


def _values(tmp: Path, name: str = "values-docker") -> Path:
    """The values of a service on Docker; each ``name`` its own owner (two services on one
    engine with one owner would reap each other's sandboxes)."""
    values = {
        "replicaCount": 1,
        "templates": {
            "default": None,  # the kubernetes template: it needs a cluster
            "docker": {
                "backend": "docker",
                "image": '{{ include "sandboxes.sandboxImage" . }}',
                "cpus": 0.5,
                "memory": "256m",
                "labels": {**CLEANUP, SANDBOX_LABEL: RUN},
            },
        },
        "config": {"owner": f"{SESSION_OWNER}-helm-{RUN}-{name}"},
        "tests": {"template": "docker", "timeoutSeconds": 120},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(json.dumps(values))  # JSON is YAML
    return path


class Kubelet:
    """The part of a kubelet these pods need, on Docker: a pod spec's one container, its
    security context, env (values and secretKeyRefs) and volumes (configMaps read-only,
    emptyDirs as fresh world-writable directories group-owned by fsGroup, their sizeLimit not
    enforced; a persistentVolumeClaim as one directory per claim, kept from pod to pod, as a
    fresh volume is once the kubelet applied fsGroup: another user's, group fsGroup, 2775)."""

    def __init__(self, docker_client: Any, objects: list[dict[str, Any]], workdir: Path) -> None:
        self.docker = docker_client
        self.objects = objects
        self.workdir = workdir

    def secret(self, name: str, key: str) -> str:
        secret = one(self.objects, "Secret", name)
        if key in secret.get("stringData", {}):
            return str(secret["stringData"][key])
        return base64.b64decode(secret["data"][key]).decode()

    def _env(self, container: dict[str, Any]) -> dict[str, str]:
        env = {}
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = str(item["value"])
            else:
                ref = item["valueFrom"]["secretKeyRef"]
                env[item["name"]] = self.secret(ref["name"], ref["key"])
        return env

    def _config_map_dir(self, name: str) -> str:
        directory = self.workdir / f"configmap-{name}"
        directory.mkdir(exist_ok=True)
        for key, value in one(self.objects, "ConfigMap", name)["data"].items():
            (directory / key).write_text(value)
        directory.chmod(0o755)
        for path in directory.iterdir():
            path.chmod(0o644)
        return str(directory)

    def _empty_dir(self, name: str, fs_group: int) -> str:
        """A fresh directory as a kubelet makes an emptyDir: mode 0777, group fsGroup, setgid.
        (Not a Docker tmpfs: Docker gives one the mode of the image's directory it covers.)"""
        directory = self.workdir / f"emptydir-{name}-{uuid.uuid4().hex[:6]}"
        directory.mkdir()
        os.chown(directory, -1, fs_group)
        directory.chmod(0o2777)
        return str(directory)

    def _claim(self, name: str, fs_group: int) -> str:
        """The claim's volume: made on first use, then the same directory for every pod."""
        directory = self.workdir / f"claim-{name}"
        if not directory.exists():
            directory.mkdir()
            os.chown(directory, -1, fs_group)  # the owner stays this process's, not the service's
            directory.chmod(0o2775)
        return str(directory)

    def run(self, spec: dict[str, Any], *, extra: dict[str, Any], env: dict[str, str] | None = None) -> Any:
        (container,) = spec["containers"]
        pod, context = spec["securityContext"], container["securityContext"]
        assert context["capabilities"]["drop"] == ["ALL"]
        volumes = {volume["name"]: volume for volume in spec["volumes"]}
        binds = {}
        for mount in container["volumeMounts"]:
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                binds[self._config_map_dir(volume["configMap"]["name"])] = {"bind": mount["mountPath"], "mode": "ro"}
            elif "persistentVolumeClaim" in volume:
                claim = self._claim(volume["persistentVolumeClaim"]["claimName"], pod["fsGroup"])
                binds[claim] = {"bind": mount["mountPath"], "mode": "ro" if mount.get("readOnly") else "rw"}
            else:
                assert set(volume) == {"name", "emptyDir"}, volume
                binds[self._empty_dir(mount["name"], pod["fsGroup"])] = {"bind": mount["mountPath"], "mode": "rw"}
        options = {
            "user": f"{context['runAsUser']}:{context['runAsGroup']}",
            "group_add": [str(pod["fsGroup"]), *extra.pop("group_add", [])],
            "read_only": context["readOnlyRootFilesystem"],
            "cap_drop": ["ALL"],
            "security_opt": [] if context["allowPrivilegeEscalation"] else ["no-new-privileges"],
            "environment": {**self._env(container), **(env or {})},
            "volumes": {**binds, **extra.pop("volumes", {})},
            "labels": {**CLEANUP, SANDBOX_LABEL + ".pod": RUN},
            "mem_limit": container["resources"]["limits"]["memory"].replace("Gi", "g").replace("Mi", "m"),
            "detach": True,
        }
        if "command" in container:
            options["entrypoint"] = container["command"]
        return self.docker.containers.run(container["image"], **options, **extra)


@pytest.fixture(scope="module")
def socket_gid(docker_client: Any) -> int:
    try:
        mode = os.stat(SOCKET)
    except OSError:
        needs(False, f"the Docker engine is not at {SOCKET}: the docker template cannot run")
        raise
    return mode.st_gid if stat.S_ISSOCK(mode.st_mode) else -1


@pytest.fixture(scope="module")
def deployed(
    render: Render, docker_client: Any, runtime_image: str, socket_gid: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Kubelet, str]]:
    image = f"sandboxes/service:{VERSION}"
    try:
        docker_client.images.get(image)
    except Exception:
        pytest.fail(f"{image} is missing: build it with `bash images/build.sh service`")
    workdir = tmp_path_factory.mktemp("helm-docker")
    kubelet = Kubelet(docker_client, render("-f", str(_values(workdir))), workdir)
    container, url = _service_pod(kubelet, socket_gid)
    try:
        yield kubelet, url
    finally:
        container.remove(force=True)


def _service_pod(kubelet: Kubelet, socket_gid: int) -> tuple[Any, str]:
    """A pod of the rendered Deployment, running and ready, and its URL."""
    spec = one(kubelet.objects, "Deployment")["spec"]["template"]["spec"]
    container = kubelet.run(
        spec,
        extra={
            "group_add": [str(socket_gid)],
            "volumes": {SOCKET: {"bind": SOCKET, "mode": "rw"}},
            "ports": {"8080/tcp": ("127.0.0.1", None)},  # loopback only
        },
    )
    try:
        return container, _wait_ready(container, spec["containers"][0]["readinessProbe"]["httpGet"]["path"])
    except BaseException:
        container.remove(force=True)
        raise


def _wait_ready(container: Any, path: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        container.reload()
        if container.status == "exited":
            pytest.fail(f"the service exited: {container.logs().decode()[-3000:]}")
        bindings = container.attrs["NetworkSettings"]["Ports"].get("8080/tcp")
        if bindings:
            url = f"http://127.0.0.1:{bindings[0]['HostPort']}"
            try:
                if httpx.get(url + path, timeout=2).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
        if time.monotonic() > deadline:
            pytest.fail(f"the service was not ready in {timeout}s: {container.logs().decode()[-3000:]}")
        time.sleep(0.2)


def _run_helm_test(kubelet: Kubelet, url: str, **env: str) -> tuple[int, str]:
    """The rendered test pod, on the host's network namespace: its URL (the Service's cluster
    name) becomes the service's loopback port."""
    spec = one(kubelet.objects, "Pod")["spec"]
    container = kubelet.run(spec, extra={"network_mode": "host"}, env={"SANDBOXES_URL": url, **env})
    try:
        status = container.wait(timeout=180)
        return int(status["StatusCode"]), container.logs().decode()
    finally:
        container.remove(force=True)


def test_the_service_starts_in_the_rendered_pod_and_answers_its_probes(deployed: tuple[Kubelet, str]) -> None:
    kubelet, url = deployed
    container = one(kubelet.objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert httpx.get(url + container["livenessProbe"]["httpGet"]["path"], timeout=5).json() == {"status": "ok"}
    assert httpx.get(url + container["readinessProbe"]["httpGet"]["path"], timeout=5).json() == {"status": "ready"}
    # the chart's API key Secret and config file are what the service authenticates against
    assert httpx.get(url + "/v1/sandboxes", timeout=5).status_code == 401


def test_the_helm_test_pod_creates_runs_and_deletes_a_sandbox(
    deployed: tuple[Kubelet, str], docker_client: Any
) -> None:
    kubelet, url = deployed
    code, logs = _run_helm_test(kubelet, url)
    assert code == 0, logs
    assert "created sandbox" in logs
    assert "execute: exit 0, output 'hello" in logs
    assert "from uid 1000" in logs  # the runtime image's unprivileged user
    assert logs.rstrip().endswith("PASS")
    assert not docker_client.containers.list(all=True, filters={"label": f"{SANDBOX_LABEL}={RUN}"})  # deleted


def test_the_helm_test_pod_fails_when_the_service_refuses_it(deployed: tuple[Kubelet, str]) -> None:
    kubelet, url = deployed
    code, logs = _run_helm_test(kubelet, url, SANDBOXES_API_KEY="sbx_not-a-key")
    assert code == 1, logs
    assert "FAIL: could not create a sandbox (401" in logs


def test_a_snapshot_outlives_its_pod_on_the_charts_claim(
    render: Render, docker_client: Any, runtime_image: str, socket_gid: int, tmp_path: Path
) -> None:
    """The default values' snapshot store, on a volume as a kubelet gives it (not the service's
    uid's): the service starts on it, and a snapshot taken through one pod is there for the pod
    that replaces it (fresh emptyDirs, the same claim), which makes a sandbox from it. A sandbox
    hibernated there is not (its record was in the old pod's data directory); its workspace's
    snapshot is, as the README says."""
    kubelet = Kubelet(docker_client, render("-f", str(_values(tmp_path, "snapshots"))), tmp_path)
    key = kubelet.secret(f"{FULLNAME}-test-key", "api-key")
    headers = {"Authorization": f"Bearer {key}"}
    first, url = _service_pod(kubelet, socket_gid)
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
            sandbox = _created(client, {"template": "docker", "ttl": 600})
            assert _ran(client, sandbox, "printf kept > kept.txt") == ""
            taken = client.post(f"/v1/sandboxes/{sandbox}/snapshots", json={})
            assert taken.status_code == 201, taken.text
            hibernated = client.post(f"/v1/sandboxes/{sandbox}/pause", json={"mode": "hibernate"})
            assert hibernated.status_code == 200, hibernated.text
            assert hibernated.json()["processes_kept"] is False
    finally:
        first.remove(force=True)

    second, url = _service_pod(kubelet, socket_gid)  # the pod that replaces it
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
            # the hibernated sandbox's record was in the pod's data directory: gone with it; its
            # workspace's snapshot is in the store, the tenant's to make a sandbox from or delete
            assert client.get(f"/v1/sandboxes/{sandbox}").status_code == 404
            listed = {s["id"]: s for s in client.get("/v1/snapshots").json()["snapshots"]}
            assert taken.json()["id"] in listed
            (kept,) = set(listed) - {taken.json()["id"]}
            assert listed[kept]["sandbox_id"] == sandbox
            assert client.delete(f"/v1/snapshots/{kept}").status_code == 204
            restored = _created(client, {"template": "docker", "ttl": 600, "snapshot": taken.json()["id"]})
            try:
                assert _ran(client, restored, "cat kept.txt") == "kept"
            finally:
                assert client.delete(f"/v1/sandboxes/{restored}").status_code == 204
            assert client.delete(f"/v1/snapshots/{taken.json()['id']}").status_code == 204
    finally:
        second.remove(force=True)
    claim = tmp_path / f"claim-{FULLNAME}-snapshots"
    store = claim / "store"  # the config's snapshot_dir: made by the service, its own, 0700
    assert (store.stat().st_uid, stat.S_IMODE(store.stat().st_mode)) == (10001, 0o700)
    assert claim.stat().st_uid != 10001  # the volume's root is not the service's


def _created(client: httpx.Client, body: dict[str, Any]) -> str:
    created = client.post("/v1/sandboxes", json=body)
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def _ran(client: httpx.Client, sandbox: str, command: str) -> str:
    ran = client.post(f"/v1/sandboxes/{sandbox}/execute", json={"command": command, "timeout": 60})
    assert ran.status_code == 200, ran.text
    assert ran.json()["exit_code"] == 0, ran.json()
    return str(ran.json()["output"])
