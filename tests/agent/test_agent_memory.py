"""Memory (AGENTS.md) and skills (SKILL.md, progressive disclosure) from the workspace into the prompt."""

from __future__ import annotations

from agent_helpers import ask, local_provider, thread, tool_results
from langchain_core.messages import SystemMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.store.memory import InMemoryStore

from agent import FixedSandbox, ProviderAdapter, create_sandbox_agent
from agent.memory import parse_skill
from agent.testing import ScriptedChatModel, call, say

SKILL = """---
name: release-notes
description: How to write release notes for this project.
---
# Release notes

Group changes by component. BODY-MARKER
"""


def system_text(model: ScriptedChatModel, request: int = 0) -> str:
    message = model.requests[request][0]
    assert isinstance(message, SystemMessage)
    return "".join(block["text"] for block in message.content_blocks if block["type"] == "text")  # type: ignore[typeddict-item]


def test_memory_files_are_in_the_prompt_and_edits_show_next_run(local_provider: ProviderAdapter) -> None:
    store = InMemoryStore()
    sandbox = local_provider.create()
    workdir = local_provider.root / sandbox.id
    (workdir / "AGENTS.md").write_text("# Project\n- use tabs\n")
    remember = call("edit_file", file_path="/memories/AGENTS.md", old_string="likes: tea", new_string="likes: coffee")
    model = ScriptedChatModel(
        steps=[
            say("", call("write_file", file_path="/memories/AGENTS.md", content="likes: tea\n")),
            say("noted"),
            say("", remember),
            say("updated"),
        ]
    )
    graph = create_sandbox_agent(
        model,
        sandbox=FixedSandbox(sandbox),
        memory=[f"{workdir}/AGENTS.md", "/memories/AGENTS.md", "/missing/AGENTS.md"],
        store=store,
        checkpointer=InMemorySaver(),
    )
    graph.invoke(ask("remember I like tea"), thread(user="u1"))
    first = system_text(model)
    assert "<agent_memory>" in first
    assert f"{workdir}/AGENTS.md\n# Project\n- use tabs" in first
    assert "likes: tea" not in first  # written during this run: read at the next one
    state = graph.invoke(ask("actually coffee"), thread(user="u1"))
    assert "/memories/AGENTS.md\nlikes: tea" in system_text(model, 2)
    assert tool_results(state)[remember["id"]].startswith("Replaced 1 occurrence")


def test_skills_list_names_and_descriptions_and_the_body_is_read_on_demand(local_provider: ProviderAdapter) -> None:
    sandbox = local_provider.create()
    workdir = local_provider.root / sandbox.id
    (workdir / "skills" / "release-notes").mkdir(parents=True)
    (workdir / "skills" / "release-notes" / "SKILL.md").write_text(SKILL)
    (workdir / "skills" / "broken").mkdir()
    (workdir / "skills" / "broken" / "SKILL.md").write_text("no front matter")
    skill_path = "/workspace/skills/release-notes/SKILL.md"  # the model sees the sandbox as /workspace
    read = call("read_file", file_path=skill_path)
    model = ScriptedChatModel(steps=[say("", read), say("following it")])
    graph = create_sandbox_agent(model, sandbox=FixedSandbox(sandbox), skills=["/workspace/skills/"])
    state = graph.invoke(ask("write release notes"))
    prompt = system_text(model)
    assert "- **release-notes**: How to write release notes for this project." in prompt
    assert f"-> read `{skill_path}`" in prompt
    assert "BODY-MARKER" not in prompt
    assert "broken" not in prompt
    assert "BODY-MARKER" in tool_results(state)[read["id"]]


def test_parse_skill_front_matter() -> None:
    assert parse_skill(SKILL, "/s/SKILL.md") == {
        "name": "release-notes",
        "description": "How to write release notes for this project.",
        "path": "/s/SKILL.md",
    }
    assert parse_skill("---\nname: [unclosed\n---\n", "/x") is None
    assert parse_skill("---\ndescription: no name\n---\n", "/x") is None
    assert parse_skill("plain", "/x") is None


__all__ = ["local_provider"]  # the fixture, used by name
