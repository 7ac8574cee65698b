"""`PatchToolCallsMiddleware`: every tool call has a result before the model is called again.

A run stopped between the model's answer and its tool results (an interrupt answered by a new
message instead of a resume, a crash, a cancelled stream) leaves an AI message whose tool calls
have no `ToolMessage`. Providers refuse such a history, so the thread could never continue.
Before each model call, this inserts a result saying the call was cancelled right after the
message that made it, and leaves every other message as it was.
"""

from __future__ import annotations

from typing import Any

from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain_core.messages import AIMessage, AnyMessage, RemoveMessage, ToolMessage
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.runtime import Runtime

__all__ = ["PatchToolCallsMiddleware", "patch_tool_calls"]


def cancelled_result(name: str, tool_call_id: str) -> ToolMessage:
    return ToolMessage(
        f"Tool call {name} ({tool_call_id}) was cancelled: the run stopped before it completed.",
        tool_call_id=tool_call_id,
        name=name,
        status="error",
    )


def patch_tool_calls(messages: list[AnyMessage]) -> list[AnyMessage] | None:
    """``messages`` with a cancelled result after each unanswered tool call; ``None`` if none is."""
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    patched: list[AnyMessage] = []
    changed = False
    for message in messages:
        patched.append(message)
        if not isinstance(message, AIMessage):
            continue
        for call in message.tool_calls:
            if call["id"] and call["id"] not in answered:
                patched.append(cancelled_result(call["name"], call["id"]))
                changed = True
    return patched if changed else None


class PatchToolCallsMiddleware(AgentMiddleware[AgentState[Any], Any]):
    priority = 90

    def before_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        patched = patch_tool_calls(state["messages"])
        if patched is None:
            return None
        return {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *patched]}
