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

__all__ = ["SECTION_SEPARATOR", "append_to_system_message"]

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
