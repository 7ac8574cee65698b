"""The agent takes any `sandboxes.lifecycle.Provider` through its one adapter: here the TOY
backend of ``tests/toy_backend``, which the agent has never heard of, and it keeps no table of
its own beside the graphs it makes."""

from __future__ import annotations

import ast
from pathlib import Path

from agent_helpers import ask, thread, tool_results
from langgraph.checkpoint.memory import InMemorySaver
from toy_backend import ToyProvider

from agent import ProviderAdapter, create_sandbox_agent, lifecycle_of
from agent.testing import ScriptedChatModel, call, say

AGENT = Path(__file__).parents[2] / "agent"


def test_a_thread_runs_on_any_provider_and_reattaches_by_its_ref(tmp_path: Path) -> None:
    toys = ProviderAdapter(ToyProvider(tmp_path / "toys", env={}, default_timeout=30, output_limit=1 << 20))
    write = call("write_file", file_path="note.txt", content="kept\n")
    run = call("execute", command="cat note.txt; pwd")
    checkpointer, config = InMemorySaver(), thread()
    graph = create_sandbox_agent(
        ScriptedChatModel(steps=[say("", write), say("", run), say("done")]),
        sandbox=toys,
        checkpointer=checkpointer,
    )
    state = graph.invoke(ask("work"), config)
    key = state["sandbox_id"]
    assert Path(key).parent == tmp_path / "toys"  # the toy sandbox's ref: its directory
    assert tool_results(state)[run["id"]] == f"kept\n{key}\n[exit code 0]"
    lifecycle_of(graph).close()  # this "process" lets go; the sandbox lives on

    look = call("execute", command="cat note.txt")
    fresh = create_sandbox_agent(ScriptedChatModel(steps=[say("", look), say("ok")]), sandbox=toys)
    fresh_state = fresh.invoke({**ask("again"), "sandbox_id": key}, thread())
    assert tool_results(fresh_state)[look["id"]] == "kept\n[exit code 0]"
    lifecycle_of(fresh).release(key)
    assert not Path(key).exists()


def _module_tables(tree: ast.Module) -> list[str]:
    """Names bound at module level to an empty mapping or a weak table, to be filled later."""
    found = []
    for node in tree.body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        empty = isinstance(value, ast.Dict) and not value.keys
        called = isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in {
            "dict",
            "defaultdict",
            "WeakKeyDictionary",
            "WeakValueDictionary",
        }
        if empty or called:
            found += [ast.unparse(target) for target in targets]
    return found


def test_the_agent_keeps_no_module_level_tables() -> None:
    tables = {
        path.name: names
        for path in sorted(AGENT.glob("*.py"))
        if (names := _module_tables(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert tables == {}
