"""Whose ``/memories/`` a run sees: the store namespace from the run's user, assistant and thread.

A deployment identifies its users as LangGraph does: the server's authenticated user
(``config["configurable"]["langgraph_auth_user"]``, what ``Runtime.server_info.user`` reads) wins
over what a caller says; otherwise ``user_id`` in the runtime context (an attribute or a key)
or in ``config["configurable"]``. The assistant is ``assistant_id`` from the same places.

`per_user_namespace` (the default) gives each user, and each assistant of that user, a namespace
of its own. A run without a user id never sees another user's memories: it gets a namespace of
its thread, and without a thread id its memories stay in the run's own state. A constant tuple
in `Layout.memories_namespace` shares one namespace on purpose between every run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from langchain_core.runnables import RunnableConfig

__all__ = [
    "MemoryNamespace",
    "RunIdentity",
    "current_identity",
    "identity_of",
    "namespace_for",
    "per_user_namespace",
]

ROOT = ("sandboxes-agent", "memories")


@dataclass(frozen=True)
class RunIdentity:
    """Who runs: each field is ``None`` when the run does not say."""

    user_id: str | None = None
    assistant_id: str | None = None
    thread_id: str | None = None


MemoryNamespace = tuple[str, ...] | Callable[[RunIdentity], tuple[str, ...] | None]
"""A fixed namespace (shared by every run), or a function of the run's identity; ``None`` from
the function keeps the run's memories in its state rather than in the store."""


def _label(value: str) -> str:
    """A store namespace label for any string: one-to-one, without ``.`` (the store refuses it)."""
    return quote(value, safe="").replace(".", "%2E")


def per_user_namespace(identity: RunIdentity) -> tuple[str, ...] | None:
    """The user's own namespace (and its assistant's); else the thread's; else ``None``."""
    if identity.user_id:
        namespace: tuple[str, ...] = (*ROOT, "user", _label(identity.user_id))
        if identity.assistant_id:
            namespace += ("assistant", _label(identity.assistant_id))
        return namespace
    if identity.thread_id:
        return (*ROOT, "thread", _label(identity.thread_id))
    return None


def _text(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


def _field(source: Any, name: str) -> str | None:
    if isinstance(source, Mapping):
        return _text(source.get(name))
    return _text(getattr(source, name, None))


def _authenticated(configurable: Mapping[str, Any]) -> str | None:
    return _field(configurable.get("langgraph_auth_user"), "identity") or _text(
        configurable.get("langgraph_auth_user_id")
    )


def identity_of(config: RunnableConfig | None, context: Any = None) -> RunIdentity:
    """The identity a run's config and runtime context declare (the server's user first)."""
    configurable: Mapping[str, Any] = (config or {}).get("configurable") or {}
    user = _authenticated(configurable) or _field(context, "user_id") or _text(configurable.get("user_id"))
    assistant = _field(context, "assistant_id") or _text(configurable.get("assistant_id"))
    return RunIdentity(user, assistant, _text(configurable.get("thread_id")))


def current_identity() -> RunIdentity:
    """The identity of the graph run this is called in; empty outside a run."""
    from langgraph.config import get_config
    from langgraph.runtime import get_runtime

    try:
        config = get_config()
    except RuntimeError:
        return RunIdentity()
    try:
        context = get_runtime().context
    except (RuntimeError, KeyError):
        context = None
    return identity_of(config, context)


def namespace_for(namespace: MemoryNamespace, identity: RunIdentity) -> tuple[str, ...] | None:
    """The store namespace of ``/memories/`` for a run; ``None``: keep them in its state."""
    return namespace if isinstance(namespace, tuple) else namespace(identity)
