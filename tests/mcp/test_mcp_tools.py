"""The MCP server's tools through the official SDK's client (in memory) against a real service
(uvicorn on 127.0.0.1, local sandboxes): every tool, the schemas a model reads, long outputs kept
in a file, errors in the protocol's vocabulary, and each session's own sandbox."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.shared.exceptions import McpError
from mcp.shared.memory import create_connected_server_and_client_session
from mcp_episode import TOOLS, create, every_tool, ok, poll_until_ended, refused
from pydantic import AnyUrl
from server.service_harness import KEYS, UNTHROTTLED, Running, running, settings_for
from support import HAS_BWRAP

from sandboxes.client import AsyncSandboxClient
from sandboxes.mcp import OUTPUTS_DIR, FixedAccess, build_server

pytestmark = pytest.mark.needs(HAS_BWRAP, "the local backend needs bubblewrap")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with running(settings_for(tmp_path_factory.mktemp("mcp"), tenants=UNTHROTTLED)) as svc:
        yield svc


@contextlib.asynccontextmanager
async def session_on(
    service: Running, key: str = KEYS["alice"], sandbox_id: str | None = None, **options: Any
) -> AsyncIterator[ClientSession]:
    async with AsyncSandboxClient(service.url, key, retries=1) as client:
        server = build_server(FixedAccess(client, sandbox_id), **options)
        async with create_connected_server_and_client_session(server) as session:
            yield session


async def test_every_tool_on_a_local_sandbox(service: Running) -> None:
    async with session_on(service) as session:
        await every_tool(session)


async def test_every_tool_and_parameter_is_described_and_typed(service: Running) -> None:
    async with session_on(service) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert len(tool.description or "") > 20, tool.name
        assert "ctx" not in tool.inputSchema["properties"], tool.name
        for name, schema in tool.inputSchema["properties"].items():
            assert schema.get("description"), (tool.name, name)
    execute = tools["execute"].inputSchema
    assert execute["required"] == ["command"]
    assert execute["properties"]["timeout"]["anyOf"][0] == {"type": "number", "minimum": 0}
    assert execute["properties"]["env"]["anyOf"][0]["additionalProperties"] == {"type": "string"}
    assert tools["read_file"].inputSchema["properties"]["limit"]["maximum"] == 2000
    assert tools["read_file"].annotations is not None
    assert tools["read_file"].annotations.readOnlyHint


async def test_a_long_output_is_its_head_and_tail_and_kept_whole_in_the_sandbox(service: Running) -> None:
    async with session_on(service, inline_output_chars=500) as session:
        await create(session)
        answer = await ok(session, "execute", command="seq 1 2000")
        assert answer.startswith("Output too long (8893 characters) to show whole. The whole output is in /"), answer
        kept = answer.split(" is in ", 1)[1].split(":", 1)[0]
        assert f"/{OUTPUTS_DIR}/exec-" in kept
        assert "     1\t1\n" in answer
        assert "\n... [1960 lines left out] ...\n  1981\t1981\n" in answer
        assert answer.endswith("  2000\t2000\n[exit code 0]")
        assert len(answer) < 1500
        assert (await ok(session, "read_file", file_path=kept, offset=1999)).startswith("  2000\t2000")
        counted = await ok(session, "execute", command=f"wc -l < {kept} && md5sum < {kept} && seq 1 2000 | md5sum")
        lines = counted.splitlines()
        assert lines[0] == "2000", counted
        assert lines[1] == lines[2], counted
        await ok(session, "destroy_sandbox")


async def test_errors_are_tool_errors_in_the_protocols_vocabulary(service: Running) -> None:
    async with session_on(service) as session:
        assert (await refused(session, "ls")).startswith("error: invalid_argument: no sandbox: ")
        assert (await refused(session, "use_sandbox", sandbox_id="nope")).startswith("error: not_found: ")
        sandbox_id = await create(session)
        assert (await refused(session, "read_file", file_path="missing.txt")).startswith("error: file_not_found: ")
        await ok(session, "write_file", file_path="a.txt", content="x\n")
        edit = await refused(session, "edit_file", file_path="a.txt", old_string="y", new_string="z")
        assert edit.startswith("error: string_not_found: "), edit
        assert "offset" in await refused(session, "read_file", file_path="a.txt", offset=-1)
        assert "template" in await refused(session, "create_sandbox", template=["not", "a", "string"])
        timed_out = await refused(session, "execute", command="echo started; sleep 30", timeout=0.5)
        assert timed_out.startswith("error: timeout: "), timed_out
        assert "started" in timed_out
        bad = await refused(session, "upload_file", file_path="b", content_base64="!!")
        assert bad.startswith("error: invalid_argument: content_base64 is not base64"), bad
        with pytest.raises(McpError, match="file_not_found"):
            await session.read_resource(AnyUrl(f"sandbox://{sandbox_id}/no/such/file"))
        assert (await refused(session, "poll_process", process_id="nope")).startswith("error: not_found: ")
        await ok(session, "destroy_sandbox")
        assert (await refused(session, "destroy_sandbox", sandbox_id=sandbox_id)).startswith("error: not_found: ")


async def test_each_session_has_its_own_sandbox(service: Running) -> None:
    async with session_on(service) as first, session_on(service) as second:
        one, two = await create(first), await create(second)
        await ok(first, "write_file", file_path="who", content="first")
        await ok(second, "write_file", file_path="who", content="second")
        assert (await ok(first, "read_file", file_path="who")).endswith("\tfirst")
        assert (await ok(second, "read_file", file_path="who")).endswith("\tsecond")
        assert f"* {one}" in await ok(first, "list_sandboxes")
        assert f"* {two}" in await ok(second, "list_sandboxes")
        await ok(first, "destroy_sandbox")
        await ok(second, "destroy_sandbox")


async def test_a_session_started_on_a_sandbox_needs_no_id(service: Running) -> None:
    async with session_on(service) as session:
        sandbox_id = await create(session, bind=False)
        assert (await refused(session, "execute", command="true")).startswith("error: invalid_argument: ")
        async with session_on(service, sandbox_id=sandbox_id) as bound:
            assert (await ok(bound, "execute", command="echo bound")).startswith("bound\n")
            assert f"* {sandbox_id}" in await ok(bound, "list_sandboxes")
        async with session_on(service, key=KEYS["bob"], sandbox_id=sandbox_id) as stranger:
            assert (await refused(stranger, "execute", command="true")).startswith("error: not_found: ")
        await ok(session, "destroy_sandbox", sandbox_id=sandbox_id)


async def test_a_wrong_key_is_unauthorized(service: Running, tmp_path: Path) -> None:
    async with session_on(service, key="not-a-key") as session:
        assert (await refused(session, "list_sandboxes")).startswith("error: unauthorized: ")


async def test_answers_are_bounded_and_say_how_to_go_on(service: Running) -> None:
    """A page of long lines, a search with many, and a long line in an output are cut at a whole
    line (a line at its bound), and say how to ask for the rest."""
    async with session_on(service, inline_output_chars=500) as session:
        await create(session)
        made = "for i in $(seq 1 300); do printf '%01000d\\n' $i; done > big.txt"
        assert await ok(session, "execute", command=made) == "(no output)\n[exit code 0]"
        page = await ok(session, "read_file", file_path="big.txt")
        assert len(page) < 100_200
        note = page.rsplit("\n", 1)[1]
        assert note.startswith("[lines 1-99 of 300 (as many as an answer holds); call read_file with offset=99 ")
        assert page.split("\n")[-3].startswith("    99\t" + "0" * 998 + "99")
        following = await ok(session, "read_file", file_path="big.txt", offset=99)
        assert following.startswith("   100\t" + "0" * 997 + "100\n")
        found = await ok(session, "grep", pattern="00")
        assert len(found) < 100_200
        assert found.endswith("\n[more matches exist: narrow the pattern, the path or the glob]")
        line = await ok(session, "execute", command="head -c 300000 /dev/zero | tr '\\0' y")
        assert "     1\t" + "y" * 1000 + "... [line cut: 299000 more characters]" in line
        assert len(line) < 2000
        await ok(session, "destroy_sandbox")


async def test_a_preview_url_opens_a_server_started_in_the_sandbox(service: Running) -> None:
    async with session_on(service) as session:
        sandbox_id = await create(session)
        try:
            await ok(session, "execute", command="mkdir -p site && echo 'made by the agent' > site/index.html")
            await ok(session, "start_process", command="cd site && exec python3 -m http.server 8000 --bind 127.0.0.1")
            link = (await ok(session, "preview_url", port=8000)).split()[0]
            async with httpx.AsyncClient(timeout=10) as browser:  # a person's browser: no key, only the link
                deadline = asyncio.get_running_loop().time() + 30
                while True:  # the server in the sandbox may not listen yet: a readiness probe
                    page = await browser.get(link)
                    if page.status_code == 200 or asyncio.get_running_loop().time() > deadline:
                        break
                    await asyncio.sleep(0.2)
            assert page.status_code == 200, page.text
            assert page.text == "made by the agent\n"
        finally:
            await session.call_tool("destroy_sandbox", {"sandbox_id": sandbox_id})


async def test_a_background_process_answers_its_stdout_then_its_stderr_under_a_line(service: Running) -> None:
    async with session_on(service) as session:
        await create(session)
        started = await ok(session, "start_process", command="echo out; echo err >&2; printf tail")
        process_id = started.split()[1].rstrip(":")
        ended = await poll_until_ended(session, process_id)
        assert ended.splitlines()[1:] == ["out", "tail", "[stderr]", "err"], ended
