"""`append_to_system_message`: how every middleware here adds a section to the system prompt.

Memory, skills and the filesystem tools each add their own section to the system message of a
model request. They all go through this one function so the sections compose the same way
whatever the order of the stack: the message a middleware receives is never modified (the
request before it may be shared with a retry or another branch), the content keeps its blocks
(text, images, cache markers survive), and sections are separated by one blank line, never
leading with one when there was nothing before.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import SystemMessage

__all__ = ["SECTION_SEPARATOR", "SectionAppender", "append_to_system_message"]

SECTION_SEPARATOR = "\n\n"


def append_to_system_message(system_message: SystemMessage | None, text: str) -> SystemMessage:
    """A new `SystemMessage`: the content blocks of ``system_message`` then ``text`` as a text block.

    The separator is added only when there is content before (``None``, ``""`` and ``[]``
    have none), so appending to nothing yields exactly ``[{"type": "text", "text": text}]``.
    """
    blocks: list[Any] = list(system_message.content_blocks) if system_message is not None else []
    if blocks:
        text = SECTION_SEPARATOR + text
    blocks.append({"type": "text", "text": text})
    return SystemMessage(content=blocks)


class SectionAppender:
    """`append_to_system_message` that returns its last result again for an equal content and text.

    The result depends only on the message's content and the text, so a model call whose system
    message has the content of the previous call's reuses that call's message instead of
    rebuilding its blocks; the message handed out is never modified by this package.
    """

    def __init__(self) -> None:
        self._last: tuple[Any, str, SystemMessage] | None = None

    def __call__(self, system_message: SystemMessage | None, text: str) -> SystemMessage:
        content = system_message.content if system_message is not None else None
        last = self._last
        if last is not None and last[1] == text and last[0] == content:
            return last[2]
        result = append_to_system_message(system_message, text)
        self._last = (content, text, result)
        return result
