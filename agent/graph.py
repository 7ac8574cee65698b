"""`create_sandbox_agent`: langchain's `create_agent` with a sandbox per thread and the stack below.

The default stack, outermost first (langchain runs ``before_*`` hooks in this order,
``after_*`` hooks in reverse, and the first ``wrap_*`` hook wraps all the others), with the
priority that places it (larger is outer, as in seed 002):

===  ==========================  ==========================================================
100  `SandboxMiddleware`         the thread's sandbox exists before anything else runs
 90  `PatchToolCallsMiddleware`  no unanswered tool call reaches a model
 80  `TodoListMiddleware`        ``write_todos`` (langchain's, checked as tools run: `agent.todos`)
 60  `SkillsMiddleware`          skill names and descriptions (if ``skills``)
 50  `FilesystemMiddleware`      the file, delete and execute tools; evicts large results
 40  `SubAgentMiddleware`        ``task`` (general-purpose plus ``subagents``)
 30  `SummarizationMiddleware`   langchain's: older history summarized near the context's limit
 20  the caller's middleware     unless it has a ``priority`` attribute of its own
 15  `MemoryMiddleware`          ``AGENTS.md`` files, the last section of the system prompt
 10  `HumanInTheLoopMiddleware`  (if ``interrupt_on``) innermost: reviews calls right after the model
===  ==========================  ==========================================================

Ties keep the order given (defaults before the caller's). Middleware that implements
``on_sandbox_start``/``on_sandbox_stop`` (`SandboxHook`) gets them called by the lifecycle.

Each middleware appends its section to the system prompt in stack order, so the prompt is the
stable prefix first (the base prompt, the todo list's, skills', the tools', the subagents') and
the memory files last, as deepagents orders them: a memory file that changes leaves the prefix,
and a provider's cache of it, intact. Summarization is on unless ``summarization=False``; a
`SummarizationMiddleware` among the caller's middleware replaces the default one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import (
    AgentMiddleware,
    HumanInTheLoopMiddleware,
    SummarizationMiddleware,
)
from langchain.agents.middleware.human_in_the_loop import InterruptOnConfig
from langchain.chat_models import init_chat_model
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import SystemMessage
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore

from agent.lifecycle import (
    FixedSandbox,
    MissingPolicy,
    ProviderAdapter,
    ReleasePolicy,
    RemoteProvider,
    SandboxHook,
    SandboxMiddleware,
    SandboxProvider,
)
from agent.memory import MemoryMiddleware, SkillsMiddleware
from agent.patch import PatchToolCallsMiddleware
from agent.subagents import GENERAL_PURPOSE, GENERAL_PURPOSE_PROMPT, SubAgent, SubAgentMiddleware, build_subagent_graph
from agent.todos import TodoListMiddleware
from agent.tools import DEFAULT_LARGE_RESULT_CHARS, FilesystemMiddleware
from agent.virtual import VIRTUAL_ROOT
from agent.workspace import Layout, WorkspaceFactory
from sandboxes import protocol as p
from sandboxes._output import DEFAULT_OUTPUT_LIMIT
from sandboxes.templates import ProviderContext, validate_template

__all__ = [
    "SUMMARIZATION_PRIORITY",
    "USER_PRIORITY",
    "create_sandbox_agent",
    "lifecycle_of",
    "middleware_of",
    "order_middleware",
    "priority_of",
]

GENERAL_PURPOSE_DESCRIPTION = "General-purpose agent for multi-step tasks, with your tools."
BASE_PROMPT = "You are an agent that gets things done with tools in a sandbox. Be concise; check your work."

USER_PRIORITY = 20
TODO_PRIORITY = 80
HITL_PRIORITY = 10
SUMMARIZATION_PRIORITY = 30

SandboxSpec = SandboxProvider | SandboxMiddleware | p.SandboxBackendProtocol | str

_LIFECYCLE_ATTRIBUTE = "sandbox_lifecycle"
"""The attribute of a graph made by `create_sandbox_agent` that holds its `SandboxMiddleware`."""
_STACK_ATTRIBUTE = "sandbox_middleware"
"""The attribute of such a graph that holds its middleware stack, outermost first."""


def priority_of(middleware: object, default: int = USER_PRIORITY) -> int:
    value = getattr(middleware, "priority", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def order_middleware(
    defaults: Sequence[tuple[int, AgentMiddleware[Any, Any]]], user: Sequence[AgentMiddleware[Any, Any]]
) -> list[AgentMiddleware[Any, Any]]:
    """Outermost first: by priority, larger first; ties in the order given, defaults first."""
    ranked = [*defaults, *((priority_of(m), m) for m in user)]
    order = sorted(range(len(ranked)), key=lambda i: (-ranked[i][0], i))
    return [ranked[i][1] for i in order]


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sandboxes-agent"


def provider_for(spec: str | SandboxProvider | p.SandboxBackendProtocol) -> SandboxProvider:
    """A service URL (key in ``SANDBOXES_API_KEY``), a backend's name (``local``, ``docker``:
    its template's defaults), a provider or a sandbox."""
    if isinstance(spec, SandboxProvider):
        return spec
    if isinstance(spec, p.SandboxBackendProtocol):
        return FixedSandbox(spec)
    if spec.startswith(("http://", "https://")):
        key = os.environ.get("SANDBOXES_API_KEY")
        if not key:
            raise ValueError("a sandbox service URL needs an API key: set SANDBOXES_API_KEY")
        return RemoteProvider(spec, key)
    try:
        template = validate_template({"backend": spec})
    except ValueError as exc:
        raise ValueError(f"unknown sandbox {spec!r}: use 'local', 'docker', a service URL or a provider") from exc
    context = ProviderContext(data_dir=default_state_dir(), output_limit=DEFAULT_OUTPUT_LIMIT, own_expiry=True)
    return ProviderAdapter(template.provider(context), virtual_root=VIRTUAL_ROOT)


def lifecycle_of(graph: Any) -> SandboxMiddleware:
    """The `SandboxMiddleware` of a graph made by `create_sandbox_agent` (to release or close)."""
    lifecycle = getattr(graph, _LIFECYCLE_ATTRIBUTE, None)
    if not isinstance(lifecycle, SandboxMiddleware):
        raise KeyError("not a graph made by create_sandbox_agent")
    return lifecycle


def middleware_of(graph: Any) -> tuple[AgentMiddleware[Any, Any], ...]:
    """The middleware stack of a graph made by `create_sandbox_agent`, outermost first."""
    stack = getattr(graph, _STACK_ATTRIBUTE, None)
    if not isinstance(stack, tuple):
        raise KeyError("not a graph made by create_sandbox_agent")
    return stack


def create_sandbox_agent(
    model: BaseChatModel | str,
    *,
    sandbox: SandboxSpec,
    tools: Sequence[BaseTool | Callable[..., Any]] = (),
    system_prompt: str | SystemMessage | None = None,
    middleware: Sequence[AgentMiddleware[Any, Any]] = (),
    subagents: Sequence[SubAgent | Mapping[str, Any]] = (),
    memory: Sequence[str] = (),
    skills: Sequence[str] = (),
    interrupt_on: Mapping[str, bool | InterruptOnConfig] | None = None,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    store: BaseStore | None = None,
    release: ReleasePolicy = "ttl",
    on_missing: MissingPolicy = "replace",
    layout: Layout | None = None,
    large_result_chars: int | None = DEFAULT_LARGE_RESULT_CHARS,
    todos: bool = True,
    summarization: bool = True,
    name: str | None = None,
) -> Any:
    """A compiled LangGraph agent whose every tool runs in the thread's sandbox.

    ``sandbox``: ``"local"``, ``"docker"``, a service URL, a `SandboxProvider`, a sandbox the
    caller owns (every thread shares it), or a ready `SandboxMiddleware`. ``memory``: paths of
    ``AGENTS.md`` files; ``skills``: directories holding ``<skill>/SKILL.md``; both read from
    the workspace. ``store`` backs ``/memories/`` (an in-memory store when ``None``: lost with
    the process). ``release``: ``"end"`` ends the sandbox when a run finishes, ``"ttl"`` leaves
    it to `SandboxMiddleware.release` or the provider's TTL. ``on_missing``: what a resumed
    thread whose sandbox is gone gets: ``"replace"`` a new one (and the model is told),
    ``"raise"`` `SandboxGone`. ``summarization``: langchain's `SummarizationMiddleware` on the
    agent and its subagents, with deepagents' thresholds (`summarization_for`).
    """
    chat = init_chat_model(model) if isinstance(model, str) else model
    layout = layout or Layout()
    if isinstance(sandbox, SandboxMiddleware):
        lifecycle = sandbox
    else:
        lifecycle = SandboxMiddleware(provider_for(sandbox), release=release, on_missing=on_missing)
    fallback_store = InMemoryStore() if store is None else None
    source = WorkspaceFactory(lifecycle, layout, fallback_store)

    def shared_stack(model: BaseChatModel) -> list[AgentMiddleware[Any, Any]]:
        """What every subagent gets: fresh instances, sharing the sandbox through ``source``."""
        return [
            PatchToolCallsMiddleware(),
            TodoListMiddleware(),
            FilesystemMiddleware(source, layout=layout, large_result_chars=large_result_chars),
            *([summarization_for(model)] if summarization else []),
        ]

    specs = [
        SubAgent(GENERAL_PURPOSE, GENERAL_PURPOSE_DESCRIPTION, GENERAL_PURPOSE_PROMPT),
        *(SubAgent.of(s) for s in subagents),
    ]
    task = SubAgentMiddleware(
        specs, lambda spec: build_subagent_graph(spec, model=chat, default_tools=tools, stack=shared_stack)
    )
    defaults: list[tuple[int, AgentMiddleware[Any, Any]]] = [
        (lifecycle.priority, lifecycle),
        (PatchToolCallsMiddleware.priority, PatchToolCallsMiddleware()),
    ]
    if todos:
        defaults.append((TODO_PRIORITY, TodoListMiddleware()))
    if memory:
        defaults.append((MemoryMiddleware.priority, MemoryMiddleware(source, memory)))
    if skills:
        defaults.append((SkillsMiddleware.priority, SkillsMiddleware(source, skills)))
    files = FilesystemMiddleware(source, layout=layout, large_result_chars=large_result_chars)
    defaults.append((files.priority, files))
    defaults.append((task.priority, task))
    if summarization and not any(isinstance(m, SummarizationMiddleware) for m in middleware):
        defaults.append((SUMMARIZATION_PRIORITY, summarization_for(chat)))
    if interrupt_on:
        defaults.append((HITL_PRIORITY, HumanInTheLoopMiddleware(dict(interrupt_on))))
    stack = order_middleware(defaults, middleware)
    lifecycle.add_hooks(m for m in stack if m is not lifecycle and isinstance(m, SandboxHook))
    prompt = _system_prompt(system_prompt)
    graph = create_agent(
        chat,
        list(tools),
        system_prompt=prompt,
        middleware=stack,
        checkpointer=checkpointer,
        store=store,
        name=name,
    )
    setattr(graph, _LIFECYCLE_ATTRIBUTE, lifecycle)
    setattr(graph, _STACK_ATTRIBUTE, tuple(stack))
    return graph


def summarization_for(model: BaseChatModel) -> SummarizationMiddleware:
    """langchain's summarization with deepagents' default thresholds: at 85% of the model's
    context keep its last 10%, or, for a model whose profile does not say its context, at
    170,000 tokens keep the last 6 messages."""
    profile = model.profile if isinstance(model.profile, dict) else {}
    if isinstance(profile.get("max_input_tokens"), int):
        return SummarizationMiddleware(model, trigger=("fraction", 0.85), keep=("fraction", 0.10))
    return SummarizationMiddleware(model, trigger=("tokens", 170_000), keep=("messages", 6))


def _system_prompt(system_prompt: str | SystemMessage | None) -> SystemMessage:
    if system_prompt is None:
        return SystemMessage(content=BASE_PROMPT)
    if isinstance(system_prompt, SystemMessage):
        return system_prompt
    return SystemMessage(content=system_prompt)
