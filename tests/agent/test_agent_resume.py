"""SQLite persistence: an interrupted thread resumes in a new process on the same sandbox."""

from __future__ import annotations

from pathlib import Path

from agent_helpers import ask, local_provider, run_phase, thread

from agent import LocalProvider, create_sandbox_agent, lifecycle_of
from agent.persistence import open_sqlite
from agent.testing import ScriptedChatModel, call, say


def test_an_interrupted_thread_resumes_in_a_new_process_on_the_same_sandbox(tmp_path: Path) -> None:
    db, root = tmp_path / "agent.sqlite", tmp_path / "sandboxes"
    first = run_phase("first", str(db), str(root), "thread-1")
    assert first["interrupted"] is True
    assert first["results"] == [f"Wrote 17 characters to {root / first['sandbox_id'] / 'notes.txt'}"]

    second = run_phase("second", str(db), str(root), "thread-1")
    assert second["sandbox_id"] == first["sandbox_id"]
    assert second["interrupted"] is False
    assert second["results"][-1] == "from process one\npid-differs\n[exit code 0]"
    assert second["last"] == "resumed"
    assert [p.name for p in root.iterdir()] == [first["sandbox_id"]]


def test_release_end_ends_the_sandbox_when_the_run_finishes(tmp_path: Path, local_provider: LocalProvider) -> None:
    model = ScriptedChatModel(steps=[say("", call("write_file", file_path="a.txt", content="x")), say("ok")])
    with open_sqlite(tmp_path / "agent.sqlite") as persistence:
        graph = create_sandbox_agent(
            model, sandbox=local_provider, release="end", checkpointer=persistence.checkpointer
        )
        state = graph.invoke(ask("go"), thread())
    assert state.get("sandbox_id") is None
    assert list(local_provider.root.iterdir()) == []
    assert lifecycle_of(graph).live == ()


def test_release_ttl_keeps_the_sandbox_until_released(tmp_path: Path, local_provider: LocalProvider) -> None:
    model = ScriptedChatModel(steps=[say("ok"), say("again")])
    with open_sqlite(tmp_path / "agent.sqlite") as persistence:
        graph = create_sandbox_agent(model, sandbox=local_provider, checkpointer=persistence.checkpointer)
        config = thread()
        state = graph.invoke(ask("go"), config)
        sandbox_id = state["sandbox_id"]
        assert (local_provider.root / sandbox_id).is_dir()
        lifecycle_of(graph).release(sandbox_id)
        assert not (local_provider.root / sandbox_id).exists()


__all__ = ["local_provider"]  # the fixture, used by name
