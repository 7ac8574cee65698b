"""The onion: where middleware goes (priority, default order) and the order its hooks run in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent_helpers import ask, local_provider
from langchain.agents.middleware import (
    AgentMiddleware,
    HumanInTheLoopMiddleware,
    ModelRequest,
    ModelResponse,
    SummarizationMiddleware,
)
from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from agent import (
    FilesystemMiddleware,
    MemoryMiddleware,
    PatchToolCallsMiddleware,
    ProviderAdapter,
    SandboxMiddleware,
    SkillsMiddleware,
    SubAgentMiddleware,
    create_sandbox_agent,
    middleware_of,
)
from agent.testing import ScriptedChatModel, call, say
from agent.todos import TodoListMiddleware
from sandboxes.protocol import SandboxBackendProtocol


class Recorder(AgentMiddleware[Any, Any]):
    """Appends every hook it runs to a shared log."""

    def __init__(self, label: str, log: list[str], priority: int | None = None) -> None:
        super().__init__()
        self.label = label
        self.log = log
        if priority is not None:
            self.priority = priority

    @property
    def name(self) -> str:
        return f"Recorder-{self.label}"

    def before_agent(self, state: Any, runtime: Any) -> None:
        self.log.append(f"before_agent:{self.label}")

    def before_model(self, state: Any, runtime: Any) -> None:
        self.log.append(f"before_model:{self.label}")

    def after_model(self, state: Any, runtime: Any) -> None:
        self.log.append(f"after_model:{self.label}")

    def after_agent(self, state: Any, runtime: Any) -> None:
        self.log.append(f"after_agent:{self.label}")

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> ModelResponse[Any]:
        self.log.append(f"wrap_model>{self.label}")
        try:
            return handler(request)
        finally:
            self.log.append(f"wrap_model<{self.label}")

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]]
    ) -> ToolMessage | Command[Any]:
        self.log.append(f"wrap_tool>{self.label}")
        try:
            return handler(request)
        finally:
            self.log.append(f"wrap_tool<{self.label}")

    def on_sandbox_start(self, sandbox: SandboxBackendProtocol) -> None:
        self.log.append(f"start:{self.label}")

    def on_sandbox_stop(self, sandbox: SandboxBackendProtocol) -> None:
        self.log.append(f"stop:{self.label}")


def test_priority_places_user_middleware_and_hooks_run_as_an_onion(local_provider: ProviderAdapter) -> None:
    log: list[str] = []
    # Given innermost first; the priorities (larger is outer) put them in the order a, b, c.
    c, b, a = Recorder("c", log, priority=5), Recorder("b", log), Recorder("a", log, priority=30)
    model = ScriptedChatModel(steps=[say("", call("ls")), say("done")])
    graph = create_sandbox_agent(model, sandbox=local_provider, middleware=[c, b, a], release="end")
    graph.invoke(ask("go"))
    stack = middleware_of(graph)
    assert [m for m in stack if isinstance(m, Recorder)] == [a, b, c]

    starts = [e for e in log if e.startswith("start:")]
    stops = [e for e in log if e.startswith("stop:")]
    # Seed 002: start from the innermost (lowest priority) out, stop in reverse.
    assert starts == ["start:c", "start:b", "start:a"]
    assert stops == ["stop:a", "stop:b", "stop:c"]
    events = [e for e in log if not e.startswith(("start:", "stop:"))]
    model_call = ["wrap_model>a", "wrap_model>b", "wrap_model>c", "wrap_model<c", "wrap_model<b", "wrap_model<a"]
    tool_call = ["wrap_tool>a", "wrap_tool>b", "wrap_tool>c", "wrap_tool<c", "wrap_tool<b", "wrap_tool<a"]
    assert events == [
        "before_agent:a",
        "before_agent:b",
        "before_agent:c",
        # step 1: the model asks for ls
        "before_model:a",
        "before_model:b",
        "before_model:c",
        *model_call,
        "after_model:c",
        "after_model:b",
        "after_model:a",
        *tool_call,
        # step 2: the final answer
        "before_model:a",
        "before_model:b",
        "before_model:c",
        *model_call,
        "after_model:c",
        "after_model:b",
        "after_model:a",
        "after_agent:c",
        "after_agent:b",
        "after_agent:a",
    ]
    # The sandbox started before any agent hook and stopped after the last one.
    assert log.index("start:a") < log.index("before_agent:a")
    assert log.index("stop:c") > log.index("after_agent:a")


def test_the_default_stack_is_in_the_documented_order(local_provider: ProviderAdapter) -> None:
    user = Recorder("user", [])
    model = ScriptedChatModel(steps=[])
    graph = create_sandbox_agent(
        model,
        sandbox=local_provider,
        middleware=[user],
        memory=["/AGENTS.md"],
        skills=["/skills/"],
        interrupt_on={"execute": True},
    )
    assert [type(m) for m in middleware_of(graph)] == [
        SandboxMiddleware,
        PatchToolCallsMiddleware,
        TodoListMiddleware,
        SkillsMiddleware,
        FilesystemMiddleware,
        SubAgentMiddleware,
        SummarizationMiddleware,
        Recorder,
        MemoryMiddleware,
        HumanInTheLoopMiddleware,
    ]


def test_user_priority_can_go_outside_every_default(local_provider: ProviderAdapter) -> None:
    outer, inner = Recorder("outer", [], priority=1000), Recorder("inner", [], priority=0)
    graph = create_sandbox_agent(ScriptedChatModel(steps=[]), sandbox=local_provider, middleware=[inner, outer])
    stack = middleware_of(graph)
    assert stack[0] is outer
    assert stack[-1] is inner


__all__ = ["local_provider"]  # the fixture, used by name
