"""Execute requests: the service's limits applied, then run once (JSON result) or streamed
(NDJSON: ``output`` events as the command prints, then one ``exit`` event).

Streaming: the command runs detached from its connection (`run_detached`); its output is kept,
bounded, by `sandboxes.server.streamed`, which any stream reads from an offset. A client that
disconnects from a plain execute has its command's process tree killed (the service watches
the connection while it waits); a streamed command runs on until it ends or times out.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextvars
import functools
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor
from typing import Any, TypeVar

from sandboxes import protocol as p
from sandboxes._mux import Command
from sandboxes._output import DEFAULT_OUTPUT_LIMIT, OutputHook
from sandboxes.api import ExecuteRequest, ExecuteResult
from sandboxes.base import OPERATION_ENV, BaseSandbox, MarksAhead
from sandboxes.server.errors import ServiceError
from sandboxes.server.logs import unique_id
from sandboxes.server.processes import result_of, run_marked
from sandboxes.server.settings import ServiceSettings, Template
from sandboxes.server.waiting import awaitable_helper, run_awaited

logger = logging.getLogger(__name__)
T = TypeVar("T")


def command_for(request: ExecuteRequest, template: Template, settings: ServiceSettings) -> Command:
    """The request with the service's ceilings: a timeout of 0 ("none") gets the maximum, and
    no ``output_limit`` gets every backend's own default (`DEFAULT_OUTPUT_LIMIT`), so the same
    command keeps the same output through the service as from the library."""
    timeout = template.default_timeout if request.timeout is None else request.timeout
    if timeout == 0 or timeout > settings.max_execute_timeout:
        timeout = settings.max_execute_timeout
    limit = min(request.output_limit or DEFAULT_OUTPUT_LIMIT, settings.max_output_bytes)
    stdin = None
    if request.stdin_b64 is not None:
        try:
            stdin = base64.b64decode(request.stdin_b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ServiceError("invalid_request", "stdin_b64 is not base64") from exc
    for name in request.env:
        if not name or "=" in name or "\x00" in name:
            raise ServiceError("invalid_request", f"invalid environment variable name {name!r}")
    return Command(request.command, timeout, limit, stdin=stdin, env=dict(request.env), cwd=request.cwd)


WATCH_AFTER = 0.05
"""Seconds a plain execute runs before its connection is watched (a task reading the request's
``receive`` until the client leaves). Most commands end sooner and never need one: the task,
the wait on it beside the command and its cancellation would be the event loop's work on every
request. A client that leaves has its command killed at most this much later."""

Receive = Callable[[], Awaitable[Mapping[str, Any]]]
"""The request's ASGI ``receive``, once its body is read: what it returns next is the client
leaving (``http.disconnect``)."""


async def run_once(
    sandbox: BaseSandbox,
    command: Command,
    kill_marked: Callable[[str], None],
    receive: Receive | None = None,
    executor: Executor | None = None,
    on_end: Callable[[], None] | None = None,
) -> ExecuteResult:
    """The command's result. If the client disconnects first (``receive`` given), the command's
    tree is killed as soon as that is seen (watched from `WATCH_AFTER` on) rather than left to
    its timeout; the result then goes nowhere.
    ``on_end`` is called when the command has ended, answered or not."""
    work, token = _started(sandbox, command, None, executor, on_end)
    watch: list[asyncio.Task[None]] = []
    timer = None
    if receive is not None:
        heard = receive

        def start_watching() -> None:
            if not work.done():
                watch.append(asyncio.ensure_future(_kill_when_gone(heard, work, kill_marked, token)))

        timer = asyncio.get_running_loop().call_later(WATCH_AFTER, start_watching)
    try:
        return result_of(await asyncio.shield(work))
    except asyncio.CancelledError:  # the request was cancelled: do not leave its command running
        _kill_soon(kill_marked, token)
        raise
    finally:
        if timer is not None:
            timer.cancel()
        for task in watch:
            task.cancel()


def _started(
    sandbox: BaseSandbox,
    command: Command,
    on_output: OutputHook | None,
    executor: Executor | None,
    on_end: Callable[[], None] | None,
) -> tuple[asyncio.Future[p.ExecuteResponse], str]:
    """The command, running, and the token that marks its processes (what a kill looks for):
    awaited on the loop where the backend allows it (`sandboxes.server.waiting`), else waited
    on by a thread of ``executor``. ``on_end`` runs once it has ended.

    The token is the one announced to the sandbox's helper with its previous command, where it
    has one (`sandboxes.base.MarksAhead`), so that the helper can have a shell waiting for it,
    started with the token in its environment: the token must be in the environment of every
    process the command starts, shell included, for a kill from outside the helper to find them."""
    from sandboxes.server.backends import MARKER_ENV

    token = sandbox.command_marker(unique_id) if isinstance(sandbox, MarksAhead) else unique_id()
    mux = awaitable_helper(sandbox)
    # The context goes along, as to_thread would take it, so log lines carry the request id.
    call = functools.partial(contextvars.copy_context().run, run_marked, sandbox, command, token, on_output)
    if mux is None:
        return _submitted(call, executor, on_end), token
    loop = asyncio.get_running_loop()

    async def in_a_thread() -> p.ExecuteResponse:
        return await loop.run_in_executor(executor, call)

    marked = command.with_env(MARKER_ENV, token)
    work = asyncio.ensure_future(run_awaited(sandbox, mux, marked, on_output, in_a_thread))
    if on_end is not None:
        work.add_done_callback(lambda _: on_end())
    return work, token


def _submitted(
    call: Callable[[], p.ExecuteResponse], executor: Executor | None, on_end: Callable[[], None] | None
) -> asyncio.Future[p.ExecuteResponse]:
    """``call`` running in ``executor``; ``on_end`` runs when it has returned, on the thread
    that ran it (never before: a slot is freed only once its thread is). The executor's
    future itself, not a task around `asyncio.to_thread`: one scheduling step less per
    command on the event loop."""

    def run() -> p.ExecuteResponse:
        try:
            return call()
        finally:
            if on_end is not None:
                on_end()

    try:
        return asyncio.get_running_loop().run_in_executor(executor, run)
    except BaseException:  # never submitted (the pool is shut down): nothing will call on_end
        if on_end is not None:
            on_end()
        raise


async def _client_gone(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _kill_when_gone(
    receive: Receive, work: asyncio.Future[p.ExecuteResponse], kill_marked: Callable[[str], None], token: str
) -> None:
    await _client_gone(receive)
    if not work.done():
        logger.info("the client left while its command ran: killing the command")
        _kill_soon(kill_marked, token)


def _kill_soon(kill_marked: Callable[[str], None], token: str) -> None:
    """Kill from a thread of its own: called while the request is being cancelled, when any
    ``await`` (anyio's cancellation is level-triggered) would be cancelled before it ran."""

    def kill() -> None:
        try:
            kill_marked(token)
        except Exception:
            logger.warning("could not kill the tree of an abandoned command", exc_info=True)

    threading.Thread(target=kill, name="sandboxes-kill", daemon=True).start()


def run_detached(
    sandbox: BaseSandbox,
    command: Command,
    on_output: OutputHook,
    executor: Executor | None = None,
    on_end: Callable[[], None] | None = None,
) -> tuple[asyncio.Future[p.ExecuteResponse], str]:
    """The command, running on its own, and the token that marks its processes (what a kill
    looks for): tied to no connection, it ends by itself, by its timeout or by a kill of its
    token (a streamed command, `sandboxes.server.streamed`). ``on_output`` gets its output as
    it arrives and must never block; ``on_end`` is called when it has ended."""
    return _started(sandbox, command, on_output, executor, on_end)


KILL_AGAIN = 0.5
"""Seconds between kills of an abandoned file operation's commands while it still runs."""


async def run_abandonable(
    call: Callable[[], Awaitable[T]], kill_marked: Callable[[str], None], receive: Receive | None
) -> T:
    """``call()`` (a file operation) with every command it runs in the sandbox marked by a
    token of its own (`OPERATION_ENV`). Once the client left (``receive``, watched from
    `WATCH_AFTER` on), they are killed, again every `KILL_AGAIN` seconds until the operation
    ended (it may start another after the first dies), not left to their timeout."""
    from sandboxes.server.backends import MARKER_ENV

    token = unique_id()
    marked = OPERATION_ENV.set({MARKER_ENV: token})
    try:
        work = asyncio.ensure_future(call())  # the task takes the context, the marker with it
    finally:
        OPERATION_ENV.reset(marked)
    watch: list[asyncio.Task[None]] = []

    def start_watching() -> None:
        if receive is not None and not work.done():
            watch.append(asyncio.ensure_future(_kill_until_done(receive, work, kill_marked, token)))

    timer = asyncio.get_running_loop().call_later(WATCH_AFTER, start_watching)
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:  # the request was cancelled: do not leave its commands running
        _kill_soon(kill_marked, token)
        raise
    finally:
        timer.cancel()
        for task in watch:
            task.cancel()


async def _kill_until_done(
    receive: Receive, work: asyncio.Future[Any], kill_marked: Callable[[str], None], token: str
) -> None:
    await _client_gone(receive)
    if not work.done():
        logger.info("the client left while its file operation ran: killing its commands")
    while not work.done():
        try:
            await asyncio.to_thread(kill_marked, token)
        except Exception:
            logger.warning("could not kill the commands of an abandoned file operation", exc_info=True)
        await asyncio.wait({work}, timeout=KILL_AGAIN)
