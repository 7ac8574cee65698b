"""PatchToolCalls: a tool call left without a result gets one before the next model call."""

from __future__ import annotations

from typing import Any

from agent_helpers import ask, local_provider, thread
from langchain.agents.middleware import ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from agent import ProviderAdapter, create_sandbox_agent
from agent.patch import PatchToolCallsMiddleware, patch_tool_calls
from agent.testing import ScriptedChatModel, call, say


def test_patch_inserts_a_result_right_after_the_unanswered_call() -> None:
    answered, dangling = call("ls"), call("execute", command="make")
    messages = [
        HumanMessage("go", id="h1"),
        AIMessage("", tool_calls=[answered, dangling], id="a1"),
        ToolMessage("listing", tool_call_id=answered["id"], id="t1"),
        HumanMessage("never mind", id="h2"),
    ]
    patched = patch_tool_calls(list(messages))
    assert patched is not None
    assert patched[:2] == messages[:2]
    assert isinstance(patched[2], ToolMessage)
    assert patched[2].tool_call_id == dangling["id"]
    assert patched[2].status == "error"
    assert "cancelled" in str(patched[2].content)
    assert patched[3:] == messages[2:]
    assert patch_tool_calls(patched) is None


def test_an_interrupted_run_followed_by_a_new_message_gets_its_calls_patched(local_provider: ProviderAdapter) -> None:
    risky = call("execute", command="rm -rf build")
    model = ScriptedChatModel(steps=[say("", risky), say("understood")])
    graph = create_sandbox_agent(
        model, sandbox=local_provider, interrupt_on={"execute": True}, checkpointer=InMemorySaver()
    )
    config = thread()
    first = graph.invoke(ask("clean up"), config)
    assert "__interrupt__" in first
    # The user does not answer the approval request: they send a new message instead.
    state = graph.invoke(ask("actually, do nothing"), config)
    # The thread's own history was patched (before_agent), not only what the model saw.
    assert [m.tool_call_id for m in state["messages"] if isinstance(m, ToolMessage)] == [risky["id"]]
    second_request = model.requests[1]
    kinds = [type(m).__name__ for m in second_request]
    ai_index = next(i for i, m in enumerate(second_request) if isinstance(m, AIMessage))
    patched = second_request[ai_index + 1]
    assert isinstance(patched, ToolMessage), kinds
    assert patched.tool_call_id == risky["id"]
    assert isinstance(second_request[ai_index + 2], HumanMessage)
    assert "cancelled" in str(patched.content)


def test_a_model_request_with_an_unanswered_call_is_patched_without_touching_the_state() -> None:
    dangling = call("execute", command="make")
    history = [HumanMessage("go", id="h1"), AIMessage("", tool_calls=[dangling], id="a1")]
    request = ModelRequest(model=ScriptedChatModel(steps=[]), messages=list(history), state={"messages": history})
    seen: list[ModelRequest[Any]] = []

    def handler(sent: ModelRequest[Any]) -> ModelResponse[Any]:
        seen.append(sent)
        return ModelResponse(result=[AIMessage("ok")])

    PatchToolCallsMiddleware().wrap_model_call(request, handler)
    [sent] = seen
    assert [type(m).__name__ for m in sent.messages] == ["HumanMessage", "AIMessage", "ToolMessage"]
    assert sent.messages[2].tool_call_id == dangling["id"]  # type: ignore[union-attr]
    assert request.messages == history  # the request it got is unchanged


__all__ = ["local_provider"]  # the fixture, used by name
