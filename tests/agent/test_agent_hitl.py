"""Human in the loop (langchain's middleware, innermost): approve, edit and reject, then resume."""

from __future__ import annotations

from pathlib import Path

from agent_helpers import ask, local_provider, thread, tool_results
from langgraph.types import Command

from agent import ProviderAdapter, create_sandbox_agent
from agent.persistence import open_sqlite
from agent.testing import ScriptedChatModel, call, say


def test_hitl_approve_edit_and_reject(tmp_path: Path, local_provider: ProviderAdapter) -> None:
    approve = call("execute", command="echo approved > a.txt")
    edit = call("execute", command="echo as-asked > e.txt")
    reject = call("execute", command="echo rejected > r.txt")
    model = ScriptedChatModel(steps=[say("", approve, edit, reject), say("finished")])
    with open_sqlite(tmp_path / "agent.sqlite") as persistence:
        graph = create_sandbox_agent(
            model, sandbox=local_provider, interrupt_on={"execute": True}, checkpointer=persistence.checkpointer
        )
        config = thread()
        paused = graph.invoke(ask("three commands"), config)
        [interrupt] = paused["__interrupt__"]
        assert [r["args"]["command"] for r in interrupt.value["action_requests"]] == [
            "echo approved > a.txt",
            "echo as-asked > e.txt",
            "echo rejected > r.txt",
        ]
        decisions = [
            {"type": "approve"},
            {"type": "edit", "edited_action": {"name": "execute", "args": {"command": "echo edited > e.txt"}}},
            {"type": "reject", "message": "not that one"},
        ]
        state = graph.invoke(Command(resume={"decisions": decisions}), config)
    results = tool_results(state)
    workdir = local_provider.root / state["sandbox_id"]
    assert results[approve["id"]] == "[exit code 0]"
    assert results[edit["id"]].endswith('echo edited > e.txt"}.\n\nTool response:\n[exit code 0]')
    assert "not that one" in results[reject["id"]]
    assert (workdir / "a.txt").read_text() == "approved\n"
    assert (workdir / "e.txt").read_text() == "edited\n"
    assert not (workdir / "r.txt").exists()
    assert state["messages"][-1].content == "finished"


__all__ = ["local_provider"]  # the fixture, used by name
