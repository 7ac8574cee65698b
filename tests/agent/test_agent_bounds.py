"""Every tool result the agent keeps is bounded, whatever the file or the tool answers."""

from __future__ import annotations

from typing import Any

from agent_helpers import ask, local_provider, tool_results
from langchain.tools import ToolRuntime
from langchain_core.messages import ToolMessage
from langchain_core.tools import StructuredTool
from langgraph.types import Command

from agent import FixedSandbox, ProviderAdapter, create_sandbox_agent
from agent.testing import ScriptedChatModel, call, say

LIMIT = 60_000


def test_reads_of_blank_and_binary_files_are_bounded(local_provider: ProviderAdapter) -> None:
    sandbox = local_provider.create()
    workdir = local_provider.root / sandbox.id
    (workdir / "blank.txt").write_text("\n" * 1_000_000)
    (workdir / "blob.bin").write_bytes(bytes(range(256)) * 1_000)
    blank = call("read_file", file_path="blank.txt")
    wide = call("read_file", file_path="blank.txt", offset=10, limit=10_000_000)
    blob = call("read_file", file_path="blob.bin")
    model = ScriptedChatModel(steps=[say("", blank, wide, blob), say("ok")])
    graph = create_sandbox_agent(model, sandbox=FixedSandbox(sandbox), large_result_chars=LIMIT)
    results = tool_results(graph.invoke(ask("read")))
    for call_id in (blank["id"], wide["id"], blob["id"]):
        assert len(results[call_id]) <= LIMIT, (call_id, len(results[call_id]))
    assert results[blank["id"]].splitlines()[0] == "     1\t"
    assert results[blank["id"]].splitlines()[-1].endswith("; read on with offset=2000]")
    assert results[wide["id"]].splitlines()[0] == "    11\t"
    assert results[wide["id"]].splitlines()[-1].endswith("read on with offset=" + _next_of(results[wide["id"]]) + "]")
    assert "[Result of" in results[blob["id"]]


def _next_of(text: str) -> str:
    """The offset after the last numbered line shown."""
    numbered = [line for line in text.splitlines() if line[:6].strip().isdigit()]
    return numbered[-1][:6].strip()


def test_a_tool_answering_a_command_is_bounded_too(local_provider: ProviderAdapter) -> None:
    def shout(runtime: ToolRuntime) -> Command[Any]:
        """Answer a very long message."""
        return Command(update={"messages": [ToolMessage("x" * 500_000, tool_call_id=runtime.tool_call_id or "")]})

    loud = call("shout")
    model = ScriptedChatModel(steps=[say("", loud), say("ok")])
    graph = create_sandbox_agent(
        model, sandbox=local_provider, tools=[StructuredTool.from_function(shout)], large_result_chars=LIMIT
    )
    result = tool_results(graph.invoke(ask("shout")))[loud["id"]]
    assert len(result) <= LIMIT
    assert result.startswith("[Result of 500000 characters cut")


__all__ = ["local_provider"]  # the fixture, used by name
