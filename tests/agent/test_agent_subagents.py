"""Subagents: own context and tools, the parent's sandbox, several at once."""

from __future__ import annotations

from pathlib import Path

from agent_helpers import ask, local_provider, thread, tool_results
from langchain_core.messages import HumanMessage

from agent import ProviderAdapter, SubAgent, create_sandbox_agent, lifecycle_of
from agent.persistence import open_sqlite
from agent.testing import ScriptedChatModel, call, say

# Each subagent creates its flag, then waits for the other's: both finish only if they run at
# the same time (sequential runs would time out the first wait and fail).
BARRIER = "touch {me}; i=0; while [ ! -e {other} ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; ls {other}"


def test_subagents_run_in_parallel_in_the_parents_sandbox(local_provider: ProviderAdapter) -> None:
    left_model = ScriptedChatModel(
        steps=[say("", call("execute", command=BARRIER.format(me="left.flag", other="right.flag"))), say("left ok")]
    )
    right_model = ScriptedChatModel(
        steps=[say("", call("execute", command=BARRIER.format(me="right.flag", other="left.flag"))), say("right ok")]
    )
    left_task = call("task", description="do the left half", subagent_type="left")
    right_task = call("task", description="do the right half", subagent_type="right")
    check = call("execute", command="ls *.flag")
    main = ScriptedChatModel(steps=[say("", left_task, right_task), say("", check), say("both done")])
    graph = create_sandbox_agent(
        main,
        sandbox=local_provider,
        subagents=[
            SubAgent("left", "the left half", "You do left things.", model=left_model),
            {"name": "right", "description": "the right half", "system_prompt": "Right.", "model": right_model},
        ],
    )
    state = graph.invoke(ask("split the work"))
    results = tool_results(state)
    assert results[left_task["id"]] == "left ok"
    assert results[right_task["id"]] == "right ok"
    assert results[check["id"]] == "left.flag\nright.flag\n[exit code 0]"
    # Each saw the other's flag while it waited: they ran at the same time.
    assert left_model.requests[1][-1].content == "right.flag\n[exit code 0]"
    assert right_model.requests[1][-1].content == "left.flag\n[exit code 0]"
    # Own context: the subagent saw only its task, under its own system prompt.
    first_left = left_model.requests[0]
    assert [m.content for m in first_left if isinstance(m, HumanMessage)] == ["do the left half"]
    assert "You do left things." in str(first_left[0].content)
    # The same sandbox as the parent, and only one.
    assert lifecycle_of(graph).live == (state["sandbox_id"],)


def test_subagent_scratch_changes_come_back_and_unknown_types_are_refused(
    local_provider: ProviderAdapter, tmp_path: Path
) -> None:
    helper = ScriptedChatModel(
        steps=[say("", call("write_file", file_path="/scratch/found.md", content="42")), say("wrote it")]
    )
    task = call("task", description="find it", subagent_type="general-purpose")
    wrong = call("task", description="x", subagent_type="nobody")
    read = call("read_file", file_path="/scratch/found.md")
    main = ScriptedChatModel(steps=[say("", task, wrong), say("", read), say("ok")])
    with open_sqlite(tmp_path / "agent.sqlite") as persistence:  # subagents under a checkpointer too
        graph = create_sandbox_agent(
            main,
            sandbox=local_provider,
            subagents=[SubAgent("general-purpose", "override", "You help.", model=helper)],
            checkpointer=persistence.checkpointer,
        )
        state = graph.invoke(ask("go"), thread())
    results = tool_results(state)
    assert results[task["id"]] == "wrote it"
    assert results[wrong["id"]].startswith("Error (invalid_argument): no subagent 'nobody'")
    assert results[read["id"]] == "     1\t42"


async def test_an_async_episode_with_a_subagent(local_provider: ProviderAdapter) -> None:
    helper = ScriptedChatModel(steps=[say("", call("execute", command="echo from-sub > sub.txt")), say("sub ok")])
    task = call("task", description="write sub.txt", subagent_type="helper")
    show = call("execute", command="cat sub.txt")
    main = ScriptedChatModel(steps=[say("", task), say("", show), say("done")])
    graph = create_sandbox_agent(
        main, sandbox=local_provider, subagents=[SubAgent("helper", "helps", "Help.", model=helper)]
    )
    state = await graph.ainvoke(ask("go"))
    results = tool_results(state)
    assert results[task["id"]] == "sub ok"
    assert results[show["id"]] == "from-sub\n[exit code 0]"


__all__ = ["local_provider"]  # the fixture, used by name
