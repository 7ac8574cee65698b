"""A file watch in the exec helper (`sandboxes._helper._watch`): an R request whose spec holds
``watch`` streams what happens under a directory as JSON lines, on every stream variant of the
helper; the one without ctypes watches by polling and must report the same kinds."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_mux import _TIMED, _VARIANTS, _PipeStream, _TimedPipeStream

from sandboxes._calls import write_call
from sandboxes._mux import Channel, Command, MuxClient, open_channel, watch_spec
from sandboxes._output import Stream

_NO_CTYPES = "no-subreaper"
"""The variant whose helper has no ctypes (`test_mux._VARIANTS`): no inotify, so it polls."""
_POLL = 0.05  # seconds between a polling watch's scans, here
_NO_COMMAND = Command("", timeout=10, output_limit=0)
"""A watch's channel runs no command; its timeout bounds it."""


@dataclass
class _Helper:
    mux: MuxClient
    pipe: _PipeStream
    variant: str


@pytest.fixture(params=[*_VARIANTS, _TIMED])
def helper(request: pytest.FixtureRequest) -> Iterator[_Helper]:
    pipe = _TimedPipeStream() if request.param == _TIMED else _PipeStream(_VARIANTS[request.param])
    mux = MuxClient(pipe)
    yield _Helper(mux, pipe, request.param)
    mux.close()
    pipe.close()


class _Events:
    """The watch's lines as the reader hands them over, parsed, and a condition to wait on."""

    def __init__(self) -> None:
        self.events: list[dict[str, str]] = []
        self._partial = b""
        self._changed = threading.Condition()

    def __call__(self, chunk: bytes, stream: Stream = "stdout") -> None:
        assert stream == "stdout", chunk
        with self._changed:
            *lines, self._partial = (self._partial + chunk).split(b"\n")
            self.events.extend(json.loads(line) for line in lines)
            self._changed.notify_all()

    def wait_for(self, wanted: Callable[[list[dict[str, str]]], bool]) -> list[dict[str, str]]:
        with self._changed:
            assert self._changed.wait_for(lambda: wanted(self.events), timeout=10), self.events
            return list(self.events)

    def wait_event(self, kind: str, name: str) -> None:
        self.wait_for(lambda events: {"type": kind, "name": name} in events)

    def names(self, kind: str) -> list[str]:
        with self._changed:
            return [event["name"] for event in self.events if event["type"] == kind]


def _watch(helper: _Helper, path: Path, *, timeout: float = 60, **options: object) -> tuple[Channel, _Events]:
    """A watch of ``path``, once its start line came (the watch is in place)."""
    events = _Events()
    spec = watch_spec(str(path), poll_interval=_POLL, **options)  # type: ignore[arg-type]
    channel = open_channel(helper.mux, Command("", timeout=timeout, output_limit=0), on_output=events, spec=spec)
    events.wait_for(lambda seen: bool(seen) or channel.done)
    return channel, events


def test_every_kind_of_event_is_reported(helper: _Helper, tmp_path: Path) -> None:
    channel, events = _watch(helper, tmp_path)
    method = "poll" if helper.variant == _NO_CTYPES else "inotify"
    assert events.events[0] == {"type": "start", "method": method}
    file = tmp_path / "a.txt"
    file.touch()
    events.wait_event("create", "a.txt")
    file.write_text("hello")
    events.wait_event("write", "a.txt")
    file.chmod(0o600)
    events.wait_event("chmod", "a.txt")
    file.rename(tmp_path / "b.txt")
    events.wait_event("rename", "a.txt")
    events.wait_event("create", "b.txt")
    (tmp_path / "b.txt").unlink()
    events.wait_event("remove", "b.txt")
    channel.kill()
    answer = channel.wait(10)
    assert answer is not None
    assert (answer.exit_code, answer.error) == (0, None)


def test_a_recursive_watch_follows_new_subdirectories_and_the_tree_there_at_its_start(
    helper: _Helper, tmp_path: Path
) -> None:
    (tmp_path / "old" / "deeper").mkdir(parents=True)
    channel, events = _watch(helper, tmp_path, recursive=True)
    (tmp_path / "old" / "deeper" / "f").write_text("x")
    events.wait_event("create", "old/deeper/f")
    (tmp_path / "new" / "inner").mkdir(parents=True)  # made at once: inner may come before new's watch
    (tmp_path / "new" / "inner" / "g").write_text("y")
    events.wait_event("create", "new/inner/g")
    (tmp_path / "new" / "inner" / "g").write_text("changed")
    events.wait_event("write", "new/inner/g")
    channel.kill()
    assert channel.wait(10) is not None


def test_a_plain_watch_reports_only_its_directorys_own_entries(helper: _Helper, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    channel, events = _watch(helper, tmp_path)
    (tmp_path / "sub" / "hidden").write_text("x")
    (tmp_path / "seen").write_text("x")  # after the other: once it is reported, the other would be
    events.wait_event("create", "seen")
    assert not any("hidden" in event.get("name", "") for event in events.events), events.events
    channel.kill()
    assert channel.wait(10) is not None


def test_events_past_the_bound_are_dropped_behind_one_overflow(helper: _Helper, tmp_path: Path) -> None:
    channel, events = _watch(helper, tmp_path, max_events=5)
    os.kill(helper.pipe.process.pid, signal.SIGSTOP)  # the helper reads nothing: the events pile up
    try:
        for number in range(40):
            (tmp_path / f"f{number:02}").touch()
    finally:
        os.kill(helper.pipe.process.pid, signal.SIGCONT)
    events.wait_for(lambda seen: {"type": "overflow"} in seen)
    (tmp_path / "last").touch()
    events.wait_event("create", "last")
    created = [name for name in events.names("create") if name.startswith("f")]
    assert 0 < len(created) <= 10  # a read or a scan gives at most 5, and the 40 came in one or two
    assert events.events.count({"type": "overflow"}) >= 1
    channel.kill()
    assert channel.wait(10) is not None


def test_a_tree_past_the_bound_of_watches_says_overflow_at_the_start(helper: _Helper, tmp_path: Path) -> None:
    for name in ("a", "b", "c", "d"):
        (tmp_path / name).mkdir()
    bound = {"max_entries": 2} if helper.variant == _NO_CTYPES else {"max_watches": 2}
    channel, events = _watch(helper, tmp_path, recursive=True, **bound)
    events.wait_for(lambda seen: {"type": "overflow"} in seen)
    channel.kill()
    assert channel.wait(10) is not None


def test_a_missing_path_or_a_file_is_an_error_with_its_reason(helper: _Helper, tmp_path: Path) -> None:
    answer = open_channel(helper.mux, _NO_COMMAND, spec=watch_spec(str(tmp_path / "gone"))).wait(10)
    assert answer is not None
    assert answer.error == "file_not_found"
    assert "gone" in (answer.message or "")
    (tmp_path / "file").touch()
    answer = open_channel(helper.mux, _NO_COMMAND, spec=watch_spec(str(tmp_path / "file"))).wait(10)
    assert answer is not None
    assert answer.error is not None
    assert "NotADirectoryError" in (answer.message or "")
    answer = open_channel(helper.mux, _NO_COMMAND, spec={**watch_spec(""), "watch": {"recursive": True}}).wait(10)
    assert answer is not None
    assert "a watch needs the path of a directory" in (answer.message or "")
    assert helper.mux.run(Command("echo still", timeout=10, output_limit=100)).output == "still\n"


def test_the_channels_timeout_ends_the_watch(helper: _Helper, tmp_path: Path) -> None:
    channel, _events = _watch(helper, tmp_path, timeout=0.5)
    answer = channel.wait(10)
    assert answer is not None
    assert answer.error == "timeout"


def test_removing_the_watched_directory_ends_the_watch(helper: _Helper, tmp_path: Path) -> None:
    watched = tmp_path / "w"
    watched.mkdir()
    channel, events = _watch(helper, watched)
    watched.rmdir()
    answer = channel.wait(10)
    assert answer is not None
    assert answer.exit_code == 0
    assert {"type": "remove", "name": ""} in events.events


def test_watches_and_commands_share_the_helper(helper: _Helper, tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first, seen_first = _watch(helper, tmp_path / "one")
    second, seen_second = _watch(helper, tmp_path / "two")
    answer = helper.mux.run(
        Command(f"echo x > {tmp_path}/one/f && echo y > {tmp_path}/two/g", timeout=10, output_limit=100)
    )
    assert answer.exit_code == 0
    seen_first.wait_event("create", "f")
    seen_second.wait_event("create", "g")
    assert "g" not in seen_first.names("create")
    first.kill()
    assert first.wait(10) is not None
    (tmp_path / "two" / "h").touch()
    seen_second.wait_event("create", "h")  # the other watch outlives the first
    second.kill()
    assert second.wait(10) is not None


_NO_INSTANCE_LEFT = """import ctypes
class _Libc(object):
    def __init__(self, real):
        self.real = real
    def __getattr__(self, name):
        if name == "inotify_init1":
            return lambda flags: -1  # as at the user's max_user_instances (EMFILE)
        return getattr(self.real, name)
_real_cdll = ctypes.CDLL
ctypes.CDLL = lambda *args, **kwargs: _Libc(_real_cdll(*args, **kwargs))
"""


@pytest.mark.parametrize("variant", [name for name in [*_VARIANTS, _TIMED] if name != _NO_CTYPES])
def test_a_writes_events_go_out_before_its_answer(variant: str, tmp_path: Path) -> None:
    """A native write is answered after every inotify watch (the variants with ctypes) sent what
    the write made: a poll right after the answer finds its events, none waited for (the E2B
    SDK's sync watch reads them so: `sandboxes.server.e2b.watch`)."""
    pipe = _TimedPipeStream() if variant == _TIMED else _PipeStream(_VARIANTS[variant])
    helper = _Helper(MuxClient(pipe), pipe, variant)
    try:
        _write_then_find(helper, tmp_path)
    finally:
        helper.mux.close()
        pipe.close()


def _write_then_find(helper: _Helper, tmp_path: Path) -> None:
    channel, events = _watch(helper, tmp_path)
    for round_ in range(3):
        target = tmp_path / f"written-{round_}.txt"
        call = write_call(str(target), b"x")
        assert call.native is not None
        answer = helper.mux.run_native(call.native, call.stdin, timeout=30, output_limit=4096)
        assert answer is not None
        assert answer.exit_code == 0, answer
        assert target.name in events.names("create"), events.events  # no wait: there already
    channel.kill()


def test_a_kernel_without_an_inotify_instance_left_is_polled(tmp_path: Path) -> None:
    pipe = _PipeStream(_NO_INSTANCE_LEFT)
    mux = MuxClient(pipe)
    try:
        channel, events = _watch(_Helper(mux, pipe, "no inotify instance"), tmp_path, recursive=True)
        assert events.events[0] == {"type": "start", "method": "poll"}
        (tmp_path / "sub").mkdir()
        events.wait_event("create", "sub")
        (tmp_path / "sub" / "f").write_text("x")
        events.wait_event("create", "sub/f")
        channel.kill()
        assert channel.wait(10) is not None
    finally:
        mux.close()
        pipe.close()
