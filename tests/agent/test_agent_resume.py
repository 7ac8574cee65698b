"""SQLite persistence: an interrupted thread resumes in a new process on the same sandbox."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agent_helpers import ask, local_provider, run_phase, thread, tool_results

from agent import ProviderAdapter, SandboxGone, create_sandbox_agent, lifecycle_of
from agent.persistence import open_sqlite
from agent.testing import ScriptedChatModel, call, say
from sandboxes.local import LocalProvider


def test_an_interrupted_thread_resumes_in_a_new_process_on_the_same_sandbox(tmp_path: Path) -> None:
    db, root = tmp_path / "agent.sqlite", tmp_path / "sandboxes"
    first = run_phase("first", str(db), str(root), "thread-1")
    assert first["interrupted"] is True
    assert first["results"] == ["Wrote 17 characters to /workspace/notes.txt"]  # the model never sees host paths

    second = run_phase("second", str(db), str(root), "thread-1")
    assert second["sandbox_id"] == first["sandbox_id"]
    assert second["interrupted"] is False
    assert second["results"][-1] == "from process one\npid-differs\n[exit code 0]"
    assert second["last"] == "resumed"
    assert [record.ref for record in LocalProvider(root).list()] == [first["sandbox_id"]]


def test_release_end_ends_the_sandbox_when_the_run_finishes(tmp_path: Path, local_provider: ProviderAdapter) -> None:
    model = ScriptedChatModel(steps=[say("", call("write_file", file_path="a.txt", content="x")), say("ok")])
    with open_sqlite(tmp_path / "agent.sqlite") as persistence:
        graph = create_sandbox_agent(
            model, sandbox=local_provider, release="end", checkpointer=persistence.checkpointer
        )
        state = graph.invoke(ask("go"), thread())
    assert state.get("sandbox_id") is None
    assert local_provider.provider.list() == []
    assert lifecycle_of(graph).live == ()


def test_release_ttl_keeps_the_sandbox_until_released(tmp_path: Path, local_provider: ProviderAdapter) -> None:
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


def _first_run(graph: Any, config: dict[str, Any]) -> str:
    state = graph.invoke(ask("write it"), config)
    return str(state["sandbox_id"])


def test_a_thread_whose_sandbox_is_gone_gets_a_new_one_and_the_model_is_told(
    tmp_path: Path, local_provider: ProviderAdapter
) -> None:
    """The sandbox expired between two runs of a thread: the second run does not fail, it runs
    in a new, empty sandbox, and the model reads that its earlier files are gone."""
    config = thread()
    with open_sqlite(tmp_path / "agent.sqlite") as persistence:
        first = ScriptedChatModel(steps=[say("", call("write_file", file_path="a.txt", content="x")), say("written")])
        graph = create_sandbox_agent(first, sandbox=local_provider, checkpointer=persistence.checkpointer)
        old_id = _first_run(graph, config)
        lifecycle_of(graph).release(old_id)  # what the provider's TTL does while nobody runs the thread

        second = ScriptedChatModel(steps=[say("", call("ls", path=".")), say("starting over")])
        resumed = create_sandbox_agent(second, sandbox=local_provider, checkpointer=persistence.checkpointer)
        state = resumed.invoke(ask("go on"), config)

    assert state["sandbox_id"] not in (None, old_id)
    assert [record.ref for record in local_provider.provider.list()] == [state["sandbox_id"]]
    seen = [str(m.content) for m in second.requests[0]]
    assert any("no longer exists" in text for text in seen), seen
    assert not any(old_id in text for text in seen)  # its key is a host path: the model never sees one
    listing = list(tool_results(state).values())[-1]  # the resumed run's ls, in the new sandbox
    assert listing == "/workspace/. is empty"
    assert state["messages"][-1].content == "starting over"


def test_on_missing_raise_stops_the_run_with_sandbox_gone(tmp_path: Path, local_provider: ProviderAdapter) -> None:
    config = thread()
    with open_sqlite(tmp_path / "agent.sqlite") as persistence:
        graph = create_sandbox_agent(
            ScriptedChatModel(steps=[say("ok")]), sandbox=local_provider, checkpointer=persistence.checkpointer
        )
        old_id = _first_run(graph, config)
        lifecycle_of(graph).release(old_id)
        strict = create_sandbox_agent(
            ScriptedChatModel(steps=[say("never")]),
            sandbox=local_provider,
            checkpointer=persistence.checkpointer,
            on_missing="raise",
        )
        with pytest.raises(SandboxGone, match=old_id):
            strict.invoke(ask("go on"), config)
    assert local_provider.provider.list() == []
