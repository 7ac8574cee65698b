"""A tenant's command slots: past its cap a command waits its turn for a bounded time, is
handed the first slot that ends (in the order the waiters came), else is refused with a
``Retry-After``; a waiter that leaves gives back what it was handed."""

from __future__ import annotations

import asyncio

import pytest

from sandboxes.server.auth import CommandSlots
from sandboxes.server.errors import ServiceError
from sandboxes.server.settings import TenantPolicy

ONE = TenantPolicy(max_commands=1)


async def test_a_waiter_gets_the_slot_that_ends() -> None:
    slots = CommandSlots()
    release = await slots.acquire("a", ONE, wait=30)
    waiting = asyncio.ensure_future(slots.acquire("a", ONE, wait=30))
    await asyncio.sleep(0)  # it queued
    assert not waiting.done()
    release()
    second = await asyncio.wait_for(waiting, 10)
    assert slots.running("a") == 1
    second()
    assert slots.running("a") == 0


async def test_waiters_are_served_in_the_order_they_came() -> None:
    slots = CommandSlots()
    release = await slots.acquire("a", ONE, wait=30)
    order: list[int] = []

    async def waiter(n: int) -> None:
        done = await slots.acquire("a", ONE, wait=30)
        order.append(n)
        done()

    waiters = []
    for n in range(3):
        waiters.append(asyncio.ensure_future(waiter(n)))
        await asyncio.sleep(0)
    release()
    await asyncio.wait_for(asyncio.gather(*waiters), 10)
    assert order == [0, 1, 2]
    assert slots.running("a") == 0


async def test_a_wait_that_ends_unserved_is_a_429_with_retry_after() -> None:
    slots = CommandSlots()
    release = await slots.acquire("a", ONE, wait=30)
    with pytest.raises(ServiceError) as refused:
        await slots.acquire("a", ONE, wait=0.05)
    assert (refused.value.status, refused.value.headers) == (429, {"Retry-After": "1"})
    assert "after waiting 0.05s" in refused.value.message
    other = await slots.acquire("b", ONE, wait=0.05)  # another tenant's slots are its own
    other()
    release()
    (await slots.acquire("a", ONE, wait=0))()  # the refused waiter left nothing queued
    assert slots.running("a") == 0


async def test_a_waiter_that_leaves_gives_its_turn_back() -> None:
    slots = CommandSlots()
    release = await slots.acquire("a", ONE, wait=30)
    leaving = asyncio.ensure_future(slots.acquire("a", ONE, wait=30))
    await asyncio.sleep(0)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    release()
    assert slots.running("a") == 0
    (await slots.acquire("a", ONE, wait=0))()


async def test_a_waiter_that_leaves_once_handed_a_slot_passes_it_on() -> None:
    slots = CommandSlots()
    release = await slots.acquire("a", ONE, wait=30)
    leaving = asyncio.ensure_future(slots.acquire("a", ONE, wait=30))
    await asyncio.sleep(0)
    release()  # handed to the waiter, which leaves before it wakes
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert slots.running("a") == 0
