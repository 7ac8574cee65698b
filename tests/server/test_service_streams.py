"""A streamed execute through the service and its Python client, on every backend (Local, Docker,
SSH, Kubernetes through the fake API server), one service holding a template of each: stdout
and stderr arrive as separate streams, and a line printed before a pause arrives during it,
not with the exit; the final answer (``execute``'s) still has them merged."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from service_harness import KEYS, UNTHROTTLED, running, settings_for
from ssh_fixtures import start_vm
from support import HAS_BWRAP, SESSION_OWNER, needs

from sandboxes import protocol as p
from sandboxes.client import OutputChunk, RemoteSandbox, SandboxClient

sys.path.append(str(Path(__file__).parent.parent / "kubernetes"))
from fake_cluster import fake_kubeconfig_fixture, fake_template

PAUSE = 2
COMMAND = f"echo out; echo err >&2; sleep {PAUSE}; echo done"
BACKENDS = ("local", "docker", "ssh", "kubernetes")


fake_kubeconfig = fake_kubeconfig_fixture()


@pytest.fixture(scope="module")
def client(
    docker_client: Any, runtime_image: str, fake_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SandboxClient]:
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
    workdir = tmp_path_factory.mktemp("streams")
    vm = start_vm(workdir / "ssh")
    host = vm.config_host(workdir / "ssh-key")
    templates = {
        "local": {"backend": "local", "default_timeout": 30},
        "docker": {
            "backend": "docker",
            "image": runtime_image,
            "cpus": 0.5,
            "memory": "256m",
            "labels": {"io.sandboxes.test-session": SESSION_OWNER},
        },
        "ssh": {"backend": "ssh", "hosts": [host], "workspace_root": f"/tmp/svc-{uuid.uuid4().hex[:8]}"},
        "kubernetes": fake_template(fake_kubeconfig, runtime_image),
    }
    owner = f"{SESSION_OWNER}-streams-{uuid.uuid4().hex[:6]}"
    settings = settings_for(workdir / "service", owner=owner, templates=templates, tenants=UNTHROTTLED)
    try:
        with running(settings, docker_client=docker_client) as service, SandboxClient(service.url, KEYS["alice"]) as c:
            yield c
    finally:
        vm.stop()


@pytest.fixture(scope="module", params=BACKENDS)
def remote(request: pytest.FixtureRequest, client: SandboxClient) -> Iterator[RemoteSandbox]:
    with client.create(request.param) as sandbox:
        assert sandbox.execute("true").exit_code == 0  # its exec helper up
        yield sandbox


def _streamed(remote: RemoteSandbox) -> tuple[list[tuple[float, OutputChunk]], float, p.ExecuteResponse]:
    """The chunks of ``COMMAND``'s stream, each with when it arrived, and when its end did."""
    chunks: list[tuple[float, OutputChunk]] = []
    for item in remote.execute_stream(COMMAND, timeout=30):
        if isinstance(item, p.ExecuteResponse):
            return chunks, time.monotonic(), item
        chunks.append((time.monotonic(), item))
    raise AssertionError(f"the stream ended without its response: {chunks}")


def test_a_streamed_execute_keeps_stdout_and_stderr_apart_and_live(remote: RemoteSandbox) -> None:
    chunks, ended_at, final = _streamed(remote)
    assert (final.exit_code, final.error) == (0, None), final
    by_stream = {name: "".join(chunk for _, chunk in chunks if chunk.stream == name) for name in ("stdout", "stderr")}
    assert by_stream == {"stdout": "out\ndone\n", "stderr": "err\n"}, chunks
    assert all(chunk.stream in ("stdout", "stderr") for _, chunk in chunks), chunks
    first_at = next(at for at, chunk in chunks if "out" in chunk)
    assert ended_at - first_at >= PAUSE / 2, "the line printed before the pause arrived only with the exit"
    assert sorted(final.output.splitlines()) == ["done", "err", "out"]  # the answer: both, merged
    assert final.output.endswith("done\n")
