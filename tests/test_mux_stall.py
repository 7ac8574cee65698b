"""`sandboxes._mux._stall.SendWatch`: a send that stops taking frames is acted on once, after
`STALL`; one that goes on taking them, however slowly, never is. (The watch on a real stopped
helper, on every transport: ``test_a_stopped_*`` in the backends' tests.)"""

from __future__ import annotations

import threading
import time

import pytest

from sandboxes._mux import _stall as stall


@pytest.fixture(autouse=True)
def short_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stall, "STALL", 0.4)


def test_a_send_that_takes_no_frame_is_acted_on_once_after_the_stall() -> None:
    reasons: list[str] = []
    acted = threading.Event()

    def on_stall(reason: str) -> None:
        reasons.append(reason)
        acted.set()

    started = time.monotonic()
    with stall.SendWatch(on_stall):
        assert acted.wait(10)
        waited = time.monotonic() - started
        time.sleep(1.0)  # four more stalls' worth: no second call
    assert waited >= 0.4
    assert reasons == ["exec helper took no input for 0.4s (stopped?); closed"]


def test_a_slow_send_that_keeps_taking_frames_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stall, "STALL", 1.0)  # a loaded machine may be late by a good part of it
    acted = threading.Event()
    with stall.SendWatch(lambda _reason: acted.set()) as watch:
        for _ in range(10):  # 2.5 s: two and a half stalls' worth, a frame every quarter of one
            time.sleep(0.25)
            watch.sent()
    assert not acted.is_set()


def test_a_watch_ended_in_time_never_acts() -> None:
    acted = threading.Event()
    with stall.SendWatch(lambda _reason: acted.set()):
        pass
    assert not acted.wait(1.0)
