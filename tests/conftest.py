"""Shared fixtures: a Docker engine (required in CI), and label-based cleanup of everything
a test session creates, since testcontainers' Ryuk reaper cannot be pulled here."""

from __future__ import annotations

import http.client
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Ryuk's image cannot be pulled here; the label sweep below does its job. Set before any test
# module imports testcontainers, which reads it once.
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")

from support import HAS_BWRAP, IN_CI, SESSION_OWNER, needs

from sandboxes.local import LocalSandbox, LocalSandboxConfig, NotIsolatedWarning, _disk

FIXTURES = Path(__file__).parent / "fixtures"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs(ready, reason): a precondition, skipped without it, failed in CI")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs"):
        needs(*mark.args, **mark.kwargs)


@pytest.fixture(scope="session", autouse=True)
def _release_sandbox_disks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Local sandboxes a test left (a service's, kept across its restart) keep their images
    mounted until destroyed; the session gives them back with its temporary tree."""
    yield
    _disk.release_under(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as exc:
        if IN_CI:
            pytest.fail(f"CI needs a Docker engine (bash .ci/docker.sh): {exc}")
        pytest.skip(f"no Docker engine here: {exc}")
    yield client
    _sweep(client, {"io.sandboxes.owner": SESSION_OWNER})
    _sweep(client, {"io.sandboxes.test-session": SESSION_OWNER})


def _sweep(client: Any, labels: dict[str, str]) -> None:
    selector = [f"{key}={value}" for key, value in labels.items()]
    for container in client.containers.list(all=True, filters={"label": selector}):
        container.remove(force=True, v=True)
    for volume in client.volumes.list(filters={"label": selector}):
        volume.remove(force=True)


@pytest.fixture(scope="module")
def no_python_image(docker_client: Any) -> Iterator[str]:
    """An image without python3: no exec helper can start, so every command takes a transport's
    fallback (one exec per command)."""
    from testcontainers.core.image import DockerImage

    with DockerImage(path=FIXTURES / "no-python", tag="sandboxes-test/no-python:latest", clean_up=False) as image:
        yield str(image)


@pytest.fixture
def slow_header_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The HTTP client parses the response headers of an exec (``docker exec``; the fake
    kubelet's bridge, which uses docker-py too) only after the process wrote its first output,
    as on a loaded machine: its buffered reader then reads them together, and whatever reads
    the raw socket under it must start with what the reader holds."""
    begin = http.client.HTTPResponse.begin

    def late_begin(response: http.client.HTTPResponse) -> None:
        time.sleep(0.3)  # the exec starts as the daemon sends its headers: let it print first
        begin(response)

    monkeypatch.setattr(http.client.HTTPResponse, "begin", late_begin)


@pytest.fixture(scope="session")
def runtime_image(docker_client: Any) -> str:
    image = "sandboxes/runtime:latest"
    try:
        docker_client.images.get(image)
    except Exception:
        pytest.fail(f"{image} is missing: build it with `bash images/build.sh`")
    return image


@pytest.fixture
def jail(tmp_path: Path) -> Iterator[LocalSandbox]:
    """A bubblewrap LocalSandbox with its exec helper running: the local home of the helper's tests."""
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
    with LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap")) as sandbox:
        assert sandbox.execute("true").exit_code == 0
        yield sandbox


@pytest.fixture(scope="module")
def unisolated_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSandbox]:
    """A LocalSandbox without bubblewrap (``isolation="none"``), one per test module: its conformance
    suite (test_local.py) and the scripts run in a plain shell (test_local_scripts.py)."""
    root = tmp_path_factory.mktemp("unisolated")
    with (
        pytest.warns(NotIsolatedWarning, match="NOT isolated"),
        LocalSandbox(config=LocalSandboxConfig(root_dir=root, isolation="none")) as sandbox,
    ):
        yield sandbox
