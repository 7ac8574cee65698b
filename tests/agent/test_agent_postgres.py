"""PostgreSQL persistence against a real server: a thread resumed in a new process, memories
shared between threads and connections."""

from __future__ import annotations

from pathlib import Path

from agent_helpers import ask, local_provider, run_phase, thread, tool_results
from postgres_server import postgres_dsn

from agent import ProviderAdapter, create_sandbox_agent
from agent.persistence import open_postgres
from agent.testing import ScriptedChatModel, call, say


def test_an_interrupted_thread_resumes_in_a_new_process_from_postgres(postgres_dsn: str, tmp_path: Path) -> None:
    root = tmp_path / "sandboxes"
    first = run_phase("first", postgres_dsn, str(root), "pg-thread")
    assert first["interrupted"] is True
    second = run_phase("second", postgres_dsn, str(root), "pg-thread")
    assert second["sandbox_id"] == first["sandbox_id"]
    assert second["results"][-1] == "from process one\npid-differs\n[exit code 0]"
    assert second["last"] == "resumed"


def test_memories_in_postgres_are_shared_across_threads_and_connections(
    postgres_dsn: str, local_provider: ProviderAdapter
) -> None:
    write = call("write_file", file_path="/memories/team.md", content="deploys on friday: no\n")
    read = call("read_file", file_path="/memories/team.md")
    with open_postgres(postgres_dsn) as persistence:
        writer = create_sandbox_agent(
            ScriptedChatModel(steps=[say("", write), say("ok")]),
            sandbox=local_provider,
            checkpointer=persistence.checkpointer,
            store=persistence.store,
        )
        writer.invoke(ask("remember"), thread(user="team"))
    with open_postgres(postgres_dsn) as persistence:
        reader = create_sandbox_agent(
            ScriptedChatModel(steps=[say("", read), say("ok")]),
            sandbox=local_provider,
            checkpointer=persistence.checkpointer,
            store=persistence.store,
        )
        state = reader.invoke(ask("recall"), thread(user="team"))
    assert tool_results(state)[read["id"]] == "     1\tdeploys on friday: no"


__all__ = ["local_provider", "postgres_dsn"]
