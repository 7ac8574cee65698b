"""`agent.todos`: langchain's ``write_todos``, its refusal of parallel calls made as the tools run
(no graph node of its own per step), answering as langchain's own middleware does."""

from __future__ import annotations

import asyncio

from agent_helpers import ask, local_provider, thread
from langchain.agents import create_agent
from langchain.agents.middleware import TodoListMiddleware as LangchainTodos
from langchain_core.messages import ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from agent import ProviderAdapter, create_sandbox_agent
from agent.testing import ScriptedChatModel, call, say
from agent.todos import PARALLEL_TODOS_ERROR, TodoListMiddleware

TODOS = [{"content": "write it", "status": "in_progress"}]


def _parallel_turn() -> list[object]:
    first, second = call("write_todos", todos=TODOS), call("write_todos", todos=[])
    return [say("", first, second, call("ls", path="/")), say("done")]


def _answers(state: dict[str, object]) -> list[tuple[str, str, str]]:
    messages = state["messages"]
    assert isinstance(messages, list)
    return [(m.name or "", m.status, str(m.content)) for m in messages if isinstance(m, ToolMessage)]


def test_a_step_has_no_todo_node_of_its_own(local_provider: ProviderAdapter) -> None:
    graph = create_sandbox_agent(ScriptedChatModel(steps=[]), sandbox=local_provider)
    assert not [node for node in graph.get_graph().nodes if node.startswith("TodoListMiddleware")]


def test_one_write_todos_call_sets_the_list(local_provider: ProviderAdapter) -> None:
    model = ScriptedChatModel(steps=[say("", call("write_todos", todos=TODOS)), say("done")])
    graph = create_sandbox_agent(model, sandbox=local_provider, checkpointer=InMemorySaver())
    state = graph.invoke(ask("plan"), thread())
    assert state["todos"] == TODOS
    assert [status for _, status, _ in _answers(state)] == ["success"]


def test_parallel_write_todos_calls_are_refused_as_langchain_refuses_them(local_provider: ProviderAdapter) -> None:
    ours = create_sandbox_agent(ScriptedChatModel(steps=_parallel_turn()), sandbox=local_provider)
    state = ours.invoke(ask("plan"), thread())
    refused = [(status, content) for name, status, content in _answers(state) if name != "ls"]
    assert refused == [("error", PARALLEL_TODOS_ERROR)] * 2
    assert [status for name, status, _ in _answers(state) if name == "ls"] == ["success"]  # the turn's others ran
    assert "todos" not in state or state["todos"] != TODOS  # no call of that turn took effect
    # langchain's own middleware answers the same calls with the same error.
    theirs = create_agent(ScriptedChatModel(steps=_parallel_turn()), middleware=[LangchainTodos()])
    their_state = theirs.invoke(ask("plan"))
    assert [(s, c) for _, s, c in _answers(their_state)][:2] == [("error", PARALLEL_TODOS_ERROR)] * 2


def test_the_refusal_holds_when_run_asynchronously(local_provider: ProviderAdapter) -> None:
    graph = create_sandbox_agent(ScriptedChatModel(steps=_parallel_turn()), sandbox=local_provider)
    state = asyncio.run(graph.ainvoke(ask("plan"), thread()))
    assert [(s, c) for n, s, c in _answers(state) if n != "ls"] == [("error", PARALLEL_TODOS_ERROR)] * 2


def test_the_middleware_is_langchains() -> None:
    assert issubclass(TodoListMiddleware, LangchainTodos)


__all__ = ["local_provider"]  # the fixture, used by name
