"""A command or a file op on a transport's exec helper, with the one resend rule every transport
follows: a helper found broken before the request was written is dropped and replaced once;
one that broke after answers ``connection_lost``, since the command may have run
(`sandboxes._mux.MuxBroken.may_resend`).

Why one module: what a transport may do when its helper breaks is the same everywhere; the
`sandboxes._mux.HelperDriver` every backend holds hands in how it gets its helper and how it
drops a broken one, and the rule lives here alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sandboxes import protocol as p
from sandboxes._mux._command import Command
from sandboxes._mux._stream import MuxBroken
from sandboxes._mux.client import MuxClient
from sandboxes._output import OutputHook

if TYPE_CHECKING:
    from sandboxes.base import Call

__all__ = ["Drop", "Helper", "run_command_once", "run_native_once", "run_on", "run_replacing_once"]

Helper = Callable[[], MuxClient | None]
"""How a transport gets its exec helper: the running one, or one it starts; ``None``: it has none
(no python3 there, say), and the caller runs the command its own slow way."""
Drop = Callable[[MuxClient, MuxBroken], None]
"""How a transport lets go of a helper found broken (closing it), so that the next call starts one."""


def run_replacing_once(
    helper: Helper,
    run: Callable[[MuxClient], p.ExecuteResponse | None],
    drop: Drop,
    *,
    lost: str,
    unsent: p.ExecuteResponse | None = None,
) -> p.ExecuteResponse | None:
    """``run`` on the transport's helper (``helper()``; ``None``: there is none, and this
    answers ``None`` so the caller falls back; so does ``run`` answering ``None``: a file op
    the helper handed back, `MuxClient.run_native`). A helper found broken before the command was
    written is dropped and replaced once; one that broke after answers ``connection_lost``
    (``lost``, then why), since the command may have run (`MuxBroken.may_resend`: the one rule
    every transport follows). Two helpers broken before the command could be written answer
    ``unsent`` (the command did not run; ``None``: the caller falls back)."""
    for _attempt in range(2):
        handle = helper()
        if handle is None:
            return None
        try:
            return run(handle)
        except MuxBroken as broken:
            drop(handle, broken)
            if not broken.may_resend:  # it may have run: running it again could do it twice
                return p.ExecuteResponse("", error=p.CONNECTION_LOST, message=f"{lost}: {broken}")
    return unsent


def run_command_once(
    helper: Helper,
    drop: Drop,
    command: Command,
    on_output: OutputHook | None,
    *,
    lost: str,
    unsent: p.ExecuteResponse | None = None,
) -> p.ExecuteResponse | None:
    """A transport's ``execute`` on its helper (`MuxClient.run`), by `run_replacing_once`:
    ``None`` when there is no helper, and the caller runs the command its own slow way."""
    return run_replacing_once(helper, lambda mux: run_on(mux, command, on_output), drop, lost=lost, unsent=unsent)


def run_on(mux: MuxClient, command: Command, on_output: OutputHook | None = None) -> p.ExecuteResponse:
    """``command`` on ``mux`` (`MuxClient.run`), waited on by this thread."""
    return mux.run(command, on_output)


def run_native_once(helper: Helper, drop: Drop, call: Call, *, timeout: float, lost: str) -> p.ExecuteResponse | None:
    """`sandboxes.base.BaseSandbox._run_native` on the transport's helper (`MuxClient.run_native`),
    by `run_replacing_once`; ``None``: the caller runs ``call.command`` instead (no helper, or
    the helper handed the op back)."""
    assert call.native is not None
    op, data, limit = call.native, call.stdin, call.output_limit
    return run_replacing_once(
        helper, lambda mux: mux.run_native(op, data, timeout=timeout, output_limit=limit), drop, lost=lost
    )
