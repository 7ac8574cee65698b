"""`sandboxes._mux.Command`: one command as one value, from the public ``execute()`` edge down to
the exec helper and the transports' fallbacks."""

from __future__ import annotations

import dataclasses

import pytest

from sandboxes._mux import Command, GivenDefaults

DEFAULTS = GivenDefaults(default_timeout=30.0, output_limit=4096, env={"A": "sandbox", "B": "sandbox"}, workdir="/w")


def test_given_takes_the_sandboxs_limits_only_where_the_call_leaves_them_out() -> None:
    asked = Command.given(DEFAULTS, "echo", stdin="é")
    assert (asked.timeout, asked.output_limit, asked.stdin, asked.cwd) == (30.0, 4096, "é".encode(), None)
    named = Command.given(DEFAULTS, "echo", timeout=0, output_limit=1, env={"A": "call"}, cwd="/tmp")
    assert (named.timeout, named.output_limit, dict(named.env), named.cwd) == (0, 1, {"A": "call"}, "/tmp")


def test_within_puts_the_commands_environment_over_the_sandboxs_and_fills_in_its_working_directory() -> None:
    run = Command("echo", timeout=5, output_limit=10, env={"A": "call"}).within(DEFAULTS)
    assert dict(run.env) == {"A": "call", "B": "sandbox"}
    assert run.workdir == "/w"
    assert Command("echo", 5, 10, cwd="/tmp").within(DEFAULTS).workdir == "/tmp"


def test_the_working_directory_is_asked_for_only_once_filled_in() -> None:
    with pytest.raises(ValueError, match="within"):
        _ = Command("echo", 5, 10).workdir


def test_a_command_is_a_value_that_marking_copies() -> None:
    command = Command("echo", 5, 10, env={"A": "1"})
    marked = command.with_env("MARK", "t")
    assert dict(command.env) == {"A": "1"}
    assert dict(marked.env) == {"A": "1", "MARK": "t"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        command.timeout = 1  # type: ignore[misc]
