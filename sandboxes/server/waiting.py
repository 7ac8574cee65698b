"""Commands awaited on the event loop instead of waited on by a thread.

A command waited on by a worker thread holds that thread for as long as it runs: a few long
commands of one tenant can take every thread, and everyone else's commands queue behind them.
A sandbox with the `AwaitsOnHelper` capability (Docker, Kubernetes, SSH, the local jail) runs its
commands through its exec helper, whose reader thread learns when each one ends;
`sandboxes._mux._awaited.arun` completes an asyncio future from there, so a running command
costs the service no thread at all, and answers as the sandbox's own ``execute_streaming``.

Only the common case is awaited: a helper already running. Anything else (no helper yet, a
helper found broken before the command was written to it, a sandbox without the capability)
goes to the thread path, which starts or restarts the helper, falls back to the backend's one
process per command, and is what `BaseSandbox.execute_streaming` does everywhere. A helper
that breaks once the command was written answers ``connection_lost`` (acknowledged or not, the
command may have run: it is never sent twice), as the thread path does
(`sandboxes._mux.MuxBroken.may_resend`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import cast

from sandboxes import protocol as p
from sandboxes._mux import AwaitedCommand, AwaitsOnHelper, Command, MuxBroken, MuxClient
from sandboxes._mux._awaited import arun
from sandboxes._output import OutputHook
from sandboxes.base import BaseSandbox

logger = logging.getLogger(__name__)

Fallback = Callable[[], Awaitable[p.ExecuteResponse]]


@functools.cache
def _awaits(kind: type) -> bool:
    """Whether sandboxes of ``kind`` have the capability; worked out once per class (``isinstance``
    of a runtime protocol inspects the class's attributes each time)."""
    return issubclass(kind, AwaitsOnHelper)


def _capable(sandbox: BaseSandbox) -> AwaitsOnHelper | None:
    return cast(AwaitsOnHelper, sandbox) if _awaits(type(sandbox)) else None


def awaitable_helper(sandbox: BaseSandbox) -> MuxClient | None:
    """The sandbox's running exec helper, if it has one that a command can be awaited on."""
    capable = _capable(sandbox)
    return None if capable is None else capable.running_helper()


async def run_awaited(
    sandbox: BaseSandbox, mux: MuxClient, command: Command, on_output: OutputHook | None, fallback: Fallback
) -> p.ExecuteResponse:
    """``command`` through ``mux``, answered as the sandbox's own ``execute_streaming`` answers it."""
    capable = _capable(sandbox)
    assert capable is not None  # the only ones `awaitable_helper` answers for
    try:
        awaited = capable.awaited_command(command)
        if isinstance(awaited, p.ExecuteResponse):  # answered without running anything
            return awaited
        response = await _awaited(capable, mux, awaited, on_output)
        if response is None:  # never written: the thread path starts a new helper
            return await fallback()
        if response.exit_code == 137:
            response = await asyncio.to_thread(awaited.checked, response)
    except Exception:
        logger.exception("execute failed in %s", sandbox.id)
        return p.ExecuteResponse(
            "", error=p.UNAVAILABLE, message="the sandbox's backend failed; the service log has the request id"
        )
    return response


async def _awaited(
    capable: AwaitsOnHelper, mux: MuxClient, awaited: AwaitedCommand, on_output: OutputHook | None
) -> p.ExecuteResponse | None:
    """``awaited``'s answer on ``mux``; a helper that broke is let go of, and the command answers
    ``connection_lost`` if it was written (it may have run), ``None`` if it was not."""
    try:
        return await arun(mux, awaited.command, on_output)
    except MuxBroken as broken:
        await asyncio.to_thread(capable.drop_helper, mux, broken)
        if not broken.may_resend:  # it may have run: running it again could do it twice
            return p.ExecuteResponse("", error=p.CONNECTION_LOST, message=f"{awaited.lost}: {broken}")
        return None
