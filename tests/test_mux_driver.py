"""`sandboxes._mux.HelperDriver`: the exec helper a sandbox holds, driven the same for every
transport, here over a pipe to the real helper process (no container) and a toy transport that
records what the driver asks of it."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from test_mux import _PipeStream

from sandboxes import protocol as p
from sandboxes._mux import (
    AwaitedCommand,
    Command,
    GivenDefaults,
    HelperDriver,
    MuxBroken,
    MuxClient,
    Refusal,
    TransportWords,
)
from sandboxes._output import OutputHook, as_output_hook

DEFAULTS = GivenDefaults(default_timeout=10.0, output_limit=1 << 20, env={"FROM": "sandbox"}, workdir="/")


class _Refused(Exception):
    """The toy transport's own failure, which it answers in the protocol's words."""


class _Toy:
    """A `sandboxes._mux.HelperTransport` whose helper is a local process; ``fail_starts``
    starts fail first, and its fallback answers ``alone``."""

    def __init__(self, fail_starts: int = 0, python_missing: bool = False) -> None:
        self.fail_starts = fail_starts
        self.missing = python_missing
        self.streams: list[_PipeStream] = []
        self.alone: list[Command] = []
        self.oom_looks = 0
        self.refuse_alone = False
        self.no_room = False

    @property
    def memory_limit(self) -> str:
        return "64m"

    def start_helper(self) -> MuxClient | None:
        if self.no_room:
            return None
        if self.fail_starts:
            self.fail_starts -= 1
            raise MuxBroken("exec helper did not say hello")
        stream = _PipeStream()
        self.streams.append(stream)
        return MuxClient(stream)

    def python_missing(self) -> bool:
        return self.missing

    def run_alone(self, command: Command, on_output: OutputHook | None) -> p.ExecuteResponse:
        if self.refuse_alone:
            raise _Refused("the engine refused")
        self.alone.append(command)
        return p.ExecuteResponse("alone\n", exit_code=0)

    def answer(self, error: Exception) -> p.ExecuteResponse | None:
        if isinstance(error, _Refused):
            return p.ExecuteResponse("", error=p.UNAVAILABLE, message=str(error))
        return None

    def oom_killed(self) -> bool:
        self.oom_looks += 1
        return True

    def close(self) -> None:
        for stream in self.streams:
            stream.close()


def _driver(toy: _Toy, enabled: bool = True, refuse: Refusal | None = None) -> HelperDriver:
    words = TransportWords(
        logging.getLogger("toy"),
        subject="toy",
        fallback="one process per command",
        restart="restarting it",
        command_lost="the toy's helper died during the command",
        file_op_lost="the toy's helper died during the file operation",
    )
    return HelperDriver(toy, words, DEFAULTS, enabled=enabled, refuse=refuse)


@pytest.fixture
def toy() -> Iterator[_Toy]:
    transport = _Toy()
    yield transport
    transport.close()


def test_a_command_runs_on_the_helper_with_the_sandboxs_defaults_under_its_own(toy: _Toy) -> None:
    driver = _driver(toy)
    seen: list[bytes] = []
    command = Command('echo "$FROM $MINE" && pwd', timeout=10, output_limit=1 << 20, env={"MINE": "call"})
    response = driver.execute(command, as_output_hook(seen.append))
    assert (response.exit_code, response.output) == (0, "sandbox call\n/\n")
    assert b"".join(seen) == b"sandbox call\n/\n"
    assert driver.alive
    assert toy.alone == []
    awaited = driver.awaited(command)
    assert isinstance(awaited, AwaitedCommand)
    assert awaited.command == command.within(DEFAULTS)


def test_a_failed_start_runs_the_command_alone_and_waits_before_the_next_start(toy: _Toy) -> None:
    toy.fail_starts = 1
    driver = _driver(toy)
    command = Command("echo hi", 10, 100, cwd="/tmp")
    assert driver.execute(command, None).output == "alone\n"
    assert toy.alone == [command.within(DEFAULTS)]
    assert driver.execute(command, None).output == "alone\n"  # its wait is not over: no start tried
    assert not driver.starts.unavailable
    assert driver.starts.failures == 1
    driver.starts.expire()
    assert driver.execute(Command("echo back", 10, 100), None).output == "back\n"
    assert driver.alive


def test_a_missing_python_gives_up_on_the_helper_for_good() -> None:
    toy = _Toy(fail_starts=1, python_missing=True)
    driver = _driver(toy)
    assert driver.execute(Command("true", 10, 100), None).output == "alone\n"
    assert driver.starts.unavailable
    assert driver.helper() is None


def test_the_transports_own_failure_is_answered_and_any_other_raised() -> None:
    toy = _Toy()
    driver = _driver(toy, enabled=False)
    toy.refuse_alone = True
    refused = driver.execute(Command("true", 10, 100), None)
    assert (refused.error, refused.message) == (p.UNAVAILABLE, "the engine refused")
    assert toy.oom_looks == 0, "an answer without an exit code was taken for an out-of-memory kill"
    toy.run_alone = lambda command, on_output: (_ for _ in ()).throw(KeyError("not the transport's"))  # type: ignore[method-assign]
    with pytest.raises(KeyError):
        driver.execute(Command("true", 10, 100), None)


def test_an_exit_137_is_asked_about_the_memory_cgroup_and_nothing_else_is(toy: _Toy) -> None:
    driver = _driver(toy)
    assert driver.execute(Command("exit 3", 10, 100), None).exit_code == 3
    assert toy.oom_looks == 0
    killed = driver.execute(Command("kill -9 $$", 10, 100), None)
    assert (killed.error, toy.oom_looks) == (p.OUT_OF_MEMORY, 1)
    assert "64m" in (killed.message or "")


def test_a_helper_that_broke_mid_command_answers_connection_lost_and_the_next_call_starts_another(
    toy: _Toy,
) -> None:
    driver = _driver(toy)
    assert driver.execute(Command("true", 10, 100), None).exit_code == 0
    first = driver.mux
    lost = driver.execute(Command(f"kill -9 {toy.streams[0].process.pid}; sleep 5", 10, 100), None)
    assert lost.error == p.CONNECTION_LOST
    assert (lost.message or "").startswith("the toy's helper died during the command")
    assert driver.execute(Command("echo again", 10, 100), None).output == "again\n"
    assert driver.mux is not first
    assert len(toy.streams) == 2


def test_close_lets_the_helper_go_and_kill_tagged_needs_a_running_one(toy: _Toy) -> None:
    driver = _driver(toy)
    assert driver.running() is None
    assert not driver.kill_tagged("TAG", "x")
    assert driver.helper() is not None
    assert driver.running() is driver.mux
    driver.close()
    assert driver.mux is None
    assert driver.running() is None


def test_a_transport_without_room_for_a_helper_runs_alone_and_counts_no_failure(toy: _Toy) -> None:
    """`HelperTransport.start_helper` answering ``None`` (SSH's channel slots kept for short
    channels): no backoff, so the next call asks again and gets a helper once there is room."""
    driver = _driver(toy)
    toy.no_room = True
    assert driver.execute(Command("true", 10, 100), None).output == "alone\n"
    assert driver.helper() is None
    assert (driver.starts.failures, driver.starts.unavailable) == (0, False)
    toy.no_room = False
    assert driver.execute(Command("echo room", 10, 100), None).output == "room\n"
    assert driver.alive


def test_a_refused_command_runs_nowhere_on_either_path(toy: _Toy) -> None:
    refusal = p.ExecuteResponse("", error=p.UNAVAILABLE, message="closed")
    asked: list[Command] = []

    def refuse(command: Command) -> p.ExecuteResponse | None:
        asked.append(command)
        return refusal if command.command == "refused" else None

    driver = _driver(toy, refuse=refuse)
    assert driver.execute(Command("refused", 10, 100), None) is refusal
    assert driver.awaited(Command("refused", 10, 100)) is refusal
    assert toy.streams == [], "a refused command started a helper"
    assert toy.alone == [], "a refused command ran alone"
    assert asked == [Command("refused", 10, 100).within(DEFAULTS)] * 2
    assert isinstance(driver.awaited(Command("fine", 10, 100)), AwaitedCommand)


def test_a_helper_found_dead_is_closed_before_the_next_starts(toy: _Toy) -> None:
    driver = _driver(toy)
    assert driver.execute(Command("true", 10, 100), None).exit_code == 0
    first = driver.mux
    assert first is not None
    first.close()  # dead without a drop: what it holds must not leak when the next one starts
    closed: list[MuxClient] = []
    real_close = MuxClient.close
    first.close = lambda: (closed.append(first), real_close(first))  # type: ignore[method-assign]
    assert driver.execute(Command("echo next", 10, 100), None).output == "next\n"
    assert closed == [first]
    assert driver.mux is not first
