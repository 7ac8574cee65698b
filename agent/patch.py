"""`PatchToolCallsMiddleware`: every tool call has a result before the model is called again.

A run stopped between the model's answer and its tool results (an interrupt answered by a new
message instead of a resume, a crash, a cancelled stream) leaves an AI message whose tool calls
have no `ToolMessage`. Providers refuse such a history, so the thread could never continue.
This inserts a result saying the call was cancelled right after the message that made it, and
leaves every other message as it was: in the thread's history when a run starts, and in any
model request that would still carry such a call. Both are free per step (no graph node of
their own between model calls), which matters with a checkpointer: each node is a checkpoint.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
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
    """Patches the thread's history when a run starts (``before_agent``: the usual case, a new
    message after an interrupted run), and any model request that would still carry an
    unanswered call (``wrap_model_call``: no graph step of its own, so no cost per step)."""

    priority = 90

    def before_agent(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        patched = patch_tool_calls(state["messages"])
        if patched is None:
            return None
        return {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *patched]}

    @staticmethod
    def _patched(request: ModelRequest[Any]) -> ModelRequest[Any]:
        patched = patch_tool_calls(request.messages)
        return request if patched is None else request.override(messages=patched)

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> ModelResponse[Any]:
        return handler(self._patched(request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        return await handler(self._patched(request))
