"""The MCP server on Docker sandboxes, through clients no one here wrote: the official SDK's over
stdio (a spawned ``sandboxes mcp``) and over the service's streamable HTTP ``/mcp``, calling every
tool; and a LangChain agent taking the tools through ``langchain-mcp-adapters`` for a scripted
episode (uvicorn on 127.0.0.1, the Docker backend)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.tools import load_mcp_tools
from mcp_episode import TOOLS, every_tool, http_session, stdio_session
from server.service_harness import KEYS, UNTHROTTLED, Running, running, settings_for
from support import SESSION_OWNER

from agent.testing import ScriptedChatModel, call, say
from sandboxes.docker import DockerTemplate

CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}
"""On every container and volume the service makes, so the session sweep removes leftovers."""


@pytest.fixture(scope="module")
def service(docker_client: Any, runtime_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    template = DockerTemplate(backend="docker", image=runtime_image, cpus=0.5, memory="256m", labels=CLEANUP)
    settings = settings_for(
        tmp_path_factory.mktemp("mcp-docker"),
        owner=f"{SESSION_OWNER}-mcp-{uuid.uuid4().hex[:6]}",
        templates={"default": template},
        tenants=UNTHROTTLED,
        mcp=True,
    )
    with running(settings, docker_client=docker_client) as svc:
        yield svc


async def test_every_tool_over_stdio_on_docker(service: Running) -> None:
    async with stdio_session(service.url, KEYS["alice"]) as session:
        await every_tool(session)


async def test_every_tool_over_http_on_docker(service: Running) -> None:
    async with http_session(f"{service.url}/mcp", KEYS["alice"]) as session:
        await every_tool(session)


async def test_a_langchain_agent_works_in_a_sandbox_through_the_mcp_adapters(service: Running) -> None:
    connection = {
        "transport": "streamable_http",
        "url": f"{service.url}/mcp",
        "headers": {"Authorization": f"Bearer {KEYS['alice']}"},
    }
    client = MultiServerMCPClient({"sandboxes": connection})
    model = ScriptedChatModel(
        steps=[
            say("A sandbox first.", call("create_sandbox", ttl=600)),
            say("", call("write_file", file_path="app.py", content="print(sum(range(10)))\n")),
            say("", call("execute", command="python3 app.py")),
            say("", call("edit_file", file_path="app.py", old_string="range(10)", new_string="range(101)")),
            say("", call("execute", command="python3 app.py"), call("grep", pattern="101")),
            say("", call("read_file", file_path="missing.py")),
            say("", call("destroy_sandbox")),
            say("It printed 45, then 5050."),
        ]
    )
    async with client.session("sandboxes") as session:  # one session: the sandbox it creates stays bound
        tools = await load_mcp_tools(session)
        assert {tool.name for tool in tools} == TOOLS
        agent = create_agent(model, tools)
        state = await agent.ainvoke({"messages": [HumanMessage("Sum 0..10 in Python, then 0..101.")]})
    results = [message for message in state["messages"] if isinstance(message, ToolMessage)]
    texts = [(message.name, message.status, _text(message)) for message in results]
    assert [name for name, _, _ in texts] == [
        "create_sandbox",
        "write_file",
        "execute",
        "edit_file",
        "execute",
        "grep",
        "read_file",
        "destroy_sandbox",
    ]
    assert texts[2][2] == "45\n[exit code 0]"
    assert texts[4][2] == "5050\n[exit code 0]"
    assert texts[5][2] == "/workspace/app.py:1:print(sum(range(101)))"
    assert texts[6][1] == "error"
    assert texts[6][2].startswith("error: file_not_found: ")
    assert all(status == "success" for name, status, _ in texts if name != "read_file")
    assert state["messages"][-1].content == "It printed 45, then 5050."


def _text(message: ToolMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    return "".join(block["text"] for block in message.content if isinstance(block, dict) and "text" in block)
