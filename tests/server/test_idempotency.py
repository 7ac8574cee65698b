"""One flight per key: a create whose request is abandoned while its sandbox is being made
still finishes, and the creates that come meanwhile with the same key answer that sandbox
instead of making another."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest

from sandboxes.api import CreateSandbox
from sandboxes.lifecycle import SandboxNameTaken
from sandboxes.server import idempotency
from sandboxes.server.errors import ServiceError
from sandboxes.server.idempotency import Idempotency, Keyed

KEYED = Keyed("key-digest", "request-digest")


async def test_a_create_abandoned_midway_still_answers_its_key() -> None:
    made: list[str] = []
    started, finish = asyncio.Event(), asyncio.Event()

    async def find() -> tuple[str, str] | None:
        return None  # what a backend shows while its create is under way: nothing yet

    async def make() -> str:
        made.append(f"sandbox-{len(made) + 1}")
        started.set()
        await finish.wait()  # the backend's create, which goes on whatever the request does
        return made[-1]

    keys: Idempotency[str] = Idempotency()
    first = asyncio.ensure_future(keys.create(KEYED, find, make))
    await asyncio.wait_for(started.wait(), 10)
    first.cancel()  # the request is abandoned while its sandbox is being made
    with pytest.raises(asyncio.CancelledError):
        await first
    retry = asyncio.ensure_future(keys.create(KEYED, find, make))
    finish.set()
    assert await asyncio.wait_for(retry, 10) == ("sandbox-1", True)
    assert made == ["sandbox-1"], "the retry made a second sandbox"


async def test_a_failed_flight_leaves_its_waiters_to_try_themselves() -> None:
    calls: list[str] = []
    started, finish = asyncio.Event(), asyncio.Event()

    async def find() -> tuple[str, str] | None:
        return None

    async def make() -> str:
        calls.append("make")
        if len(calls) == 1:
            started.set()
            await finish.wait()
            raise RuntimeError("the backend failed")
        return "sandbox-2"

    keys: Idempotency[str] = Idempotency()
    first = asyncio.ensure_future(keys.create(KEYED, find, make))
    await asyncio.wait_for(started.wait(), 10)
    waiter = asyncio.ensure_future(keys.create(KEYED, find, make))
    finish.set()
    with pytest.raises(RuntimeError):
        await first
    assert await asyncio.wait_for(waiter, 10) == ("sandbox-2", False)
    assert calls == ["make", "make"]


async def _taken() -> str:
    raise SandboxNameTaken("another replica's create holds the key's name")


async def test_a_create_refused_by_the_backends_name_answers_the_winner_once_made() -> None:
    """Another replica won the key's name and its sandbox is still starting (not found yet): the
    loser waits for it rather than answering a half-made sandbox or making another."""
    looked, made = asyncio.Event(), asyncio.Event()
    looks = 0

    async def find() -> tuple[str, str] | None:
        nonlocal looks
        looks += 1
        if looks > 3:
            looked.set()  # the loser has looked again and again while the winner starts
        return ("winner", KEYED.request) if made.is_set() else None

    keys: Idempotency[str] = Idempotency()
    loser = asyncio.ensure_future(keys.create(KEYED, find, _taken))
    await asyncio.wait_for(looked.wait(), 10)
    assert not loser.done()
    made.set()
    assert await asyncio.wait_for(loser, 10) == ("winner", True)


async def test_the_winner_with_another_body_is_a_422() -> None:
    """The other replica's create with this key had another body: this one is refused."""
    looks: list[str] = []

    async def find() -> tuple[str, str] | None:
        looks.append("look")
        return None if len(looks) == 1 else ("winner", "another-request")

    keys: Idempotency[str] = Idempotency()
    with pytest.raises(ServiceError) as refused:
        await asyncio.wait_for(keys.create(KEYED, find, _taken), 10)
    assert refused.value.code == "invalid_request"


async def test_a_winner_never_made_is_a_bounded_503(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idempotency, "WINNER_WAIT", 0.3)

    async def find() -> tuple[str, str] | None:
        return None

    keys: Idempotency[str] = Idempotency()
    with pytest.raises(ServiceError) as refused:
        await asyncio.wait_for(keys.create(KEYED, find, _taken), 10)
    assert refused.value.code == "backend_unavailable"
    assert refused.value.headers["Retry-After"] == "5"


async def test_a_name_freed_by_a_failed_winner_is_taken() -> None:
    """The other replica's create failed and its half-made sandbox was removed: the name is free,
    and this create makes the key's sandbox instead of waiting for one that will never come."""
    tries: list[str] = []

    async def find() -> tuple[str, str] | None:
        return None

    async def make() -> str:
        tries.append("try")
        if len(tries) < 3:
            raise SandboxNameTaken("the failed winner's sandbox is still being removed")
        return "mine"

    keys: Idempotency[str] = Idempotency()
    assert await asyncio.wait_for(keys.create(KEYED, find, make), 10) == ("mine", False)


def test_the_request_digest_holds_the_egress_allow_list_only_when_given() -> None:
    plain = CreateSandbox(template="default")
    before = hashlib.sha256(
        json.dumps(
            plain.model_dump(mode="json", exclude={"egress_allow", "on_timeout"}),
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
    ).hexdigest()[:32]
    assert idempotency.request_digest(plain) == before  # what a create without one hashed to before
    digests = {
        idempotency.request_digest(CreateSandbox(egress_allow=allow))
        for allow in (None, [], ["example.com"], ["example.com:443"])
    }
    assert len(digests) == 4
    on_timeout = {idempotency.request_digest(CreateSandbox(on_timeout=end)) for end in ("freeze", "hibernate")}
    assert len(on_timeout | {before}) == 3


async def test_lookups_that_ask_during_a_read_share_the_next_one_started_after_them() -> None:
    reads: list[frozenset[str]] = []
    records: list[tuple[str, str]] = [("k0", "old")]
    first_read, release = asyncio.Event(), asyncio.Event()

    async def read(keys: frozenset[str]) -> list[tuple[str, str]]:
        reads.append(keys)
        seen = list(records)  # what the backend holds when the read starts
        first_read.set()
        await release.wait()
        return [record for record in seen if record[0] in keys]

    lookups: idempotency.Lookups[tuple[str, str]] = idempotency.Lookups(read, lambda record: record[0])
    first = asyncio.ensure_future(lookups.find("k0"))
    await asyncio.wait_for(first_read.wait(), 10)
    records.append(("k1", "made after the first read started"))
    later = [asyncio.ensure_future(lookups.find(f"k{i}")) for i in range(1, 11)]
    await asyncio.sleep(0)  # the later lookups are queued: none joins the read under way
    release.set()
    assert await asyncio.wait_for(first, 10) == [("k0", "old")]
    answers = await asyncio.wait_for(asyncio.gather(*later), 10)
    assert answers[0] == [("k1", "made after the first read started")]  # the read it waited for saw it
    assert answers[1:] == [[] for _ in range(9)]
    assert reads == [frozenset({"k0"}), frozenset(f"k{i}" for i in range(1, 11))]  # two reads for eleven


async def test_a_failed_read_fails_every_lookup_it_served_and_the_next_reads_again() -> None:
    failing = True

    async def read(keys: frozenset[str]) -> list[str]:
        if failing:
            raise ServiceError("backend_unavailable", "the backend's records cannot be read now")
        return sorted(keys)

    lookups: idempotency.Lookups[str] = idempotency.Lookups(read, lambda record: record)
    answers = await asyncio.gather(*(lookups.find(f"k{i}") for i in range(3)), return_exceptions=True)
    assert [getattr(a, "code", a) for a in answers] == ["backend_unavailable"] * 3
    failing = False
    assert await asyncio.wait_for(lookups.find("k9"), 10) == ["k9"]
