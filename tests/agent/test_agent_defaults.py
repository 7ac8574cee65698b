"""What `create_sandbox_agent` gives without being asked, as deepagents 0.7.32 does: summarization
on, the memory files last in the system prompt (its stable prefix first), and a ``delete`` tool."""

from __future__ import annotations

from typing import Any

from agent_helpers import ask, local_provider, tool_results
from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.messages import BaseMessage, SystemMessage
from langgraph.checkpoint.memory import InMemorySaver

from agent import FixedSandbox, ProviderAdapter, create_sandbox_agent, middleware_of
from agent.testing import ScriptedChatModel, call, say

SUMMARY = "SUMMARY-OF-THE-EARLIER-STEPS"


def _summaries(model: ScriptedChatModel, actions: list[Any]) -> Any:
    """A step for every call: a summary when asked for one (langchain's summary prompt),
    else the next of ``actions``; the model answers both, as the same model does by default."""
    taken = iter(actions)

    def step(messages: list[BaseMessage]) -> Any:
        if any("<messages>" in str(m.content) for m in messages):
            return say(SUMMARY)
        return next(taken)

    return step


def test_summarization_is_on_by_default_and_compacts_the_history(local_provider: ProviderAdapter) -> None:
    """A model whose profile says its context is small: past 85% of it the older history is
    summarized by the same model, and the next request carries the summary, not the history."""
    actions = [say("", call("execute", command=f"echo {i}-" + "x" * 200)) for i in range(8)] + [say("finished")]
    model = ScriptedChatModel(steps=[], repeat_last=True, profile={"max_input_tokens": 1_000})
    model.steps = [_summaries(model, actions)]
    graph = create_sandbox_agent(model, sandbox=local_provider, release="end")
    assert [type(m) for m in middleware_of(graph)].count(SummarizationMiddleware) == 1
    state = graph.invoke(ask("echo eight times"))
    assert state["messages"][-1].content == "finished"
    summarized = [r for r in model.requests if any(SUMMARY in str(m.content) for m in r)]
    assert summarized, "no request carried a summary: the history was never summarized"
    last = model.requests[-1]
    assert any(SUMMARY in str(m.content) for m in last)
    assert "0-xxx" not in " ".join(str(m.content) for m in last)  # the first step is summarized away


def test_summarization_can_be_turned_off_or_replaced(local_provider: ProviderAdapter) -> None:
    model = ScriptedChatModel(steps=[])
    off = create_sandbox_agent(model, sandbox=local_provider, summarization=False)
    assert not [m for m in middleware_of(off) if isinstance(m, SummarizationMiddleware)]
    mine = SummarizationMiddleware(model, trigger=("messages", 50))
    replaced = create_sandbox_agent(model, sandbox=local_provider, middleware=[mine])
    assert [m for m in middleware_of(replaced) if isinstance(m, SummarizationMiddleware)] == [mine]


def _system_text(message: BaseMessage) -> str:
    assert isinstance(message, SystemMessage)
    return "".join(block["text"] for block in message.content_blocks if block["type"] == "text")  # type: ignore[typeddict-item]


def test_memory_is_the_last_section_so_the_prompt_prefix_stays_stable(local_provider: ProviderAdapter) -> None:
    """The memory file changes between runs; everything before it in the system prompt (the
    base prompt, the skills, the tools' instructions) stays byte for byte the same."""
    sandbox = local_provider.create()
    workdir = local_provider.root / sandbox.id
    (workdir / "skills" / "notes").mkdir(parents=True)
    (workdir / "skills" / "notes" / "SKILL.md").write_text("---\nname: notes\ndescription: Keep notes.\n---\nbody\n")
    (workdir / "AGENTS.md").write_text("first memory\n")
    model = ScriptedChatModel(steps=[say("one"), say("two")])
    graph = create_sandbox_agent(
        model,
        sandbox=FixedSandbox(sandbox),
        memory=[f"{workdir}/AGENTS.md"],
        skills=["/workspace/skills/"],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "memory-last"}}
    graph.invoke(ask("hi"), config)
    (workdir / "AGENTS.md").write_text("second memory\n")
    graph.invoke(ask("again"), config)
    first, second = (_system_text(request[0]) for request in model.requests)
    for prompt, memory in ((first, "first memory"), (second, "second memory")):
        assert prompt.index("<agent_memory>") > prompt.index("Keep notes.")  # after the skills
        assert prompt.index("<agent_memory>") > prompt.index("## Files and commands")  # after the tools
        assert memory in prompt[prompt.index("<agent_memory>") :]
    prefix = first[: first.index("<agent_memory>")]
    assert second.startswith(prefix)


def test_delete_removes_a_file_or_a_tree_and_answers_in_the_protocols_words(local_provider: ProviderAdapter) -> None:
    sandbox = local_provider.create()
    workdir = local_provider.root / sandbox.id
    made = sandbox.execute("mkdir -p build/deep && echo object > build/deep/out.o && echo 'keep me' > notes.txt")
    assert made.exit_code == 0, made
    tree, missing = call("delete", file_path="build"), call("delete", file_path="/workspace/nope.txt")
    scratch = call("write_file", file_path="/scratch/a.txt", content="temp")
    gone = call("delete", file_path="/scratch/a.txt")
    after = call("read_file", file_path="/scratch/a.txt")
    steps = [say("", tree, missing), say("", scratch), say("", gone), say("", after), say("ok")]
    model = ScriptedChatModel(steps=steps)
    graph = create_sandbox_agent(model, sandbox=FixedSandbox(sandbox), checkpointer=InMemorySaver())
    state = graph.invoke(ask("clean up"), {"configurable": {"thread_id": "delete"}})
    assert "delete" in model.tools
    results = tool_results(state)
    assert results[tree["id"]] == "Deleted /workspace/build"
    assert not (workdir / "build").exists()
    assert (workdir / "notes.txt").read_text() == "keep me\n"
    assert results[missing["id"]].startswith("Error (file_not_found):")
    assert results[gone["id"]] == "Deleted /scratch/a.txt"
    assert results[after["id"]].startswith("Error (file_not_found):")  # gone from the thread's state too


__all__ = ["local_provider"]  # the fixture, used by name
