"""A sandbox's ports other than envd's on the E2B envd plane (`sandboxes.server.e2b.ports`): the
unmodified E2B code interpreter SDK, with ``E2B_SANDBOX_URL`` pointed at the service, reaches a
server on port 49999 INSIDE the sandbox (a stand-in for the code interpreter's, on a local
jail) through its own transport; a request without the sandbox's token is refused."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b_code_interpreter import Sandbox as CodeSandbox
from service_harness import KEYS, Running, running, settings_for
from support import HAS_BWRAP, needs

from sandboxes.local import LocalTemplate

JUPYTER_PORT = 49999


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    needs(HAS_BWRAP, "bubblewrap is not installed")
    settings = settings_for(
        tmp_path_factory.mktemp("e2b-ports"), templates={"default": LocalTemplate(default_timeout=30)}
    )
    with running(settings) as svc:
        yield svc


def _opts(service: Running) -> dict[str, Any]:
    return {"api_key": KEYS["alice"], "api_url": f"{service.url}/e2b", "sandbox_url": f"{service.url}/e2b/envd"}


@pytest.fixture(scope="module")
def sandbox(service: Running) -> Iterator[CodeSandbox]:
    created = CodeSandbox.create(template="base", timeout=3600, **_opts(service))  # past the 300 s default
    try:
        app = (Path(__file__).parent / "preview_app.py").read_text()
        created.files.write("app.py", app)
        created.commands.run(f"exec python3 app.py {JUPYTER_PORT}", background=True)
        _wait_listening(service, created)
        yield created
    finally:
        created.kill()


def _port_headers(sandbox: CodeSandbox, port: int = JUPYTER_PORT, **extra: str) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": str(port), **extra}


def _wait_listening(service: Running, sandbox: CodeSandbox) -> None:
    headers = _port_headers(sandbox, **{"X-Access-Token": sandbox._envd_access_token or ""})
    deadline = time.monotonic() + 30
    while (answer := httpx.get(f"{service.url}/e2b/envd/health", headers=headers)).status_code != 200:
        assert answer.status_code == 502, answer.text  # nothing listens yet
        assert time.monotonic() < deadline, "the server on port 49999 never listened"
        time.sleep(0.05)


def test_the_code_interpreter_sdk_reaches_port_49999_through_the_relay(sandbox: CodeSandbox) -> None:
    execution = sandbox.run_code("1+1")
    assert execution.text == "2"
    assert execution.logs.stdout == ["computing\n"]


def test_envds_own_port_is_still_envd(service: Running, sandbox: CodeSandbox) -> None:
    assert sandbox.commands.run("echo envd").stdout == "envd\n"
    assert sandbox.files.read("app.py").startswith('"""A web app')


def test_another_port_needs_the_sandboxes_token(service: Running, sandbox: CodeSandbox) -> None:
    url = f"{service.url}/e2b/envd/health"
    assert httpx.get(url, headers=_port_headers(sandbox)).status_code == 403  # E2B's answer without a token
    forged = _port_headers(sandbox, **{"E2B-Traffic-Access-Token": "x.y"})
    assert httpx.get(url, headers=forged).status_code == 401
    token = {"E2B-Traffic-Access-Token": sandbox._envd_access_token or ""}
    assert httpx.get(url, headers=_port_headers(sandbox, **token)).text == "ok"
    refused = httpx.get(url, headers=_port_headers(sandbox, JUPYTER_PORT - 1, **token))
    assert refused.status_code == 502
    assert "nothing listens" in refused.json()["message"]
