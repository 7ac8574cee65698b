"""`ScriptedChatModel`: a fake chat model that answers from a fixed script (for tests and benchmarks).

No model service is reachable where the tests run, so whole episodes are driven by a script:
each call returns the next `AIMessage` (tool calls included), or the result of a callable given
the messages it received. It is a fake: it does not read its input unless a step asks to.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from pydantic import Field, PrivateAttr

__all__ = ["ScriptExhausted", "ScriptedChatModel", "Step", "call", "say"]

Step = AIMessage | Callable[[list[BaseMessage]], AIMessage] | Exception

_ids = itertools.count(1)


class ScriptExhausted(AssertionError):
    """The model was called more often than the script has steps."""


def call(name: str, /, **args: Any) -> dict[str, Any]:
    """One tool call for `say`, with a fresh id."""
    return {"name": name, "args": args, "id": f"call_{next(_ids)}", "type": "tool_call"}


def say(text: str = "", *calls: dict[str, Any]) -> AIMessage:
    """An AI message with ``text`` and tool calls made by `call`."""
    return AIMessage(content=text, tool_calls=list(calls))


class ScriptedChatModel(BaseChatModel):
    """Fake: answers step by step from ``steps``; an `Exception` step is raised (to trip fallbacks).

    ``requests`` records every message list it was called with; ``tools`` the tool names bound.
    """

    steps: list[Any] = Field(repr=False)
    repeat_last: bool = False
    """Answer the last step forever (benchmarks) instead of raising `ScriptExhausted`."""

    _position: int = PrivateAttr(default=0)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _requests: list[list[BaseMessage]] = PrivateAttr(default_factory=list)
    _tools: list[str] = PrivateAttr(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    @property
    def requests(self) -> list[list[BaseMessage]]:
        return self._requests

    @property
    def tools(self) -> list[str]:
        return self._tools

    @property
    def calls(self) -> int:
        return self._position

    def bind_tools(
        self, tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool], **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        self._tools = [t.name if isinstance(t, BaseTool) else str(getattr(t, "__name__", t)) for t in tools]
        return self

    def _next(self, messages: list[BaseMessage]) -> AIMessage:
        with self._lock:
            self._requests.append(list(messages))
            if self._position >= len(self.steps):
                if not (self.repeat_last and self.steps):
                    raise ScriptExhausted(f"script of {len(self.steps)} steps called again")
                step = self.steps[-1]
            else:
                step = self.steps[self._position]
            self._position += 1
        if isinstance(step, Exception):
            raise step
        message = step if isinstance(step, AIMessage) else step(list(messages))
        return message.model_copy(update={"id": None})

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._next(messages))])
