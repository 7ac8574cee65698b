"""`TodoListMiddleware`: langchain's ``write_todos``, with its one check made where the tool
runs instead of in a graph node of its own after every model call.

langchain's middleware refuses a model turn that calls ``write_todos`` more than once (each call
replaces the whole list, so parallel calls are ambiguous) from an ``after_model`` hook: a graph
node, hence a checkpoint, between every model call and its tools, in every step of every run.
Here the same refusal is made as the tool node runs each such call (``wrap_tool_call``): every
``write_todos`` call of that turn is answered with langchain's error, the turn's other calls run,
and a step costs no node of its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware import TodoListMiddleware as _LangchainTodos
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

__all__ = ["PARALLEL_TODOS_ERROR", "TodoListMiddleware"]

TOOL = "write_todos"
PARALLEL_TODOS_ERROR = (
    "Error: The `write_todos` tool should never be called multiple times "
    "in parallel. Please call it only once per model invocation to update "
    "the todo list."
)
"""langchain's answer to each ``write_todos`` call of a turn that made more than one."""

Handler = Callable[[ToolCallRequest], ToolMessage | Command[Any]]
AsyncHandler = Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]]


def _refusal(request: ToolCallRequest) -> ToolMessage | None:
    """langchain's error for a ``write_todos`` call made beside another in one model turn."""
    call = request.tool_call
    if call["name"] != TOOL:
        return None
    messages = request.state.get("messages", []) if isinstance(request.state, dict) else []
    turn = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
    if turn is None or sum(1 for c in turn.tool_calls if c["name"] == TOOL) < 2:
        return None
    return ToolMessage(content=PARALLEL_TODOS_ERROR, tool_call_id=call["id"], status="error")


class TodoListMiddleware(_LangchainTodos):
    """langchain's todo list, its parallel-call refusal made as the tools run (no graph node)."""

    after_model = AgentMiddleware.after_model
    aafter_model = AgentMiddleware.aafter_model

    def wrap_tool_call(self, request: ToolCallRequest, handler: Handler) -> ToolMessage | Command[Any]:
        refused = _refusal(request)
        return refused if refused is not None else handler(request)

    async def awrap_tool_call(self, request: ToolCallRequest, handler: AsyncHandler) -> ToolMessage | Command[Any]:
        refused = _refusal(request)
        return refused if refused is not None else await handler(request)
