"""``sandboxes mcp``: the CLI's MCP server on stdio, spawned by the official SDK's client, against
a real service (uvicorn on 127.0.0.1, local sandboxes) named by SANDBOXES_URL and SANDBOXES_API_KEY."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from mcp_episode import create, every_tool, ok, refused, stdio_session
from server.service_harness import KEYS, UNTHROTTLED, Running, running, settings_for
from support import HAS_BWRAP

pytestmark = pytest.mark.needs(HAS_BWRAP, "the local backend needs bubblewrap")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with running(settings_for(tmp_path_factory.mktemp("mcp-stdio"), tenants=UNTHROTTLED)) as svc:
        yield svc


async def test_every_tool_over_stdio(service: Running) -> None:
    async with stdio_session(service.url, KEYS["alice"]) as session:
        await every_tool(session)


async def test_the_sandbox_flag_binds_the_session(service: Running) -> None:
    with service.client("alice") as http:
        created = http.post("/v1/sandboxes", json={"template": "default"}).json()
    try:
        async with stdio_session(service.url, KEYS["alice"], "--sandbox", created["id"]) as session:
            assert (await ok(session, "execute", command="echo flagged")).startswith("flagged\n")
            other = await create(session)  # a sandbox the session makes is its own from then on
            assert f"* {other}" in await ok(session, "list_sandboxes")
            await ok(session, "destroy_sandbox")
    finally:
        with service.client("alice") as http:
            http.delete(f"/v1/sandboxes/{created['id']}")


async def test_a_wrong_key_answers_unauthorized_tool_errors(service: Running) -> None:
    async with stdio_session(service.url, "wrong-key") as session:
        assert (await refused(session, "list_sandboxes")).startswith("error: unauthorized: invalid API key")


def test_without_a_service_it_says_what_it_needs() -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("SANDBOXES_")}
    run = subprocess.run([sys.executable, "-m", "sandboxes.cli", "mcp"], capture_output=True, env=env, timeout=60)
    assert run.returncode == 2
    assert "mcp: needs the service's address: --url URL or SANDBOXES_URL" in run.stderr.decode()


_IMPORTS = """
import json, sys
from sandboxes.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def test_the_cli_imports_the_mcp_sdk_only_for_its_subcommand(service: Running) -> None:
    """The CLI's start is measured: its other subcommands never pay for the SDK."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("SANDBOXES_")}
    for argv in (["--help"], ["--url", service.url, "--api-key", KEYS["alice"], "ls"]):
        run = subprocess.run([sys.executable, "-c", _IMPORTS, *argv], capture_output=True, env=env, timeout=60)
        modules = json.loads(run.stdout.decode().splitlines()[-1])
        assert "mcp" not in modules, argv
        assert "sandboxes" in modules
