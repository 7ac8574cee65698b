"""FilesystemMiddleware's prompt: the workdir line is looked up once per sandbox, not per model call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain.agents.middleware import ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langgraph.store.base import BaseStore

from agent.testing import ScriptedChatModel
from agent.tools import FilesystemMiddleware
from agent.workspace import Workspace
from sandboxes.state import StateBackend


class CountingSource:
    """A workspace source whose workdir names the sandbox, counting how often it is asked."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, state: Mapping[str, Any], store: BaseStore | None) -> Workspace:
        self.calls += 1
        return Workspace(StateBackend(), workdir=f"/work/{state['sandbox_id']}")


def prompt_of(files: FilesystemMiddleware, state: dict[str, Any]) -> str:
    """The system prompt text the model gets from one model call through ``files``."""
    seen: list[SystemMessage] = []

    def handler(request: ModelRequest[Any]) -> ModelResponse[Any]:
        assert request.system_message is not None
        seen.append(request.system_message)
        return ModelResponse(result=[AIMessage(content="ok")])

    messages = [HumanMessage(content="hi")]
    request = ModelRequest(
        model=ScriptedChatModel(steps=[]),
        messages=messages,
        system_message=SystemMessage(content="base"),
        state={"messages": messages, **state},
    )
    files.wrap_model_call(request, handler)
    return "".join(block["text"] for block in seen[0].content_blocks if block["type"] == "text")


def test_the_workdir_is_looked_up_once_per_sandbox() -> None:
    source = CountingSource()
    files = FilesystemMiddleware(source)
    first = prompt_of(files, {"sandbox_id": "a"})
    second = prompt_of(files, {"sandbox_id": "a"})
    assert source.calls == 1
    assert first == second
    assert "Your working directory is /work/a;" in first


def test_another_sandbox_gets_its_own_workdir() -> None:
    source = CountingSource()
    files = FilesystemMiddleware(source)
    prompt_of(files, {"sandbox_id": "a"})
    other = prompt_of(files, {"sandbox_id": "b"})
    assert source.calls == 2
    assert "Your working directory is /work/b;" in other
    assert "/work/a" not in other


def test_no_sandbox_yet_means_no_workdir_line_and_no_lookup() -> None:
    source = CountingSource()
    text = prompt_of(FilesystemMiddleware(source), {})
    assert source.calls == 0
    assert "Your working directory" not in text
    assert text.startswith("base")
