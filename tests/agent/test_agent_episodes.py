"""Whole episodes on LocalSandbox with a scripted model: tools, routes, errors, eviction."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from agent_helpers import FileEpisode, ask, local_provider, thread, tool_results
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.store.memory import InMemoryStore

from agent import ProviderAdapter, create_sandbox_agent
from agent.testing import ScriptedChatModel, call, say
from sandboxes.base import Call
from sandboxes.local import LocalSandbox
from sandboxes.protocol import ExecuteResponse


def test_file_and_execute_tools_land_in_the_sandbox(local_provider: ProviderAdapter) -> None:
    episode = FileEpisode()
    graph = create_sandbox_agent(episode.model, sandbox=local_provider)
    state = graph.invoke(ask("work"))
    episode.check(graph, state)
    assert "execute" in episode.model.tools


def test_each_thread_gets_its_own_sandbox_and_keeps_it(local_provider: ProviderAdapter) -> None:
    model = ScriptedChatModel(steps=[say("a"), say("b"), say("c")])
    graph = create_sandbox_agent(model, sandbox=local_provider, checkpointer=InMemorySaver())
    one, two = thread(), thread()
    first = graph.invoke(ask("hi"), one)
    second = graph.invoke(ask("hi"), two)
    again = graph.invoke(ask("again"), one)
    assert first["sandbox_id"] != second["sandbox_id"]
    assert again["sandbox_id"] == first["sandbox_id"]
    made = sorted(record.ref for record in local_provider.provider.list())
    assert made == sorted([first["sandbox_id"], second["sandbox_id"]])


def test_scratch_lives_in_the_thread_and_memories_outlive_it(local_provider: ProviderAdapter) -> None:
    store = InMemoryStore()
    write_scratch = call("write_file", file_path="/scratch/plan.md", content="step 1\n")
    write_memory = call("write_file", file_path="/memories/prefs.md", content="likes tabs\n")
    edit_scratch = call("edit_file", file_path="/scratch/plan.md", old_string="1", new_string="2")
    read_scratch = call("read_file", file_path="/scratch/plan.md")
    read_memory_other_thread = call("read_file", file_path="/memories/prefs.md")
    read_scratch_other_thread = call("read_file", file_path="/scratch/plan.md")
    shell_view = call("execute", command="ls /scratch /memories 2>&1; echo rc=$?")
    model = ScriptedChatModel(
        steps=[
            say("", write_scratch, write_memory),
            say("", edit_scratch),
            say("", read_scratch, shell_view),
            say("first done"),
            say("", read_memory_other_thread, read_scratch_other_thread),
            say("second done"),
        ]
    )
    graph = create_sandbox_agent(model, sandbox=local_provider, store=store, checkpointer=InMemorySaver())
    first = graph.invoke(ask("one"), thread(user="u1"))
    results = tool_results(first)
    assert results[read_scratch["id"]] == "     1\tstep 2"
    assert "No such file or directory" in results[shell_view["id"]]
    assert set(first["files"]) == {"/scratch/plan.md"}
    assert first["files"]["/scratch/plan.md"]["content"] == "step 2\n"
    [item] = store.search(("sandboxes-agent", "memories"))
    assert (item.key, item.value["content"]) == ("/prefs.md", "likes tabs\n")

    second = graph.invoke(ask("two"), thread(user="u1"))
    results = tool_results(second)
    assert results[read_memory_other_thread["id"]] == "     1\tlikes tabs"
    assert results[read_scratch_other_thread["id"]] == "Error (file_not_found): File '/scratch/plan.md' not found"
    assert second["sandbox_id"] != first["sandbox_id"]


def test_read_file_pages(local_provider: ProviderAdapter) -> None:
    text = "".join(f"line {i}\n" for i in range(1, 11))
    first_page = call("read_file", file_path="n.txt", offset=0, limit=4)
    last_page = call("read_file", file_path="n.txt", offset=8, limit=4)
    model = ScriptedChatModel(
        steps=[say("", call("write_file", file_path="n.txt", content=text)), say("", first_page, last_page), say("ok")]
    )
    state = create_sandbox_agent(model, sandbox=local_provider).invoke(ask("read"))
    results = tool_results(state)
    assert results[first_page["id"]].splitlines() == [
        "     1\tline 1",
        "     2\tline 2",
        "     3\tline 3",
        "     4\tline 4",
        "[lines 1-4 of 10; read on with offset=4]",
    ]
    assert results[last_page["id"]].splitlines() == ["     9\tline 9", "    10\tline 10"]


def test_a_large_result_is_evicted_to_the_thread_and_readable(local_provider: ProviderAdapter) -> None:
    big = call("execute", command="seq 1 20000")
    expected = "".join(f"{i}\n" for i in range(1, 20001)) + "[exit code 0]"
    read_back = call("read_file", file_path=f"/large_tool_results/{big['id']}", offset=19998, limit=5)
    model = ScriptedChatModel(steps=[say("", big), say("", read_back), say("ok")])
    graph = create_sandbox_agent(model, sandbox=local_provider, large_result_chars=10_000)
    state = graph.invoke(ask("count"))
    results = tool_results(state)
    preview = results[big["id"]]
    assert len(preview) < 5_000
    assert f"saved in full at /large_tool_results/{big['id']}" in preview
    assert preview.split("--- head ---\n")[1].startswith("1\n2\n3\n")
    assert preview.endswith("19999\n20000\n[exit code 0]")
    assert state["files"][f"/large_tool_results/{big['id']}"]["content"] == expected
    assert results[read_back["id"]].splitlines() == [" 19999\t19999", " 20000\t20000", " 20001\t[exit code 0]"]


def test_backend_failures_reach_the_model_as_messages(local_provider: ProviderAdapter) -> None:
    bad_edit = call("edit_file", file_path="x.txt", old_string="absent", new_string="y")
    dup_edit = call("edit_file", file_path="x.txt", old_string="a", new_string="b")
    bad_path = call("write_file", file_path="/scratch/../..//\x00", content="z")
    failing = call("execute", command="echo oops >&2; exit 3")
    endless = call("execute", command="sleep 1000", timeout=0)
    model = ScriptedChatModel(
        steps=[
            say("", call("write_file", file_path="x.txt", content="a a\n")),
            say("", bad_edit, dup_edit, bad_path, failing, endless),
            say("ok"),
        ]
    )
    graph = create_sandbox_agent(model, sandbox=local_provider)
    state = graph.invoke(ask("fail"))
    results = tool_results(state)
    assert results[bad_edit["id"]].startswith("Error (string_not_found): ")
    assert results[dup_edit["id"]].startswith("Error (multiple_occurrences): ")
    assert results[bad_path["id"]].startswith("Error (invalid_path): ")
    assert results[failing["id"]] == "oops\n[exit code 3]"
    assert results[endless["id"]] == "Error (invalid_argument): timeout must be more than 0 and at most 3600 seconds"
    assert all("Traceback" not in text for text in results.values())


def test_an_unreachable_sandbox_is_an_error_message_not_a_crash(tmp_path: Path) -> None:
    class Unreachable(LocalSandbox):
        """Fake: a sandbox whose host went away (every command raises, as a lost connection does)."""

        def execute(self, command: str, **kwargs: Any) -> ExecuteResponse:
            raise ConnectionError("sandbox host went away")

        def _run_native(self, call: Call) -> ExecuteResponse | None:  # the file ops its helper answers
            raise ConnectionError("sandbox host went away")

    ls, run = call("ls"), call("execute", command="true")
    model = ScriptedChatModel(steps=[say("", ls, run), say("ok")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sandbox = Unreachable(tmp_path)
    state = create_sandbox_agent(model, sandbox=sandbox).invoke(ask("list"))
    results = tool_results(state)
    assert results[ls["id"]] == "Error (unavailable): ConnectionError: sandbox host went away"
    assert results[run["id"]] == "Error (unavailable): ConnectionError: sandbox host went away"
    assert state["messages"][-1].content == "ok"


__all__ = ["local_provider"]  # the fixture, used by name
