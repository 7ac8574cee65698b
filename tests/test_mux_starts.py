"""`sandboxes._mux.HelperStarts`: when a transport may try its exec helper again after a failed
start. The transports' own tests (Docker, Kubernetes, Local) drive it through real failed starts;
here the waits themselves, which those tests skip with ``expire``."""

from __future__ import annotations

import logging

import pytest

from sandboxes._mux import HelperStarts, python_missing
from sandboxes._mux._starts import MAX_RETRY_AFTER


def test_each_failure_in_a_row_doubles_the_wait_up_to_its_cap() -> None:
    starts = HelperStarts(retry_after=30.0)
    assert starts.due
    waits = []
    for _ in range(7):
        starts.failed(for_good=False)
        assert not starts.due
        waits.append(starts.wait)
        starts.expire()
    assert waits == [30.0, 60.0, 120.0, 240.0, 480.0, MAX_RETRY_AFTER, MAX_RETRY_AFTER]
    assert not starts.unavailable


def test_a_start_that_succeeds_makes_the_next_failure_the_first_again() -> None:
    starts = HelperStarts(retry_after=30.0)
    starts.failed(for_good=False)
    assert starts.log_level == logging.WARNING
    starts.failed(for_good=False)
    assert starts.log_level == logging.DEBUG, "a failure that repeats is reported at every try"
    starts.started()
    starts.failed(for_good=False)
    assert starts.wait == 30.0
    assert starts.log_level == logging.WARNING


def test_only_a_missing_python_gives_up_for_good() -> None:
    starts = HelperStarts()
    starts.failed(for_good=True)
    assert starts.unavailable
    assert not starts.due
    assert not HelperStarts(enabled=False).due


def test_only_the_shells_own_no_says_python_is_missing() -> None:
    assert python_missing("no\n")
    for answer in ("yes\n", "", "OCI runtime exec failed: read init-p: connection reset by peer", "no such file"):
        assert not python_missing(answer), answer


def test_a_failure_is_reported_once_loudly_then_quietly(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("sandboxes.test.starts")
    starts = HelperStarts(retry_after=30.0)
    with caplog.at_level(logging.DEBUG, logger=log.name):
        for _ in range(2):
            starts.failed(for_good=False)
            starts.report(log, "box", "no hello", "one exec per command")
        starts.failed(for_good=True)
        starts.report(log, "box", "not found", "one exec per command")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "exec helper of box did not start (no hello); one exec per command for 30 s"),
        (logging.DEBUG, "exec helper of box did not start (no hello); one exec per command for 60 s"),
        (logging.WARNING, "no python3 in box (not found): one exec per command"),
    ]
