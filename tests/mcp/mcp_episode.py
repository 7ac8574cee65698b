"""What the MCP tests share: the official SDK's client sessions over stdio (`stdio_session`, a
spawned ``sandboxes mcp``) and streamable HTTP (`http_session`), a tool call's text, and
`every_tool`, one session calling every tool of the server (and reading a file resource) on a
new sandbox, whatever the transport."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import BlobResourceContents, CallToolResult, TextContent, TextResourceContents
from pydantic import AnyUrl

TOOLS = {
    "create_sandbox",
    "list_sandboxes",
    "use_sandbox",
    "destroy_sandbox",
    "execute",
    "start_process",
    "poll_process",
    "kill_process",
    "preview_url",
    "read_file",
    "write_file",
    "edit_file",
    "ls",
    "glob",
    "grep",
    "upload_file",
}


def text_of(result: CallToolResult) -> str:
    assert all(isinstance(block, TextContent) for block in result.content), result
    return "".join(block.text for block in result.content if isinstance(block, TextContent))


async def ok(session: ClientSession, tool: str, **arguments: Any) -> str:
    """The text of a call that must succeed."""
    result = await session.call_tool(tool, arguments)
    assert not result.isError, (tool, text_of(result))
    return text_of(result)


async def refused(session: ClientSession, tool: str, **arguments: Any) -> str:
    """The text of a call that must be a tool error: ``error: <code>: <message>``, no traceback."""
    result = await session.call_tool(tool, arguments)
    text = text_of(result)
    assert result.isError, (tool, text)
    assert "Traceback" not in text, text
    return text


async def create(session: ClientSession, template: str = "default", **arguments: Any) -> str:
    """A new sandbox's id, now the session's sandbox."""
    answer = await ok(session, "create_sandbox", template=template, ttl=600, **arguments)
    assert answer.startswith("created "), answer
    return answer.split()[1]


async def poll_until_ended(session: ClientSession, process_id: str, limit: float = 20.0) -> str:
    deadline = time.monotonic() + limit
    while True:
        answer = await ok(session, "poll_process", process_id=process_id)
        if ": running" not in answer.splitlines()[0]:
            return answer
        assert time.monotonic() < deadline, f"process {process_id} still running after {limit}s: {answer}"


async def every_tool(session: ClientSession, template: str = "default") -> None:
    """Every tool and the file resource, on a sandbox of ``template`` it creates and destroys."""
    listed = await session.list_tools()
    assert {tool.name for tool in listed.tools} == TOOLS
    templates = await session.list_resource_templates()
    assert [t.uriTemplate for t in templates.resourceTemplates] == ["sandbox://{sandbox_id}/{path}"]
    sandbox_id = await create(session, template)
    destroyed = False
    try:
        assert f"* {sandbox_id}" in await ok(session, "list_sandboxes")
        assert sandbox_id in await ok(session, "use_sandbox", sandbox_id=sandbox_id)
        ran = await ok(session, "execute", command="echo $GREETING; pwd", env={"GREETING": "hi"})
        assert ran.startswith("hi\n/"), ran
        assert ran.endswith("\n[exit code 0]"), ran
        workdir = ran.splitlines()[1]
        assert await ok(session, "execute", command="echo err >&2") == "err\n[exit code 0]"
        assert "[exit code 3]" in await ok(session, "execute", command="exit 3", cwd="/", timeout=30)
        await ok(session, "write_file", file_path="notes.txt", content="one\ntwo\nthree\n")
        page = await ok(session, "read_file", file_path="notes.txt", offset=1, limit=1)
        assert page.startswith("     2\ttwo\n"), page
        assert "offset=2" in page
        assert "replaced 1 occurrence" in await ok(
            session, "edit_file", file_path=f"{workdir}/notes.txt", old_string="two", new_string="TWO"
        )
        assert "notes.txt" in await ok(session, "ls")
        assert "notes.txt" in await ok(session, "glob", pattern="*.txt")
        assert await ok(session, "grep", pattern="TWO") == f"{workdir}/notes.txt:2:TWO"
        blob = bytes(range(256))
        uploaded = await ok(session, "upload_file", file_path="bin.dat", content_base64=base64.b64encode(blob).decode())
        uri = uploaded.rsplit(" ", 1)[1]
        assert uri == f"sandbox://{sandbox_id}{workdir}/bin.dat", uploaded
        [contents] = (await session.read_resource(AnyUrl(uri))).contents
        assert isinstance(contents, BlobResourceContents)
        assert base64.b64decode(contents.blob) == blob
        [text] = (await session.read_resource(AnyUrl(f"sandbox://{sandbox_id}{workdir}/notes.txt"))).contents
        assert isinstance(text, TextResourceContents)
        assert text.text == "one\nTWO\nthree\n"
        started = await ok(session, "start_process", command="echo started; exec sleep 60")
        process_id = started.split()[1].rstrip(":")
        killed = await ok(session, "kill_process", process_id=process_id)
        assert killed.startswith(f"process {process_id}: killed"), killed
        link = await ok(session, "preview_url", port=8000, ttl=60)
        assert f"/v1/sandboxes/{sandbox_id}/ports/8000/" in link, link
        assert "preview_token=" in link, link
        finished = await ok(session, "start_process", command="echo finished; exit 4")
        ended = await poll_until_ended(session, finished.split()[1].rstrip(":"))
        assert ended.startswith(f"process {finished.split()[1].rstrip(':')}: exited, exit code 4"), ended
        assert "finished" in ended
        assert await ok(session, "destroy_sandbox") == f"destroyed {sandbox_id}"
        destroyed = True
        assert "no sandbox" in await refused(session, "execute", command="true")
    finally:
        if not destroyed:
            await session.call_tool("destroy_sandbox", {"sandbox_id": sandbox_id})


def script() -> list[str]:
    """The ``sandboxes`` console script (``python -m sandboxes.cli`` without one)."""
    found = shutil.which("sandboxes") or shutil.which("sandboxes", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "sandboxes.cli"]


@contextlib.asynccontextmanager
async def stdio_session(url: str | None, key: str | None, *args: str) -> AsyncIterator[ClientSession]:
    """An SDK client session with ``sandboxes mcp ARGS`` spawned for ``url`` and ``key`` (as
    SANDBOXES_URL and SANDBOXES_API_KEY); what it wrote to stderr is shown when the session fails."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("SANDBOXES_")}
    env.update({"SANDBOXES_URL": url} if url else {}, **({"SANDBOXES_API_KEY": key} if key else {}))
    command, *first = script()
    params = StdioServerParameters(command=command, args=[*first, "mcp", *args], env=env)
    with tempfile.TemporaryFile("w+") as errlog:
        try:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                yield session
        except BaseException:
            errlog.seek(0)
            sys.stderr.write(f"sandboxes mcp's stderr:\n{errlog.read()}")
            raise


@contextlib.asynccontextmanager
async def http_session(url: str, key: str | None, **headers: str) -> AsyncIterator[ClientSession]:
    """An SDK client session over streamable HTTP to ``url`` (the service's ``/mcp``), bearing ``key``."""
    if key:
        headers["Authorization"] = f"Bearer {key}"
    async with (
        httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(60, read=300)) as http,
        streamable_http_client(url, http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session
