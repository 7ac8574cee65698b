"""One flight per key: a create whose request is abandoned while its sandbox is being made
still finishes, and the creates that come meanwhile with the same key answer that sandbox
instead of making another."""

from __future__ import annotations

import asyncio

import pytest

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
