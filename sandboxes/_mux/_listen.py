"""A TCP listener inside a sandbox, held by its exec helper (`sandboxes._helper._relay.Listener`,
an R request with ``listen: {port}``): each connection a process of the sandbox makes to
127.0.0.1:port is accepted by the helper and announced here (`listen`'s ``on_accept`` gets its
number), to be adopted as a relayed connection (`sandboxes._mux._relay.open_relay` with
``accepted=``). What a sandbox without a network reaches the outside through: the service's
egress proxy, for one.

The helper's lines are the sandbox's, so hostile: each is bounded, and a line that is not an
announcement ends the listener.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

from sandboxes._mux._channel import Channel, open_channel
from sandboxes._mux._command import Command
from sandboxes._mux._shipped import sources_of
from sandboxes._mux.client import MuxClient
from sandboxes._output import Stream

__all__ = ["Listening", "listen"]

_MAX_LINE = 200
"""A longer announcement is not the helper's."""


class Listening:
    """A listener's channel, and whether its port is bound yet (`bound`)."""

    def __init__(self, on_accept: Callable[[int], None]) -> None:
        self._on_accept = on_accept
        self._partial = b""
        self.bound = threading.Event()
        self.channel: Channel | None = None
        self.failure: str | None = None

    def _arrived(self, chunk: bytes, _stream: Stream = "merged", /) -> None:
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        if len(self._partial) > _MAX_LINE:
            self._fail("an announcement longer than a listener's")
            return
        for line in lines:
            try:
                message = json.loads(line)
                if "listening" in message:
                    self.bound.set()
                    continue
                number = message["accepted"]
                if type(number) is not int:
                    raise TypeError(number)
            except (ValueError, KeyError, TypeError):
                self._fail(f"not a listener's announcement: {line[:_MAX_LINE]!r}")
                return
            self._on_accept(number)

    def _fail(self, why: str) -> None:
        self.failure = why
        if self.channel is not None:
            self.channel.kill()

    def close(self) -> None:
        """Stop listening (the connections not adopted yet are closed)."""
        if self.channel is not None:
            self.channel.kill()


def listen(mux: MuxClient, port: int, on_accept: Callable[[int], None]) -> Listening:
    """Listen on 127.0.0.1:``port`` inside the sandbox; ``on_accept(number)`` for each connection
    (on the reader's thread: it must not block). The channel's end (`Listening.channel`) says why
    it stopped: E when the port could not be bound."""
    listening = Listening(on_accept)
    listening.channel = open_channel(
        mux,
        Command("", timeout=0, output_limit=0),
        spec={"listen": {"port": port}, "sources": sources_of("_relay")},
        on_output=listening._arrived,
    )
    listening.channel.on_end(listening.bound.set)  # a waiter for the bind wakes on a failure too
    return listening
