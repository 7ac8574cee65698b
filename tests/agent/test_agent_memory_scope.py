"""``/memories/`` belongs to the run's user: another user neither lists, reads nor is prompted with it."""

from __future__ import annotations

import uuid
from typing import Any

from agent_helpers import ask, local_provider, tool_results
from langchain_core.messages import SystemMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.store.memory import InMemoryStore

from agent import FixedSandbox, ProviderAdapter, create_sandbox_agent
from agent.identity import RunIdentity, identity_of, per_user_namespace
from agent.testing import ScriptedChatModel, call, say
from agent.workspace import Layout


def run_as(user: str | None = None, **configurable: Any) -> dict[str, Any]:
    values: dict[str, Any] = {"thread_id": uuid.uuid4().hex, **configurable}
    if user is not None:
        values["user_id"] = user
    return {"configurable": values}


def system_text(model: ScriptedChatModel, request: int) -> str:
    message = model.requests[request][0]
    assert isinstance(message, SystemMessage)
    return "".join(block["text"] for block in message.content_blocks if block["type"] == "text")  # type: ignore[typeddict-item]


def test_one_users_memories_are_not_anothers(local_provider: ProviderAdapter) -> None:
    store = InMemoryStore()
    sandbox = FixedSandbox(local_provider.create())  # even one sandbox for everyone
    secret = call("write_file", file_path="/memories/alice-secret.txt", content="ALICE-SECRET\n")
    rules = call("write_file", file_path="/memories/AGENTS.md", content="ALICE-RULES: obey alice\n")
    listing, read = call("ls", path="/memories/"), call("read_file", file_path="/memories/alice-secret.txt")
    again = call("read_file", file_path="/memories/alice-secret.txt")
    model = ScriptedChatModel(
        steps=[
            say("", secret, rules),
            say("noted"),
            say("", listing, read),  # Bob
            say("nothing there"),
            say("", again),  # Alice, in another thread
            say("found it"),
        ]
    )
    graph = create_sandbox_agent(
        model, sandbox=sandbox, memory=["/memories/AGENTS.md"], store=store, checkpointer=InMemorySaver()
    )
    graph.invoke(ask("remember this"), run_as("alice"))
    bob = graph.invoke(ask("what do you know?"), run_as("bob"))
    assert "ALICE-RULES" not in system_text(model, 2)
    assert "alice-secret" not in tool_results(bob)[listing["id"]]
    assert tool_results(bob)[read["id"]].startswith("Error (file_not_found)")
    alice = graph.invoke(ask("what do you know?"), run_as("alice"))
    assert "ALICE-RULES: obey alice" in system_text(model, 4)  # hers, in a new thread
    assert "ALICE-SECRET" in tool_results(alice)[again["id"]]


def test_runs_without_a_user_share_nothing_and_a_fixed_namespace_shares_on_purpose(
    local_provider: ProviderAdapter,
) -> None:
    store = InMemoryStore()
    sandbox = FixedSandbox(local_provider.create())
    note = call("write_file", file_path="/memories/note.txt", content="NOTE\n")
    read = call("read_file", file_path="/memories/note.txt")
    for layout, shared in ((Layout(), False), (Layout(memories_namespace=("team", "memories")), True)):
        model = ScriptedChatModel(steps=[say("", note), say("ok"), say("", read), say("ok")])
        graph = create_sandbox_agent(model, sandbox=sandbox, store=store, layout=layout)
        graph.invoke(ask("write"), run_as())
        other = tool_results(graph.invoke(ask("read"), run_as()))[read["id"]]
        assert ("NOTE" in other) is shared, (layout, other)


def test_a_run_without_user_or_thread_keeps_its_memories_in_its_state(local_provider: ProviderAdapter) -> None:
    store = InMemoryStore()
    note = call("write_file", file_path="/memories/note.txt", content="NOTE\n")
    read = call("read_file", file_path="/memories/note.txt")
    model = ScriptedChatModel(steps=[say("", note), say("", read), say("ok")])
    graph = create_sandbox_agent(model, sandbox=local_provider, store=store)
    state = graph.invoke(ask("write and read"))  # no config at all
    assert tool_results(state)[read["id"]] == "     1\tNOTE"
    assert state["files"]["/memories/note.txt"]["content"] == "NOTE\n"
    assert store.search(()) == []


def test_the_servers_authenticated_user_wins_over_what_the_caller_says() -> None:
    class User:
        identity = "alice@example.com"

    configurable = {"langgraph_auth_user": User(), "user_id": "bob", "assistant_id": "a1", "thread_id": "t"}
    assert identity_of({"configurable": configurable}) == RunIdentity("alice@example.com", "a1", "t")
    assert identity_of({"configurable": {"thread_id": "t"}}, {"user_id": "carol"}).user_id == "carol"
    assert per_user_namespace(RunIdentity("a.b@c", "x")) == (
        "sandboxes-agent",
        "memories",
        "user",
        "a%2Eb%40c",
        "assistant",
        "x",
    )
    assert per_user_namespace(RunIdentity(thread_id="t1")) == ("sandboxes-agent", "memories", "thread", "t1")
    assert per_user_namespace(RunIdentity()) is None


__all__ = ["local_provider"]  # the fixture, used by name
