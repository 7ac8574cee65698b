"""Pausing and resuming the sandboxes a replica holds: their processes frozen where they are
(`sandboxes.lifecycle.Freezable`), their files and memory kept, their id, labels and tokens
unchanged; and the rule for an operation on a paused sandbox (`Pausing.awake`).

A pause says what happens to the TTL: ``keep``, the clock runs (a sandbox may expire while
paused, and is removed as any other); ``stop``, the seconds left are recorded and given back at
resume, and no expiry removes it meanwhile. On a shared backend the sandbox's recorded expiry
is moved ``max_ttl`` past the pause, so another replica (or this one after a restart, which
reads a frozen container back as paused with ``keep``, or as it was if paused with ``stop`` or
at its timeout: its state file, `SandboxState.kept_beside_record`) does not reap it early.

A pause is crash-safe: its intent is written before the freeze (`SandboxState.pause_intent`), and a
restart settles an intent it finds with what the backend says (`SandboxState.settle_pause`); so is
a resume that gives back a TTL on a shared backend (`SandboxState.resume_expiry`).
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
from typing import Literal

from sandboxes.lifecycle import Freezable, FreezeUnavailable
from sandboxes.server.entry import Entry
from sandboxes.server.errors import ServiceError
from sandboxes.server.networks import Networks
from sandboxes.server.store import PAUSED_AT_TIMEOUT

__all__ = ["CRASH_AT", "PAUSED_AT_TIMEOUT", "Pausing", "TtlChoice", "crash_point"]

TtlChoice = Literal["keep", "stop"]

CRASH_AT = "SANDBOXES_TEST_CRASH_AT"
"""The environment variable naming a `crash_point` at which the service kills itself (tests)."""


def crash_point(name: str) -> None:
    """The service killed by SIGKILL here if `CRASH_AT` names this point: a real ``kill -9`` at
    an instant no request can aim at, for the tests of what a restart makes of it."""
    if os.environ.get(CRASH_AT) == name:
        os.kill(os.getpid(), signal.SIGKILL)


class Pausing(Networks):
    """`Holdings` with pause, resume, and the check every operation on a sandbox makes."""

    async def pause(self, entry: Entry, ttl: TtlChoice) -> Entry:
        """Freeze the sandbox; ``paused`` (409) if it is already."""
        async with entry.pausing:
            if entry.state.paused:
                raise ServiceError("paused", f"sandbox {entry.state.id} is already paused")
            if ttl == "stop":
                entry.state.paused_remaining = max(0.0, entry.state.expires_at - self.clock.now())
            await self._freeze(entry, ttl)
            return entry

    async def _freeze(self, entry: Entry, kind: str) -> None:
        """Frozen and recorded paused with ``kind``, in an order a ``kill -9`` cannot break: the
        intent is written first (`SandboxState.pause_intent`), then the freeze, then the pause; a
        restart between them settles it with what the backend says (`SandboxState.settle_pause`).
        A freeze that fails leaves it running, its intent withdrawn."""
        state = entry.state
        state.pause_intent = kind
        await self._saved(entry)
        crash_point("intended")
        try:
            await self._call(entry, "freeze")
        except Exception:  # not frozen; a cancelled freeze may be, and leaves its intent to a restart
            state.pause_intent = ""
            if kind == "stop":
                state.paused_remaining = 0.0
            await self._saved(entry)
            raise
        crash_point("frozen")
        if kind == "stop":
            timer = self._timers.pop(state.id, None)
            if timer is not None:
                timer.cancel()
            if entry.backend.shared:  # guards it from other replicas' sweeps meanwhile
                guarded_until = float(math.ceil(self.clock.now() + self.settings.max_ttl))
                await asyncio.to_thread(entry.backend.renew, state, guarded_until)
        state.paused, state.pause_intent = kind, ""
        await self._saved(entry)

    async def resume(self, entry: Entry) -> Entry:
        """Thaw the sandbox; one that runs already is left as it is."""
        async with entry.pausing:
            state = entry.state
            if not state.paused:
                return entry
            await self._thaw(entry)
            state.paused, state.paused_remaining, state.processes_ended = "", 0.0, False
            state.resume_expiry = 0.0
            await self._saved(entry)
            self._schedule(state.id)
            return entry

    async def _thaw(self, entry: Entry) -> None:
        """Thawed, with the expiry a pause with its clock stopped or at its timeout gives back. On a
        shared backend, whose record keeps the pause's guarded expiry, that expiry is written to the
        state file first (`SandboxState.resume_expiry`): a ``kill -9`` after the thaw and before the
        resume is recorded is settled at the restart (`SandboxState.settle_resume`)."""
        state = entry.state
        given_back = state.paused in ("stop", PAUSED_AT_TIMEOUT)
        expires_at = self.clock.now() + state.paused_remaining if given_back else state.expires_at
        if given_back and entry.backend.shared:
            state.resume_expiry = expires_at = float(math.ceil(expires_at))
            await self._saved(entry)
            crash_point("resuming")
        try:
            await self._call(entry, "thaw")
        except Exception:  # still frozen; a cancelled thaw may not be, and leaves its intent to a restart
            if state.resume_expiry:
                state.resume_expiry = 0.0
                await self._saved(entry)
            raise
        crash_point("resumed")
        if given_back and entry.backend.shared:
            await asyncio.to_thread(entry.backend.renew, state, expires_at)
        state.expires_at = expires_at

    async def awake(self, entry: Entry) -> Entry:
        """The sandbox, running: resumed first if paused and created with ``auto_resume``;
        ``paused`` (409) if paused otherwise."""
        if not entry.state.paused:
            return entry
        if entry.state.auto_resume:
            return await self.resume(entry)
        sandbox_id = entry.state.id
        raise ServiceError(
            "paused",
            f"sandbox {sandbox_id} is paused: resume it first (POST /v1/sandboxes/{sandbox_id}/resume), "
            "or create it with auto_resume",
        )

    async def _call(self, entry: Entry, action: Literal["freeze", "thaw"]) -> None:
        sandbox = entry.sandbox
        if not isinstance(sandbox, Freezable):
            raise ServiceError(
                "unavailable", f"the {entry.backend.name} backend cannot pause a sandbox: it has no freezer to use"
            )
        try:
            await asyncio.to_thread(getattr(sandbox, action))
        except FreezeUnavailable as exc:
            raise ServiceError("unavailable", str(exc)) from exc
        except Exception as exc:
            raise ServiceError(
                "backend_unavailable", f"the {entry.backend.name} backend failed to {action} sandbox {entry.state.id}"
            ) from exc

    async def _saved(self, entry: Entry) -> None:
        """Its state file written; a shared backend's kept only while it says what the record
        cannot and this replica holds it (`SandboxState.kept_beside_record`), else removed."""
        held = self._entries.get(entry.state.id) is entry
        if not entry.backend.shared or (entry.state.kept_beside_record and held):
            await asyncio.to_thread(self.store.save, entry.state)
        else:
            await asyncio.to_thread(self.store.remove, entry.state.id)
