"""The FAKE Kubernetes API server as the tests run it: namespaces ``default`` and ``sandboxes``,
its pods' containers labelled for the session's cleanup, and every container it made removed
once it stops."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_apiserver import LABEL, FakeKubernetes
from support import SESSION_OWNER

__all__ = ["fake_kubeconfig_fixture", "fake_template", "running_fake"]


@contextlib.contextmanager
def running_fake(docker_client: Any, **options: Any) -> Iterator[FakeKubernetes]:
    """A started `FakeKubernetes` (``options``: more of its own, such as ``protocols``) with
    namespaces ``default`` and ``sandboxes``; at the end, stopped, and the containers of its pods
    (its instance's label) removed with their volumes, whatever the test left."""
    fake = FakeKubernetes(
        docker_client,
        namespaces=("default", "sandboxes"),
        container_labels={"io.sandboxes.test-session": SESSION_OWNER},
        **options,
    ).start()
    try:
        yield fake
    finally:
        fake.stop()
        for container in docker_client.containers.list(all=True, filters={"label": f"{LABEL}={fake.instance}"}):
            container.remove(force=True, v=True)


def fake_template(kubeconfig: Path, image: str, **extra: Any) -> dict[str, Any]:
    """A Kubernetes template as an operator writes it in the config file, for the fake that
    ``kubeconfig`` names: its pods in ``sandboxes``, running ``image`` as the local engine has
    it (never pulled), with half a CPU and 256 MiB; ``extra``: more of the template's settings."""
    return {
        "backend": "kubernetes",
        "kubeconfig": str(kubeconfig),
        "namespace": "sandboxes",
        "image": image,
        "image_pull_policy": "Never",
        "cpus": 0.5,
        "memory": "256m",
        **extra,
    }


def fake_kubeconfig_fixture() -> Callable[..., Iterator[Path]]:
    """A module-scoped ``fake_kubeconfig`` fixture, for a module outside tests/kubernetes (whose
    conftest has a session's): a kubeconfig file naming a fake of the module's own (namespace
    ``sandboxes``), the fake stopped and its pods' containers removed after the module's tests."""

    @pytest.fixture(scope="module")
    def fake_kubeconfig(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
        with running_fake(docker_client) as fake:
            yield fake.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config", namespace="sandboxes")

    return fake_kubeconfig
