"""Shared by the agent tests: running scripted episodes and reading what they left behind."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import ToolMessage

from agent import ProviderAdapter, lifecycle_of
from agent.testing import ScriptedChatModel, call, say
from agent.virtual import VIRTUAL_ROOT
from sandboxes import protocol as p


def thread(thread_id: str | None = None, *, user: str | None = None) -> dict[str, Any]:
    """A run's config: a new thread unless ``thread_id``; ``user`` owns the run's ``/memories/``."""
    configurable = {"thread_id": thread_id or uuid.uuid4().hex}
    if user is not None:
        configurable["user_id"] = user
    return {"configurable": configurable}


def ask(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def tool_results(state: dict[str, Any]) -> dict[str, str]:
    """Tool results by tool call id."""
    return {m.tool_call_id: str(m.content) for m in state["messages"] if isinstance(m, ToolMessage)}


def sandbox_of(graph: Any, state: dict[str, Any]) -> p.SandboxBackendProtocol:
    return lifecycle_of(graph).sandbox(state["sandbox_id"])


def read_text(backend: p.BackendProtocol, path: str) -> str:
    [response] = backend.download_files([path])
    assert response.error is None, response
    assert response.content is not None
    return response.content.decode()


class FileEpisode:
    """Write, edit, execute, grep and glob through the agent; then check the sandbox itself."""

    def __init__(self) -> None:
        self.write_app = call("write_file", file_path="src/app.py", content="def main():\n    return 'TODO: greet'\n")
        self.write_util = call("write_file", file_path="src/util.py", content="x = 1  # TODO\n")
        self.edit = call("edit_file", file_path="src/app.py", old_string="'TODO: greet'", new_string="'hello'")
        self.execute = call("execute", command="wc -l < src/app.py; echo from-sh > out.txt; ls src")
        self.grep = call("grep", pattern="TODO")
        self.glob = call("glob", pattern="**/*.py")
        self.missing = call("read_file", file_path="src/missing.py")
        self.model = ScriptedChatModel(
            steps=[
                say("", self.write_app, self.write_util),
                say("", self.edit),
                say("", self.execute),
                say("", self.grep, self.glob, self.missing),
                say("done"),
            ]
        )

    def check(self, graph: Any, state: dict[str, Any]) -> None:
        sandbox = sandbox_of(graph, state)
        workdir = lifecycle_of(graph).workdir(state["sandbox_id"])
        results = tool_results(state)
        assert results[self.write_app["id"]] == f"Wrote 37 characters to {workdir}/src/app.py"
        assert results[self.edit["id"]] == f"Replaced 1 occurrence(s) in {workdir}/src/app.py"
        assert results[self.execute["id"]] == "2\napp.py\nutil.py\n[exit code 0]"
        assert results[self.grep["id"]] == f"{workdir}/src/util.py:1: x = 1  # TODO"
        assert results[self.glob["id"]].splitlines() == [f"{workdir}/src/app.py", f"{workdir}/src/util.py"]
        assert results[self.missing["id"]] == f"Error (file_not_found): File '{workdir}/src/missing.py' not found"
        # What the agent did is in the sandbox itself, seen without the agent.
        assert read_text(sandbox, f"{workdir}/src/app.py") == "def main():\n    return 'hello'\n"
        assert read_text(sandbox, f"{workdir}/out.txt") == "from-sh\n"
        assert sandbox.execute("cat src/util.py", cwd=workdir).output == "x = 1  # TODO\n"
        assert state["messages"][-1].content == "done"


@pytest.fixture
def local_provider(tmp_path: Path) -> ProviderAdapter:
    """Sandboxes in a temporary directory. (A fixture here, not in a conftest.py: a second
    conftest module would replace the root one that other tests import by name.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NotIsolatedWarning where bwrap is missing
        return LocalSandboxes(tmp_path / "sandboxes")


class LocalSandboxes(ProviderAdapter):
    """`sandboxes.local.LocalProvider`'s sandboxes in directories under ``root``, each seen by
    the model at ``/workspace``, through the agent's one adapter."""

    def __init__(self, root: Path) -> None:
        from sandboxes.local import LocalProvider

        super().__init__(LocalProvider(root), virtual_root=VIRTUAL_ROOT)
        self.root = root.resolve()


WORKER = Path(__file__).with_name("resume_worker.py")
"""Runs one phase of a resumed thread in a fresh process."""


def run_phase(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(WORKER), *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
