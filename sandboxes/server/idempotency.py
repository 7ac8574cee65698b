"""Idempotent creation: per tenant, an ``Idempotency-Key`` names the one sandbox it created.

A create that carries a key the tenant used before answers the sandbox that key made, as long
as that sandbox lives (its TTL is at most ``max_ttl``, a day by default): 201 with its current
`SandboxInfo` and the header ``Idempotent-Replayed: true``, whatever happened to the first
answer (lost on the way, or never sent because the service was killed). The same key with
another request body is refused (422 ``invalid_request``): it names another creation.

The key is recorded on the sandbox itself, as a digest (`key_digest`) beside the digest of its
request: a label of a container or pod, a label in a local sandbox's record and state file. So
a restarted service, and every replica of a shared backend, finds what a key made by looking,
not by remembering; nothing else is kept. Concurrent creates with one key on this service make
one flight (`Idempotency`): the first creates, the others wait for its answer. Across replicas
the backend arbitrates: the key also names the sandbox on the backend, which refuses a second
sandbox of that name (`SandboxNameTaken`), and the replica refused answers the winner's sandbox
once it is made (`_find_or_make`), never a second one.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sandboxes.api import CreateSandbox
from sandboxes.lifecycle import SandboxNameTaken
from sandboxes.server.errors import ServiceError

__all__ = [
    "DESCRIPTION",
    "HEADER",
    "KEY_PATTERN",
    "MAX_KEY_LENGTH",
    "REPLAYED_HEADER",
    "Idempotency",
    "Keyed",
    "Lookups",
    "keyed",
]

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
"""``true`` on the answer of a create that found the sandbox its key had made."""
MAX_KEY_LENGTH = 255
KEY_PATTERN = r"^[!-~](?:[ -~]{0,253}[!-~])?$"
"""What `keyed` takes, as the OpenAPI document states it: printable ASCII, no space at either end
(HTTP strips those)."""
DESCRIPTION = (
    "A key of the client's (a fresh UUID per sandbox it means to create, the same on every retry "
    "of that create): while the sandbox it made lives, a create with the same key and body answers "
    f"that sandbox (201, `{REPLAYED_HEADER}: true`); the same key with another body is a 422."
)

WINNER_WAIT = 150.0
"""Seconds a create refused by the backend's name waits for the sandbox that took the name to
be made (longer than a backend takes to start one) before answering 503."""

_E = TypeVar("_E")
_S = TypeVar("_S")


@dataclass(frozen=True, slots=True)
class Keyed:
    """A keyed create: the digest of its tenant's key, and of its request."""

    key: str
    request: str


def key_digest(tenant: str, key: str) -> str:
    """What a sandbox records of its tenant's key: never the key, and a valid label value on
    every backend (32 hex digits); another tenant's same key has another digest."""
    return hashlib.sha256(f"{tenant}\0{key}".encode()).hexdigest()[:32]


def request_digest(request: CreateSandbox) -> str:
    """The same for two bodies that ask for the same sandbox, whatever their key order (a
    create without an egress allow-list or an ``on_timeout`` hashes as it did before there were)."""
    fields = request.model_dump(mode="json")
    if fields.get("egress_allow") is None:
        fields.pop("egress_allow", None)
    if fields.get("on_timeout") == "delete":
        fields.pop("on_timeout", None)
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def keyed(tenant: str, key: str | None, request: CreateSandbox) -> Keyed | None:
    """The digests of a create's ``Idempotency-Key`` (``None``: it sent none); a key that is
    empty, longer than `MAX_KEY_LENGTH` or not printable ASCII is ``invalid_request``."""
    if key is None:
        return None
    if not key or len(key) > MAX_KEY_LENGTH or not all(" " <= c <= "~" for c in key):
        raise ServiceError(
            "invalid_request", f"{HEADER} must be 1 to {MAX_KEY_LENGTH} printable ASCII characters (a UUID, say)"
        )
    return Keyed(key_digest(tenant, key), request_digest(request))


def check_same(made_by: str, keyed: Keyed) -> None:
    """Refuse a key reused for another request than the one that made its sandbox."""
    if made_by and made_by != keyed.request:
        raise ServiceError(
            "invalid_request",
            f"this {HEADER} was used for a create with another body; use a new key for a new sandbox",
        )


Found = Callable[[], Awaitable["tuple[_E, str] | None"]]
"""Looks for the live sandbox a key made (held here or recorded on a backend), with the digest
of the request that made it; ``None`` if there is none."""


class Idempotency(Generic[_E]):
    """The keyed creates under way on this service: one flight per key digest, which the
    creates with the same key that come meanwhile wait for instead of creating. A flight runs
    to its end even when the request that started it is abandoned: its sandbox is being made
    all the same, and a retry must find it, not make another."""

    def __init__(self) -> None:
        self._flights: dict[str, tuple[str, asyncio.Future[tuple[_E, bool]]]] = {}

    async def create(self, keyed: Keyed, find: Found[_E], make: Callable[[], Awaitable[_E]]) -> tuple[_E, bool]:
        """The sandbox of ``keyed``'s key: the one it made (``True``: a replay), or a new one
        made by ``make`` (``False``). A flight that fails leaves its waiters to try themselves."""
        while (flight := self._flights.get(keyed.key)) is not None:
            check_same(flight[0], keyed)
            await asyncio.wait({flight[1]})  # the flight's own failure is not this request's
            if not flight[1].cancelled() and flight[1].exception() is None:
                return flight[1].result()[0], True
        work = asyncio.ensure_future(self._flight(keyed, find, make))
        work.add_done_callback(functools.partial(self._landed, keyed.key))
        self._flights[keyed.key] = (keyed.request, work)
        return await asyncio.shield(work)

    async def _flight(self, keyed: Keyed, find: Found[_E], make: Callable[[], Awaitable[_E]]) -> tuple[_E, bool]:
        try:
            return await _find_or_make(keyed, find, make)
        finally:  # gone before its answer is: nobody waits on a flight that ended
            del self._flights[keyed.key]

    def _landed(self, key: str, work: asyncio.Future[Any]) -> None:
        """Also a flight cancelled before it ran is gone; a failure is its starter's to report
        (once that one left, nobody's)."""
        if (flight := self._flights.get(key)) is not None and flight[1] is work:
            del self._flights[key]
        if not work.cancelled():
            work.exception()


async def _find_or_make(keyed: Keyed, find: Found[_E], make: Callable[[], Awaitable[_E]]) -> tuple[_E, bool]:
    """Look, else make; a make refused by the backend's name (another replica's create with this
    key holds it, perhaps still starting) looks and tries again until `WINNER_WAIT`: the
    winner once made is the answer, and a name freed (its create failed) is this one's to take."""
    deadline, pause = time.monotonic() + WINNER_WAIT, 0.05
    while (found := await find()) is None:
        try:
            return await make(), False
        except SandboxNameTaken:
            if time.monotonic() + pause > deadline:
                raise ServiceError(
                    "backend_unavailable",
                    f"another create with this {HEADER} has not made its sandbox yet; retry with the same key",
                    headers={"Retry-After": "5"},
                ) from None
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)
    check_same(found[1], keyed)
    return found[0], True


class Lookups(Generic[_S]):
    """Reads of the records of some keys (what key digests made; a tenant's, for its quota),
    coalesced: a lookup waits for the first read that starts after it asked (never one already
    under way), and the lookups that ask while a read runs share the next one, so a burst of
    creates reads the records a few times, not once each. ``read`` answers the records of any
    of the keys it is given (``key_of`` a record's key); a failed read fails every lookup it served."""

    def __init__(self, read: Callable[[frozenset[str]], Awaitable[list[_S]]], key_of: Callable[[_S], str]) -> None:
        self._read = read
        self._key_of = key_of
        self._next: tuple[set[str], asyncio.Future[list[_S]]] | None = None
        self._running: asyncio.Task[None] | None = None

    async def find(self, key: str) -> list[_S]:
        """The records made with the key digest ``key``, as a read started after this call says."""
        if self._next is None:
            self._next = (set(), asyncio.get_running_loop().create_future())
        keys, answer = self._next
        keys.add(key)
        if self._running is None:
            self._running = asyncio.ensure_future(self._reads())
        found = await asyncio.shield(answer)
        return [record for record in found if self._key_of(record) == key]

    async def _reads(self) -> None:
        try:
            while self._next is not None:
                (keys, answer), self._next = self._next, None
                try:
                    answer.set_result(await self._read(frozenset(keys)))
                except Exception as exc:
                    answer.set_exception(exc)
                    answer.exception()  # retrieved: a lookup abandoned meanwhile leaves no warning
        finally:
            self._running = None
