"""`SandboxState.settle_pause`, every combination of a pause's intent (what a ``kill -9`` left
in the state file) and what the backend says at the restart: frozen, the pause is completed as
asked; running, one asked for is undone and one at its timeout stays to be made again. And
`SandboxState.take_recorded` carries the intent from the state file over a shared record."""

from __future__ import annotations

import pytest

from sandboxes.server.store import PAUSED_AT_TIMEOUT, SandboxState


def _state(**changes: object) -> SandboxState:
    state = SandboxState(
        id="s1", tenant="alice", template="default", backend="docker", created_at=0.0, expires_at=100.0,
        cpus=1.0, memory=1, ref="c1", workdir="/w",
    )  # fmt: skip
    for name, value in changes.items():
        setattr(state, name, value)
    return state


@pytest.mark.parametrize(
    ("intent", "frozen", "paused", "left", "expires_at", "remaining"),
    [
        ("keep", True, "keep", "", 100.0, 0.0),
        ("stop", True, "stop", "", 5000.0, 40.0),  # guarded past its old expiry
        (PAUSED_AT_TIMEOUT, True, PAUSED_AT_TIMEOUT, "", 100.0, 40.0),
        ("keep", False, "", "", 100.0, 0.0),
        ("stop", False, "", "", 100.0, 0.0),  # undone: the expiry it had, nothing to give back
        (PAUSED_AT_TIMEOUT, False, "", PAUSED_AT_TIMEOUT, 100.0, 40.0),  # made again once held
    ],
)
def test_an_interrupted_pause_is_completed_or_undone_by_what_the_backend_says(
    intent: str, frozen: bool, paused: str, left: str, expires_at: float, remaining: float
) -> None:
    state = _state(pause_intent=intent, paused_remaining=0.0 if intent == "keep" else 40.0)
    assert state.kept_beside_record  # its intent stays beside a shared record until settled
    state.settle_pause(frozen, guarded_until=5000.0)
    assert (state.paused, state.pause_intent) == (paused, left)
    assert (state.expires_at, state.paused_remaining) == (expires_at, remaining)


def test_a_shared_record_takes_the_intent_and_the_later_expiry_of_its_state_file() -> None:
    recorded = _state(paused="keep")  # its container's labels: frozen, its old expiry
    recorded.take_recorded(_state(pause_intent=PAUSED_AT_TIMEOUT, paused_remaining=3600.0, expires_at=86500.0))
    assert (recorded.pause_intent, recorded.paused_remaining, recorded.expires_at) == (
        PAUSED_AT_TIMEOUT, 3600.0, 86500.0,
    )  # fmt: skip
    recorded.settle_pause(frozen=True)
    assert (recorded.paused, recorded.pause_intent) == (PAUSED_AT_TIMEOUT, "")


@pytest.mark.parametrize("paused", ["stop", PAUSED_AT_TIMEOUT])
@pytest.mark.parametrize("thawed", [True, False])
def test_an_interrupted_resume_is_completed_if_thawed_and_dropped_if_still_frozen(paused: str, thawed: bool) -> None:
    state = _state(paused=paused, paused_remaining=40.0, expires_at=90000.0, resume_expiry=140.0)
    assert state.kept_beside_record  # its intent stays beside a shared record until settled
    state.settle_resume(thawed)
    expected = ("", 0.0, 140.0) if thawed else (paused, 40.0, 90000.0)  # the TTL given back, or still guarded
    assert (state.paused, state.paused_remaining, state.expires_at, state.resume_expiry) == (*expected, 0.0)


def test_a_running_shared_record_takes_the_resume_under_way_of_its_state_file() -> None:
    recorded = _state(expires_at=90000.0)  # its container's labels: running, the pause's guarded expiry
    recorded.take_recorded(_state(paused="stop", paused_remaining=40.0, expires_at=90000.0, resume_expiry=140.0))
    recorded.settle_resume(thawed=True)
    assert (recorded.paused, recorded.expires_at, recorded.resume_expiry) == ("", 140.0, 0.0)
