"""The MCP Inspector's CLI mode (npm ``@modelcontextprotocol/inspector``, installed by
``.ci/mcp-inspector.sh`` outside the repository) lists and calls every tool of ``sandboxes mcp``,
which it spawns on stdio for a real service (uvicorn on 127.0.0.1, local sandboxes)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from mcp_episode import TOOLS, script
from server.service_harness import KEYS, UNTHROTTLED, Running, running, settings_for
from support import HAS_BWRAP, needs

pytestmark = pytest.mark.needs(HAS_BWRAP, "the local backend needs bubblewrap")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def inspector() -> str:
    """The ``mcp-inspector`` command, installed (with npm, if missing) when this session needs it."""
    run = subprocess.run(["bash", str(REPO / ".ci" / "mcp-inspector.sh")], capture_output=True, text=True, timeout=600)
    needs(run.returncode == 0, f"the MCP Inspector could not be installed: {run.stderr[-2000:]}")
    return run.stdout.strip()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with running(settings_for(tmp_path_factory.mktemp("mcp-inspector"), tenants=UNTHROTTLED)) as svc:
        yield svc


class Inspector:
    """``mcp-inspector --cli`` spawning ``sandboxes mcp`` for the service, one call a run."""

    def __init__(self, command: str, url: str) -> None:
        self.command = command
        self.url = url

    def __call__(self, method: str, *options: str) -> Any:
        env = {name: value for name, value in os.environ.items() if not name.startswith("SANDBOXES_")}
        argv = [self.command, "--cli", "-e", f"SANDBOXES_URL={self.url}", "-e", f"SANDBOXES_API_KEY={KEYS['alice']}"]
        argv += [*script(), "mcp", "--method", method, *options]
        run = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        assert run.returncode == 0, (method, options, run.stdout, run.stderr)
        return json.loads(run.stdout)

    def call(self, tool: str, **arguments: Any) -> str:
        """The text of a tool call that must succeed."""
        pairs = [f"{key}={json.dumps(value) if isinstance(value, dict) else value}" for key, value in arguments.items()]
        options = ["--tool-name", tool, *(part for pair in pairs for part in ("--tool-arg", pair))]
        answer = self("tools/call", *options)
        assert answer["isError"] is False, (tool, answer)
        return "".join(block["text"] for block in answer["content"])


# Slow: every Inspector run starts node twice and a `sandboxes mcp` (its own session: nothing is
# shared between runs), about 2.5 CPU-seconds each; 20 runs in 5 waves took 78-104 s on a 2-core
# machine with a load average of 9.
@pytest.mark.slow
def test_the_inspector_lists_and_calls_every_tool(inspector: str, service: Running) -> None:
    run = Inspector(inspector, service.url)
    with ThreadPoolExecutor(6) as pool:
        listed = pool.submit(run, "tools/list")
        templates = pool.submit(run, "resources/templates/list")
        created = run.call("create_sandbox", ttl=600)
        sandbox_id = created.split()[1]
        assert {tool["name"] for tool in listed.result()["tools"]} == TOOLS
        assert templates.result()["resourceTemplates"][0]["uriTemplate"] == "sandbox://{sandbox_id}/{path}"
        on = {"sandbox_id": sandbox_id}
        try:
            wrote = pool.submit(run.call, "write_file", file_path="notes.txt", content="alpha\nbeta\n", **on)
            blob = base64.b64encode(b"\x00\xff").decode()
            uploaded = pool.submit(run.call, "upload_file", file_path="bin.dat", content_base64=blob, **on)
            workdir = run.call("execute", command="pwd; echo $GREETING", env={"GREETING": "hi"}, **on).split("\n")[0]
            assert wrote.result() == f"wrote 11 characters to {workdir}/notes.txt"
            assert uploaded.result().endswith(f"sandbox://{sandbox_id}{workdir}/bin.dat")
            waves = {
                "read": pool.submit(run.call, "read_file", file_path="notes.txt", offset=1, limit=1, **on),
                "ls": pool.submit(run.call, "ls", **on),
                "glob": pool.submit(run.call, "glob", pattern="*.dat", **on),
                "grep": pool.submit(run.call, "grep", pattern="beta", **on),
                "list": pool.submit(run.call, "list_sandboxes"),
                "use": pool.submit(run.call, "use_sandbox", sandbox_id=sandbox_id),
                "resource": pool.submit(run, "resources/read", "--uri", f"sandbox://{sandbox_id}{workdir}/notes.txt"),
                "sleeper": pool.submit(run.call, "start_process", command="exec sleep 60", **on),
            }
            found = {name: future.result() for name, future in waves.items()}
            assert found["read"] == "     2\tbeta"
            assert "notes.txt" in found["ls"]
            assert found["glob"].startswith(f"{workdir}/bin.dat")
            assert found["grep"] == f"{workdir}/notes.txt:2:beta"
            assert sandbox_id in found["list"]
            assert sandbox_id in found["use"]
            assert found["resource"]["contents"][0]["text"] == "alpha\nbeta\n"
            process_id = found["sleeper"].split()[1].rstrip(":")
            edited = pool.submit(run.call, "edit_file", file_path="notes.txt", old_string="beta", new_string="B", **on)
            polled = pool.submit(run.call, "poll_process", process_id=process_id, **on)
            assert edited.result() == f"replaced 1 occurrence(s) in {workdir}/notes.txt"
            assert polled.result().startswith(f"process {process_id}: running")
            assert run.call("kill_process", process_id=process_id, **on).startswith(f"process {process_id}: killed")
        finally:
            assert run.call("destroy_sandbox", **on) == f"destroyed {sandbox_id}"
