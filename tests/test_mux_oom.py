"""`sandboxes._mux.OomCount`: the OOM-kill count the Docker and Kubernetes transports share."""

from __future__ import annotations

from sandboxes._mux import OomCount


def test_a_kill_is_a_count_above_the_last_one_seen() -> None:
    count = OomCount()
    assert count.killed("1")  # the first look: any kill counts
    assert not count.killed("1")
    assert count.killed("3")
    assert not count.killed("")  # a cgroup that does not tell: no kill, and nothing remembered
    assert count.killed("3")


def test_after_forget_the_next_look_is_the_first() -> None:
    count = OomCount()
    assert not count.killed("0")
    assert count.killed("2")
    count.forget()
    assert count.killed("2")
    assert not count.killed("2")
