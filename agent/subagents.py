"""Subagents behind one ``task`` tool: fresh context, own tools, the thread's sandbox.

The main agent delegates with ``task(description, subagent_type)``. The subagent starts from
the description alone (its own context window), runs to its final answer, and only that answer
comes back as the tool result, so long explorations do not fill the main context. It shares
the thread's sandbox (it gets the parent's ``sandbox_id``) and ``/scratch/`` files; what it
changes in ``/scratch/`` comes back as a state update. Several ``task`` calls in one model
answer run in parallel, like any tool calls.

``general-purpose`` is always there: the main agent's tools and the filesystem tools under a
generic prompt. Others are declared with `SubAgent`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain.chat_models import init_chat_model
from langchain.tools import ToolRuntime
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.types import Command

from agent._system import SectionAppender
from agent.backends import merge_files
from agent.lifecycle import SandboxAgentState

__all__ = ["GENERAL_PURPOSE", "SubAgent", "SubAgentMiddleware"]

GENERAL_PURPOSE = "general-purpose"

GENERAL_PURPOSE_PROMPT = (
    "You are a subagent working for another agent. Do the task you are given with the tools you "
    "have, in the same sandbox as the agent that called you, and end with a concise report of what "
    "you found or did: only your last message goes back."
)

TASK_PROMPT = """## Subagents

`task(description, subagent_type)` hands a self-contained task to a subagent with its own
context; you get back only its final report. Give every detail it needs in `description`.
Independent tasks can run in parallel: call `task` several times in one answer.
Available subagent types:
{types}"""


@dataclass(frozen=True)
class SubAgent:
    """A subagent the main agent may call by ``name``."""

    name: str
    description: str
    system_prompt: str
    tools: Sequence[BaseTool | Callable[..., Any]] | None = None
    """``None``: the main agent's own tools."""
    model: BaseChatModel | str | None = None
    """``None``: the main agent's model."""
    middleware: Sequence[AgentMiddleware[Any, Any]] = field(default_factory=tuple)

    @classmethod
    def of(cls, spec: SubAgent | Mapping[str, Any]) -> SubAgent:
        """Accept deepagents-style dict specs as well."""
        return spec if isinstance(spec, SubAgent) else cls(**dict(spec))


GraphBuilder = Callable[[SubAgent], Any]


def _final_text(result: Mapping[str, Any]) -> str:
    for message in reversed(result.get("messages", [])):
        if isinstance(message, AIMessage):
            return message.text or "(the subagent answered nothing)"
    return "(the subagent answered nothing)"


def _files_changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    changed: dict[str, Any] = {k: v for k, v in after.items() if before.get(k) != v}
    changed.update({k: None for k in before if k not in after})
    return changed


class SubAgentMiddleware(AgentMiddleware[SandboxAgentState, Any]):
    """Adds the ``task`` tool; the subagent graphs are built once, by ``build``."""

    state_schema = SandboxAgentState
    priority = 40

    def __init__(self, subagents: Sequence[SubAgent], build: GraphBuilder) -> None:
        super().__init__()
        self.specs = {spec.name: spec for spec in subagents}
        self.graphs = {name: build(spec) for name, spec in self.specs.items()}
        types = "\n".join(f"- {name}: {spec.description}" for name, spec in self.specs.items())
        self.prompt = TASK_PROMPT.format(types=types)
        self.tools = [self._task_tool()]
        self._append = SectionAppender()

    def _inputs(self, runtime: ToolRuntime, description: str) -> dict[str, Any]:
        state = runtime.state
        return {
            "messages": [{"role": "user", "content": description}],
            "sandbox_id": state.get("sandbox_id"),
            "files": dict(state.get("files") or {}),
        }

    def _answer(self, runtime: ToolRuntime, inputs: Mapping[str, Any], result: Mapping[str, Any]) -> Command[Any]:
        message = ToolMessage(_final_text(result), tool_call_id=runtime.tool_call_id or "", name="task")
        update: dict[str, Any] = {"messages": [message]}
        files = _files_changed(inputs["files"], merge_files(result.get("files"), None))
        if files:
            update["files"] = files
        return Command(update=update)

    def _task_tool(self) -> BaseTool:
        graphs = self.graphs
        config = {"configurable": {"ls_agent_type": "subagent"}}

        def unknown(subagent_type: str) -> str:
            return f"Error (invalid_argument): no subagent {subagent_type!r}; available: {', '.join(graphs)}"

        def task(runtime: ToolRuntime, description: str, subagent_type: str) -> str | Command[Any]:
            """Run a subagent on a self-contained task; returns its final report."""
            if subagent_type not in graphs:
                return unknown(subagent_type)
            inputs = self._inputs(runtime, description)
            return self._answer(runtime, inputs, graphs[subagent_type].invoke(inputs, config))

        async def atask(runtime: ToolRuntime, description: str, subagent_type: str) -> str | Command[Any]:
            """Run a subagent on a self-contained task; returns its final report."""
            if subagent_type not in graphs:
                return unknown(subagent_type)
            inputs = self._inputs(runtime, description)
            return self._answer(runtime, inputs, await graphs[subagent_type].ainvoke(inputs, config))

        return StructuredTool.from_function(task, coroutine=atask, name="task")

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> ModelResponse[Any]:
        return handler(request.override(system_message=self._append(request.system_message, self.prompt)))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        new = request.override(system_message=self._append(request.system_message, self.prompt))
        return await handler(new)


def build_subagent_graph(
    spec: SubAgent,
    *,
    model: BaseChatModel,
    default_tools: Sequence[BaseTool | Callable[..., Any]],
    stack: Callable[[BaseChatModel], list[AgentMiddleware[Any, Any]]],
) -> Any:
    """A compiled subagent: ``stack(model)`` gives fresh instances of the shared middleware for
    the subagent's model; a middleware of the spec's own replaces a shared one of its name."""
    chosen = init_chat_model(spec.model) if isinstance(spec.model, str) else spec.model or model
    tools = list(spec.tools) if spec.tools is not None else list(default_tools)
    own = {m.name for m in spec.middleware}
    return create_agent(
        chosen,
        tools,
        system_prompt=spec.system_prompt,
        middleware=[*(m for m in stack(chosen) if m.name not in own), *spec.middleware],
        name=spec.name,
    )
