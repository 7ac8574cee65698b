"""E2B's ``network`` options outlive a restart of the service and a hibernate of the sandbox,
over the local jail (its state file) and Docker (the state file the replica keeps beside the
container's labels): the allow-list ``update_network`` set, its ``rules``' headers (injected by
the egress proxy again), ``allow_public_traffic`` and ``mask_request_host`` are served and
reported as before. Every target is a server this test starts on 127.0.0.2 or 127.0.0.3, or in
the sandbox."""

from __future__ import annotations

import logging
import shlex
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import ALL_TRAFFIC, Sandbox
from e2b_harness import CLEANUP, opts
from egress_targets import Target, targets_fixture
from service_harness import Running, running, settings_for
from support import HAS_BWRAP, SESSION_OWNER, needs
from test_e2b_network import APP_PORT, TOKEN, _reached, _serve_in

from sandboxes.docker import DockerTemplate
from sandboxes.local import LocalTemplate
from sandboxes.server.settings import ServiceSettings

_EGRESS: dict[str, Any] = {"egress": True, "egress_open_ranges": ["127.0.0.0/8"]}


targets = targets_fixture()


def _settings(kind: str, request: pytest.FixtureRequest, data_dir: Path) -> tuple[ServiceSettings, Any]:
    docker_client = None
    if kind == "docker":
        docker_client = request.getfixturevalue("docker_client")
        image = request.getfixturevalue("runtime_image")
        template: Any = DockerTemplate(backend="docker", image=image, memory="512m", labels=CLEANUP, **_EGRESS)
    else:
        needs(HAS_BWRAP, "bubblewrap is not installed")
        template = LocalTemplate(default_timeout=60, **_EGRESS)
    owner = f"{SESSION_OWNER}-e2bnet-{uuid.uuid4().hex[:6]}"
    return settings_for(data_dir, owner=owner, templates={"default": template}), docker_client


def _port_headers(service: Running, sandbox_id: str) -> httpx.Response:
    """A request without the sandbox's token to the app on `APP_PORT` in it."""
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(APP_PORT)}
    return httpx.get(f"{service.url}/e2b/envd/headers", headers=headers, timeout=30)


def _listening(sandbox: Sandbox) -> None:
    """Returns once the sandbox's egress proxy takes connections (made again with the sandbox)."""
    port = LocalTemplate().egress_port  # every template's default
    probe = f"import socket, time\nwhile socket.socket().connect_ex(('127.0.0.1', {port})): time.sleep(0.05)"
    sandbox.commands.run(f"timeout 20 python3 -c {shlex.quote(probe)}")


def _assert_served(service: Running, sandbox: Sandbox, targets: tuple[Target, Target], network: Any) -> None:
    """What ``network`` says is what the sandbox is served, and what get_info reports."""
    assert sandbox.get_info().network == network
    _listening(sandbox)
    assert _reached(sandbox, targets[1].url) == "hello from 127.0.0.3"  # update_network's list
    assert _reached(sandbox, targets[0].url) == "hello from 127.0.0.2"
    assert targets[0].seen[-1]["x-test-token"] == TOKEN  # the rule's header, injected
    _serve_in(sandbox)
    answer = _port_headers(service, sandbox.sandbox_id)
    assert answer.status_code == 200, answer.text  # public: no token needed
    seen = {key.lower(): value for key, value in answer.json().items()}
    assert seen["host"] == f"masked.example.com:{APP_PORT}"


@pytest.mark.parametrize("kind", ["docker", "local"])
def test_network_options_outlive_a_restart_and_a_hibernate(
    kind: str,
    request: pytest.FixtureRequest,
    targets: tuple[Target, Target],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    settings, docker_client = _settings(kind, request, tmp_path)
    rules: Any = {"127.0.0.2": [{"transform": {"headers": {"X-Test-Token": TOKEN}}}]}
    created: Any = {"allow_public_traffic": True, "mask_request_host": "masked.example.com:${PORT}"}
    first_list = {"allow_out": ["127.0.0.2"], "deny_out": [ALL_TRAFFIC]}
    with running(settings, docker_client=docker_client) as first:
        sandbox = Sandbox.create(network={**created, **first_list}, **opts(first))
        sandbox.update_network({"allow_out": ["127.0.0.2", "127.0.0.3"], "deny_out": [ALL_TRAFFIC], "rules": rules})
    kept = tmp_path / "state" / f"{sandbox.sandbox_id}.json"  # its state file, secrets in it
    assert kept.stat().st_mode & 0o777 == 0o600
    network = {**created, "allow_out": ["127.0.0.2", "127.0.0.3"], "deny_out": [ALL_TRAFFIC], "rules": rules}
    with running(settings, docker_client=docker_client) as second:  # it ran across the restart
        sandbox = Sandbox.connect(sandbox.sandbox_id, **opts(second))
        _assert_served(second, sandbox, targets, network)
        sandbox.pause(mode="filesystem")  # hibernated: its container or jail released
    with running(settings, docker_client=docker_client) as third:  # hibernated across the restart
        sandbox = Sandbox.connect(sandbox.sandbox_id, **opts(third))  # made again from its files
        try:
            _assert_served(third, sandbox, targets, network)
            sandbox.pause(mode="filesystem")
            sandbox = Sandbox.connect(sandbox.sandbox_id, **opts(third))
            _assert_served(third, sandbox, targets, network)
        finally:
            sandbox.kill()
    assert TOKEN not in caplog.text  # never logged
