"""A terminal through the service's WebSocket (``GET /v1/sandboxes/{id}/pty``), on a real uvicorn
server with a real WebSocket client (``websockets``): bytes both ways, JSON control, the exit
in the last message; a browser's key as a subprotocol; reattach with scrollback; the grace that
kills an abandoned session; the tenant's command slots."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from service_harness import KEYS, Running, create, execute, running, settings_for
from support import HAS_BWRAP, needs
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from sandboxes.server.settings import TenantPolicy


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
    tenants = {"alice": TenantPolicy(rate=10_000, burst=10_000), "bob": TenantPolicy(max_commands=1)}
    settings = settings_for(tmp_path_factory.mktemp("pty"), tenants=tenants, command_slot_wait=0)
    with running(settings) as service:
        yield service


@pytest.fixture(scope="module")
def sandbox_id(service: Running) -> str:
    with service.client() as http:
        return str(create(http, template="default")["id"])


def _url(service: Running, sandbox_id: str, query: str = "cols=80&rows=24") -> str:
    return f"{service.url.replace('http', 'ws', 1)}/v1/sandboxes/{sandbox_id}/pty?{query}"


def _open(service: Running, sandbox_id: str, query: str = "cols=80&rows=24", tenant: str = "alice") -> ClientConnection:
    return connect(_url(service, sandbox_id, query), additional_headers={"Authorization": f"Bearer {KEYS[tenant]}"})


class _Reader:
    """What the service sent on one socket: the terminal's bytes, and its JSON messages."""

    def __init__(self, socket: ClientConnection) -> None:
        self.socket = socket
        self.data = b""
        self.messages: list[dict[str, Any]] = []
        self.session = str(self._next_text()["session"])

    def _next_text(self) -> dict[str, Any]:
        while True:
            message = self.socket.recv(timeout=20)
            if isinstance(message, str):
                parsed: dict[str, Any] = json.loads(message)
                self.messages.append(parsed)
                return parsed
            self.data += message

    def until(self, pattern: bytes) -> re.Match[bytes]:
        deadline = time.monotonic() + 20
        while (match := re.search(pattern, self.data)) is None:
            message = self.socket.recv(timeout=max(0.01, deadline - time.monotonic()))
            if isinstance(message, str):
                self.messages.append(json.loads(message))
            else:
                self.data += message
        return match

    def exit(self) -> dict[str, Any]:
        """The exit message, then the close."""
        while True:
            parsed = self._next_text()
            if "exit" in parsed:
                with pytest.raises(ConnectionClosed):
                    self.socket.recv(timeout=20)
                exit_info: dict[str, Any] = parsed["exit"]
                return exit_info


def test_bytes_both_ways_resize_and_the_exit_code_last(service: Running, sandbox_id: str) -> None:
    with _open(service, sandbox_id, "cols=91&rows=27") as socket:
        assert socket.subprotocol is None  # none offered, none chosen
        reader = _Reader(socket)
        socket.send(b'echo "size=$(stty size) term=$TERM"\n')
        reader.until(rb"size=27 91 term=xterm-256color\r\n")
        socket.send(json.dumps({"resize": {"cols": 120, "rows": 40}}))
        socket.send(b'echo "now=$(stty size)"\n')
        reader.until(rb"now=40 120\r\n")
        socket.send(b"exit 4\n")
        assert reader.exit()["exit_code"] == 4


def test_a_kill_message_ends_the_terminal(service: Running, sandbox_id: str) -> None:
    with _open(service, sandbox_id, "command=sleep+300") as socket:
        reader = _Reader(socket)
        socket.send(json.dumps({"kill": True}))
        assert reader.exit()["exit_code"] not in (0, None)


def test_a_bad_control_message_is_answered_and_the_terminal_goes_on(service: Running, sandbox_id: str) -> None:
    with _open(service, sandbox_id, "command=cat") as socket:
        reader = _Reader(socket)
        socket.send(json.dumps({"resize": {"cols": 0, "rows": 5}}))
        assert reader._next_text()["error"] == "invalid_request"
        socket.send(b"still\n")
        reader.until(rb"still\r\nstill\r\n")
        socket.send(json.dumps({"kill": True}))
        reader.exit()


def test_a_browser_offers_its_key_as_a_subprotocol_and_never_in_the_query(service: Running, sandbox_id: str) -> None:
    offered = ["sandboxes.pty.v1", f"bearer.{KEYS['alice']}"]
    with connect(_url(service, sandbox_id, "command=echo+hi"), subprotocols=offered) as socket:  # type: ignore[arg-type]
        assert socket.subprotocol == "sandboxes.pty.v1"  # the key is never echoed
        reader = _Reader(socket)
        assert reader.exit()["exit_code"] == 0
        assert b"hi\r\n" in reader.data
    for url in (_url(service, sandbox_id), _url(service, sandbox_id, f"token={KEYS['alice']}&key={KEYS['alice']}")):
        with pytest.raises(InvalidStatus) as refused:
            connect(url)
        assert refused.value.response.status_code == 401
        assert json.loads(refused.value.response.body or b"{}")["error"] == "unauthorized"
    with pytest.raises(InvalidStatus) as wrong:
        connect(_url(service, sandbox_id), subprotocols=["sandboxes.pty.v1", "bearer.nope"])  # type: ignore[list-item]
    assert wrong.value.response.status_code == 401


def test_another_tenants_sandbox_or_session_is_not_found(service: Running, sandbox_id: str) -> None:
    with pytest.raises(InvalidStatus) as refused:
        _open(service, sandbox_id, tenant="bob")
    assert refused.value.response.status_code == 404
    with _open(service, sandbox_id, "command=cat") as socket:
        reader = _Reader(socket)
        with pytest.raises(InvalidStatus) as stolen:
            _open(service, sandbox_id, f"session={reader.session}", tenant="bob")
        assert stolen.value.response.status_code == 404
        socket.send(json.dumps({"kill": True}))
        reader.exit()


def test_a_lost_socket_reattaches_by_session_scrollback_first_then_live(service: Running, sandbox_id: str) -> None:
    with _open(service, sandbox_id) as socket:
        reader = _Reader(socket)
        socket.send(b"echo before-$((6*7))\n")
        reader.until(rb"before-42\r\n")
    # the client lost it
    with _open(service, sandbox_id, f"session={reader.session}") as again:
        second = _Reader(again)
        assert second.session == reader.session
        second.until(rb"before-42\r\n")  # the scrollback
        again.send(b"echo after-$((6*7))\n")
        second.until(rb"after-42\r\n")  # live
        again.send(b"exit 0\n")
        assert second.exit()["exit_code"] == 0


def test_a_session_nobody_attaches_to_is_killed_after_the_grace(service: Running, sandbox_id: str) -> None:
    terminals = service.app.state.service.terminals
    slots = service.app.state.service.commands
    before = slots.running("alice")
    terminals.grace = 0.5
    try:
        with _open(service, sandbox_id, "command=sleep+300") as socket:
            reader = _Reader(socket)
            assert slots.running("alice") == before + 1  # a terminal holds a command slot
        deadline = time.monotonic() + 20
        while slots.running("alice") > before:  # killed: its slot is back
            assert time.monotonic() < deadline, "the abandoned terminal was never killed"
            time.sleep(0.05)
        with _open(service, sandbox_id, f"session={reader.session}") as late:  # its exit is kept for the grace
            assert _Reader(late).exit()["exit_code"] not in (0, None)
        with pytest.raises(InvalidStatus) as gone:
            _open(service, sandbox_id, f"session={reader.session}")
        assert gone.value.response.status_code == 404
    finally:
        terminals.grace = 60.0


def test_a_terminal_counts_against_the_tenants_command_slots(service: Running, tmp_path: Path) -> None:
    with service.client("bob") as http:
        bobs = str(create(http, template="default")["id"])
        with _open(service, bobs, "command=cat", tenant="bob") as socket:
            reader = _Reader(socket)
            with pytest.raises(InvalidStatus) as busy:
                _open(service, bobs, tenant="bob")
            assert busy.value.response.status_code == 429
            refused = http.post(f"/v1/sandboxes/{bobs}/execute", json={"command": "true"})
            assert refused.status_code == 429
            socket.send(json.dumps({"kill": True}))
            reader.exit()
        assert execute(http, bobs, "echo free")["output"] == "free\n"


def test_a_size_out_of_bounds_is_refused(service: Running, sandbox_id: str) -> None:
    for query in ("cols=0&rows=24", "cols=wide", "rows=10001"):
        with pytest.raises(InvalidStatus) as refused:
            _open(service, sandbox_id, query)
        assert refused.value.response.status_code == 422
        assert json.loads(refused.value.response.body or b"{}")["error"] == "invalid_request"
