"""append_to_system_message: seed 000's contract (blocks kept, separator rules, no mutation)."""

from __future__ import annotations

import copy

from langchain_core.messages import SystemMessage

from agent import append_to_system_message
from agent._system import SectionAppender


def test_none_gives_one_block_without_separator() -> None:
    assert append_to_system_message(None, "text").content == [{"type": "text", "text": "text"}]


def test_empty_list_and_empty_string_get_no_separator() -> None:
    for empty in (SystemMessage(content=[]), SystemMessage(content="")):
        assert append_to_system_message(empty, "new").content == [{"type": "text", "text": "new"}]


def test_appends_a_block_after_a_blank_line() -> None:
    result = append_to_system_message(SystemMessage(content="Base prompt"), "Additional instructions")
    assert result.content == [
        {"type": "text", "text": "Base prompt"},
        {"type": "text", "text": "\n\nAdditional instructions"},
    ]


def test_successive_appends_stack_in_order() -> None:
    message = append_to_system_message(None, "Memory content")
    message = append_to_system_message(message, "Skills content")
    message = append_to_system_message(message, "Filesystem instructions")
    assert [block["text"] for block in message.content] == [  # type: ignore[index, union-attr]
        "Memory content",
        "\n\nSkills content",
        "\n\nFilesystem instructions",
    ]


def test_never_mutates_the_message_it_gets() -> None:
    for original in (
        SystemMessage(content="base"),
        SystemMessage(content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
    ):
        before = copy.deepcopy(original.content)
        result = append_to_system_message(original, "extra")
        assert original.content == before
        assert result is not original


def test_non_text_blocks_survive() -> None:
    image = {"type": "image", "url": "https://example.invalid/x.png"}
    result = append_to_system_message(SystemMessage(content=[{"type": "text", "text": "see"}, image]), "more")
    assert len(result.content) == 3
    assert result.content[1]["type"] == "image"  # type: ignore[index]
    assert result.content[2] == {"type": "text", "text": "\n\nmore"}


def test_section_appender_reuses_its_message_for_an_equal_content() -> None:
    append = SectionAppender()
    first = append(SystemMessage(content="base"), "section")
    again = append(SystemMessage(content="base"), "section")
    assert again is first
    assert first.content == append_to_system_message(SystemMessage(content="base"), "section").content


def test_section_appender_rebuilds_when_the_content_or_the_text_changes() -> None:
    append = SectionAppender()
    first = append(SystemMessage(content="base"), "section")
    other_base = append(SystemMessage(content="other"), "section")
    other_text = append(SystemMessage(content="other"), "more")
    assert other_base is not first
    assert other_text is not other_base
    assert other_base.content == append_to_system_message(SystemMessage(content="other"), "section").content
    assert other_text.content == append_to_system_message(SystemMessage(content="other"), "more").content
    assert append(None, "section").content == [{"type": "text", "text": "section"}]
