"""A local sandbox is ``/workspace`` to the model, as on the other backends: no host path reaches it."""

from __future__ import annotations

import json

import pytest
from agent_helpers import ask, local_provider, tool_results

from agent import ProviderAdapter, create_sandbox_agent
from agent.testing import ScriptedChatModel, call, say
from agent.virtual import VirtualRoot


def test_the_model_sees_workspace_and_never_the_host_path(local_provider: ProviderAdapter) -> None:
    write = call("write_file", file_path="/workspace/src/a.txt", content="alpha\n")
    relative = call("write_file", file_path="b.txt", content="beta /workspace/src\n")
    shell = call("execute", command="pwd; echo $HOME; cat /workspace/src/a.txt; ls /workspace; cd src && pwd")
    searches = [call("grep", pattern="alpha"), call("glob", pattern="*.txt"), call("ls", path="/workspace/src")]
    missing = call("read_file", file_path="/workspace/nope.txt")
    model = ScriptedChatModel(steps=[say("", write, relative), say("", shell, *searches, missing), say("done")])
    graph = create_sandbox_agent(model, sandbox=local_provider)
    state = graph.invoke(ask("go"))
    results = tool_results(state)
    host = str(local_provider.root)
    assert host not in json.dumps([str(m.content) for m in state["messages"]])
    assert host not in json.dumps([str(m.content) for request in model.requests for m in request])
    assert results[write["id"]] == "Wrote 6 characters to /workspace/src/a.txt"
    assert results[relative["id"]] == "Wrote 20 characters to /workspace/b.txt"
    assert results[shell["id"]] == "/workspace\n/workspace\nalpha\nb.txt\nsrc\n/workspace/src\n[exit code 0]"
    assert [results[c["id"]] for c in searches] == [
        "/workspace/src/a.txt:1: alpha",
        "/workspace/b.txt\n/workspace/src/a.txt",
        "/workspace/src/a.txt  (6 bytes)",
    ]
    assert results[missing["id"]] == "Error (file_not_found): File '/workspace/nope.txt' not found"
    # The files are the sandbox's directory on the host, and file content is never rewritten.
    workdir = local_provider.root / state["sandbox_id"]
    assert (workdir / "src" / "a.txt").read_text() == "alpha\n"
    assert (workdir / "b.txt").read_text() == "beta /workspace/src\n"


def test_only_whole_path_words_are_mapped(local_provider: ProviderAdapter) -> None:
    sandbox = local_provider.create()
    assert isinstance(sandbox, VirtualRoot)
    real = sandbox.real
    assert sandbox.inward("/workspace/x") == f"{real}/x"
    assert sandbox.inward("/workspacex/y") == "/workspacex/y"
    assert sandbox.outward(f"{real}x {real}/y {real}") == f"{real}x /workspace/y /workspace"
    assert sandbox.execute("echo /workspacex a/workspace; cd /workspace/ && pwd").output == (
        "/workspacex a/workspace\n/workspace\n"
    )
    with pytest.raises(ValueError, match="plain absolute paths"):
        VirtualRoot(sandbox.sandbox, "/tmp/a b")
    assert not isinstance(ProviderAdapter(local_provider.provider).create(), VirtualRoot)  # no virtual_root


__all__ = ["local_provider"]  # the fixture, used by name
