"""``python -m agent "TASK" --model provider:model``: run an agent in a sandbox, showing its steps.

Each step is printed as it happens: what the model says, the tool calls it makes, their results
(first lines), and the todo list when it changes. Threads are kept in SQLite (``--db``, by
default under ``$XDG_STATE_HOME/sandboxes-agent/``), so ``--thread ID`` continues one later,
in the same sandbox, from a new process. ``--approve execute`` asks on stdin before each
command (``y``, ``n reason``, or ``e {"command": "..."}`` to run another one).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from langchain_core.messages import AIMessage, BaseMessage, RemoveMessage, ToolMessage

__all__ = ["KEY_VARIABLES", "main", "missing_key", "model_problem"]

KEY_VARIABLES = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "google_genai": "GOOGLE_API_KEY",
    "google_vertexai": "GOOGLE_APPLICATION_CREDENTIALS",
    "mistralai": "MISTRAL_API_KEY",
    "groq": "GROQ_API_KEY",
    "deepseek": "DEEPSEEK_API_KEY",
    "xai": "XAI_API_KEY",
    "fireworks": "FIREWORKS_API_KEY",
    "together": "TOGETHER_API_KEY",
    "cohere": "COHERE_API_KEY",
}
"""The environment variable holding each provider's key (``ollama`` needs none)."""

RESULT_LINES = 8


def missing_key(model: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The variable to set for ``provider:model``, when it is not set."""
    provider = model.split(":", 1)[0] if ":" in model else ""
    variable = KEY_VARIABLES.get(provider)
    return variable if variable is not None and not environ.get(variable) else None


def model_problem(model: str) -> str | None:
    """What is wrong with ``--model`` before any provider is asked, in one line; ``None``: nothing."""
    provider, _, name = model.partition(":")
    if name and provider:
        return None
    try:
        from langchain.chat_models.base import _attempt_infer_model_provider as infer
    except ImportError:  # pragma: no cover - the agent extra pins langchain
        guess = None
    else:
        guess = infer(model) if model else None
    advice = f"write --model {guess}:{model}" if guess else "e.g. --model openai:gpt-4.1"
    return f"--model needs provider:model: {advice} (got {model!r})"


def _account() -> str:
    """The name of the account running the CLI: the owner of its ``/memories/``."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (a bare container)
        return f"uid-{os.getuid()}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m agent", description=__doc__.split("\n")[0])
    parser.add_argument("task", help="what the agent should do")
    parser.add_argument("--model", required=True, help="provider:model, e.g. openai:gpt-4.1 or anthropic:claude-...")
    parser.add_argument("--sandbox", default="local", help="local, docker, or the sandbox service's URL")
    parser.add_argument("--thread", help="continue this thread (printed by an earlier run)")
    parser.add_argument("--db", help="SQLite file or postgresql:// URL for threads and memories")
    parser.add_argument("--release", choices=["end", "ttl"], default="ttl", help="end the sandbox when the run ends")
    parser.add_argument(
        "--approve", action="append", default=[], metavar="TOOL", help="ask before each call of TOOL (repeatable)"
    )
    return parser


def _short(text: str, lines: int = RESULT_LINES) -> str:
    kept = text.splitlines()
    more = len(kept) - lines
    return "\n".join(kept[:lines] + ([f"... ({more} more lines)"] if more > 0 else []))


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def update_lines(update: Mapping[str, Any]) -> list[str]:
    """What one node added, as lines: messages (text, tool calls, results) and todos."""
    lines: list[str] = []
    messages: Sequence[BaseMessage] = update.get("messages") or []
    if any(isinstance(m, RemoveMessage) for m in messages):  # the whole history, rewritten
        return ["(history rewritten: unanswered tool calls marked cancelled)"]
    for message in messages:
        if isinstance(message, AIMessage):
            if message.text.strip():
                lines.append(f"agent: {message.text.strip()}")
            for tool_call in message.tool_calls:
                args = ", ".join(f"{k}={v!r}" for k, v in tool_call["args"].items())
                lines.append(f"-> {tool_call['name']}({_short(args, 3)})")
        elif isinstance(message, ToolMessage):
            lines.extend(f"<- {message.name}:\n{_indent(_short(str(message.content)))}".splitlines())
    todos = update.get("todos")
    if todos:
        lines.append("todos:")
        for todo in todos:
            mark = {"completed": "x", "in_progress": ">"}.get(todo.get("status", ""), " ")
            lines.append(f"  [{mark}] {todo.get('content', '')}")
    return lines


def show_update(update: Mapping[str, Any], out: TextIO, depth: int = 0) -> None:
    """Print one node's update; a subagent's (``depth`` > 0) indented under its ``task`` call."""
    for line in update_lines(update):
        print("  | " * depth + line, file=out)
    out.flush()


def ask_decision(request: Mapping[str, Any], answers: TextIO, out: TextIO) -> dict[str, Any]:
    """One HITL decision read from ``answers``: ``y``, ``n [why]`` or ``e {json args}``."""
    args = json.dumps(request.get("args", {}))
    print(f"approve {request.get('name')} {args}? [y / n reason / e {{json args}}] ", end="", file=out)
    out.flush()
    line = answers.readline()
    answer = line.strip()
    print(answer, file=out)
    if answer.lower() in ("y", "yes"):
        return {"type": "approve"}
    if answer.startswith("e ") or answer.startswith("e{"):
        try:
            edited = json.loads(answer[1:].strip())
        except json.JSONDecodeError as exc:
            print(f"not JSON ({exc}): rejected", file=out)
        else:
            return {"type": "edit", "edited_action": {"name": request.get("name"), "args": edited}}
    reason = answer[1:].strip() if answer.lower().startswith("n") else answer
    return {"type": "reject", "message": reason or ("no answer" if not line else "rejected")}


def _resume_value(interrupts: Sequence[Any], answers: TextIO, out: TextIO) -> Any:
    """The resume payload: the decisions of one interrupt, or of each by its id."""
    values = {
        interrupt.id: {"decisions": [ask_decision(r, answers, out) for r in interrupt.value["action_requests"]]}
        for interrupt in interrupts
    }
    return next(iter(values.values())) if len(values) == 1 else values


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout, answers: TextIO = sys.stdin) -> int:
    args = _parser().parse_args(argv)
    problem = model_problem(args.model)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    variable = missing_key(args.model)
    if variable is not None:
        print(f"No key for {args.model}: set {variable} (export {variable}=...)", file=sys.stderr)
        return 2
    from langchain.chat_models import init_chat_model
    from langgraph.types import Command

    from agent.graph import create_sandbox_agent, default_state_dir, lifecycle_of
    from agent.persistence import open_persistence

    try:
        model = init_chat_model(args.model)
    except Exception as exc:  # no integration package, unknown provider, the provider's client refusing
        print(f"Cannot use {args.model}: {exc}".splitlines()[0], file=sys.stderr)
        return 2

    thread_id = args.thread or uuid.uuid4().hex[:12]
    database = args.db or str(default_state_dir() / "agent.sqlite")
    print(f"thread {thread_id} (continue it with --thread {thread_id})", file=out)
    with open_persistence(database) as persistence:
        graph = create_sandbox_agent(
            model,
            sandbox=args.sandbox,
            checkpointer=persistence.checkpointer,
            store=persistence.store,
            release=args.release,
            interrupt_on={name: True for name in args.approve} or None,
        )
        # /memories/ belong to a user: here, the account running the CLI.
        config = {"configurable": {"thread_id": thread_id, "user_id": _account()}}
        payload: Any = {"messages": [{"role": "user", "content": args.task}]}
        try:
            while True:
                for namespace, chunk in graph.stream(payload, config, stream_mode="updates", subgraphs=True):
                    for update in chunk.values():
                        if isinstance(update, Mapping):
                            show_update(update, out, depth=len(namespace))
                interrupts = graph.get_state(config).interrupts
                if not interrupts:
                    break
                payload = Command(resume=_resume_value(interrupts, answers, out))
        finally:
            lifecycle_of(graph).close()
        state = graph.get_state(config).values
    print(f"sandbox {state.get('sandbox_id') or '(released)'}", file=out)
    return 0
