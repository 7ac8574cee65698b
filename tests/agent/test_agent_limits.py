"""langchain's limit and fallback middleware in our stack trip as configured."""

from __future__ import annotations

import pytest
from agent_helpers import ask, local_provider, thread, tool_results
from langchain.agents.middleware import (
    ClearToolUsesEdit,
    ContextEditingMiddleware,
    ModelCallLimitMiddleware,
    ModelFallbackMiddleware,
    SummarizationMiddleware,
    ToolCallLimitMiddleware,
    ToolRetryMiddleware,
)
from langchain.agents.middleware.model_call_limit import ModelCallLimitExceededError
from langchain_core.messages import ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from agent import ProviderAdapter, create_sandbox_agent
from agent.testing import ScriptedChatModel, call, say


def looping_model() -> ScriptedChatModel:
    return ScriptedChatModel(steps=[say("", call("ls"))], repeat_last=True)


def test_model_call_limit_ends_the_run(local_provider: ProviderAdapter) -> None:
    model = looping_model()
    graph = create_sandbox_agent(
        model, sandbox=local_provider, middleware=[ModelCallLimitMiddleware(run_limit=3, exit_behavior="end")]
    )
    state = graph.invoke(ask("loop"))
    assert model.calls == 3
    assert "limit" in str(state["messages"][-1].content).lower()


def test_model_call_limit_can_raise(local_provider: ProviderAdapter) -> None:
    graph = create_sandbox_agent(
        looping_model(),
        sandbox=local_provider,
        middleware=[ModelCallLimitMiddleware(run_limit=2, exit_behavior="error")],
    )
    with pytest.raises(ModelCallLimitExceededError):
        graph.invoke(ask("loop"))


def test_tool_call_limit_stops_calls_past_the_limit(local_provider: ProviderAdapter) -> None:
    calls = [call("execute", command=f"echo {i} >> log.txt") for i in range(4)]
    model = ScriptedChatModel(steps=[say("", *calls), say("ok")])
    graph = create_sandbox_agent(
        model,
        sandbox=local_provider,
        checkpointer=InMemorySaver(),
        middleware=[ToolCallLimitMiddleware(tool_name="execute", run_limit=2, exit_behavior="continue")],
    )
    state = graph.invoke(ask("log"), thread())
    results = tool_results(state)
    assert [results[c["id"]] for c in calls[:2]] == ["[exit code 0]", "[exit code 0]"]
    assert all("limit" in results[c["id"]].lower() for c in calls[2:])
    # The two allowed calls ran (in parallel: any order), the others did not.
    assert sorted((local_provider.root / state["sandbox_id"] / "log.txt").read_text().split()) == ["0", "1"]


def test_model_fallback_takes_over_when_the_first_model_fails(local_provider: ProviderAdapter) -> None:
    broken = ScriptedChatModel(steps=[RuntimeError("provider down")] * 3)
    backup = ScriptedChatModel(steps=[say("", call("write_file", file_path="f.txt", content="x")), say("via backup")])
    graph = create_sandbox_agent(broken, sandbox=local_provider, middleware=[ModelFallbackMiddleware(backup)])
    state = graph.invoke(ask("go"))
    assert state["messages"][-1].content == "via backup"
    assert broken.calls == 2
    assert backup.calls == 2
    assert (local_provider.root / state["sandbox_id"] / "f.txt").read_text() == "x"


def test_tool_retry_retries_a_flaky_user_tool(local_provider: ProviderAdapter) -> None:
    attempts: list[int] = []

    def flaky(n: int) -> str:
        """Fails twice, then answers."""
        attempts.append(n)
        if len(attempts) < 3:
            raise ConnectionError("flaky")
        return f"got {n}"

    use = call("flaky", n=7)
    graph = create_sandbox_agent(
        ScriptedChatModel(steps=[say("", use), say("ok")]),
        sandbox=local_provider,
        tools=[flaky],
        middleware=[ToolRetryMiddleware(max_retries=2, initial_delay=0, jitter=False, retry_on=(ConnectionError,))],
    )
    state = graph.invoke(ask("try"))
    assert tool_results(state)[use["id"]] == "got 7"
    assert attempts == [7, 7, 7]


def test_summarization_compacts_a_long_history(local_provider: ProviderAdapter) -> None:
    steps = [say("", call("execute", command=f"echo {i}")) for i in range(6)] + [say("finished")]
    summarizer = ScriptedChatModel(steps=[say("SUMMARY: six echoes")], repeat_last=True)
    model = ScriptedChatModel(steps=steps)
    graph = create_sandbox_agent(
        model,
        sandbox=local_provider,
        middleware=[SummarizationMiddleware(summarizer, trigger=("messages", 8), keep=("messages", 4))],
    )
    state = graph.invoke(ask("echo six times"))
    assert state["messages"][-1].content == "finished"
    assert summarizer.calls >= 1
    last_request = model.requests[-1]
    assert any("SUMMARY: six echoes" in str(m.content) for m in last_request)
    assert len(last_request) < 1 + 1 + 2 * 6  # system + history: shorter than the full 6 steps


def test_context_editing_clears_old_tool_results_from_the_request(local_provider: ProviderAdapter) -> None:
    steps = [say("", call("execute", command=f"echo result-{i}")) for i in range(4)] + [say("finished")]
    model = ScriptedChatModel(steps=steps)
    graph = create_sandbox_agent(
        model,
        sandbox=local_provider,
        middleware=[ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger=1, keep=1)])],
    )
    state = graph.invoke(ask("echo"))
    sent = " ".join(str(m.content) for m in model.requests[-1])
    assert "result-3" in sent  # the latest result is kept
    assert "result-0" not in sent  # older ones were cleared from what the model saw
    kept = [str(m.content) for m in state["messages"] if isinstance(m, ToolMessage)]
    assert "result-0\n[exit code 0]" in kept  # the thread's own history is untouched


__all__ = ["local_provider"]  # the fixture, used by name
