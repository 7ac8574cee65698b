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
from chart_support import VERSION, Render, one
from support import SESSION_OWNER, needs

RUN = uuid.uuid4().hex[:8]
SANDBOX_LABEL = "io.sandboxes.helm-chart-test"
"""On the sandbox containers of this module's service (and the session's cleanup label)."""
CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}
SOCKET = "/var/run/docker.sock"


def _values(tmp: Path) -> Path:
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
        "config": {"owner": f"{SESSION_OWNER}-helm-{RUN}"},
        "tests": {"template": "docker", "timeoutSeconds": 120},
    }
    path = tmp / "values-docker.yaml"
    path.write_text(json.dumps(values))  # JSON is YAML
    return path


class Kubelet:
    """The part of a kubelet these pods need, on Docker: a pod spec's one container, its
    security context, env (values and secretKeyRefs) and volumes (configMaps read-only,
    emptyDirs as fresh world-writable directories group-owned by fsGroup; their sizeLimit is
    not enforced here)."""

    def __init__(self, docker_client: Any, objects: list[dict[str, Any]], workdir: Path) -> None:
        self.docker = docker_client
        self.objects = objects
        self.workdir = workdir

    def _secret(self, name: str, key: str) -> str:
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
                env[item["name"]] = self._secret(ref["name"], ref["key"])
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
            else:
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
    objects = render("-f", str(_values(workdir)))
    kubelet = Kubelet(docker_client, objects, workdir)
    spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    container = kubelet.run(
        spec,
        extra={
            "group_add": [str(socket_gid)],
            "volumes": {SOCKET: {"bind": SOCKET, "mode": "rw"}},
            "ports": {"8080/tcp": ("127.0.0.1", None)},  # loopback only
        },
    )
    try:
        url = _wait_ready(container, spec["containers"][0]["readinessProbe"]["httpGet"]["path"])
        yield kubelet, url
    finally:
        container.remove(force=True)


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
