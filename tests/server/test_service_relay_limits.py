"""Each sandbox's relay limits (`sandboxes.server.relay_limits`), through the service (a real
uvicorn on 127.0.0.1) into a web app started INSIDE a local jail: past the template's
``relay_connections``, a preview is refused 429 with ``Retry-After`` and a tunnel is denied,
until one closes; ``relay_bytes_per_second`` paces a preview's body, and the sandbox held back
by it still answers its commands at once."""

from __future__ import annotations

import base64
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from service_harness import KEYS, Running, create, execute, running, settings_for, start_process
from support import HAS_BWRAP, SESSION_OWNER, needs
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from sandboxes.local import LocalTemplate

APP_PORT = 8000
CONNECTIONS = 2
RATE = 1 << 20
"""The capped template's bytes a second (and its burst)."""


@dataclass
class Capped:
    service: Running
    sandbox_id: str
    alice: httpx.Client

    @property
    def base(self) -> str:
        return f"/v1/sandboxes/{self.sandbox_id}/ports/{APP_PORT}"

    def tunnel(self) -> ClientConnection:
        url = self.service.url.replace("http://", "ws://") + f"{self.base}/connect"
        return ws_connect(url, additional_headers={"Authorization": f"Bearer {KEYS['alice']}"}, open_timeout=10)


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Capped]:
    """The preview app in a local jail whose template allows two relayed connections at 1 MiB/s."""
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
    template = LocalTemplate(default_timeout=30, relay_connections=CONNECTIONS, relay_bytes_per_second=RATE)
    owner = f"{SESSION_OWNER}-relay-limits-{uuid.uuid4().hex[:6]}"
    settings = settings_for(tmp_path_factory.mktemp("limits"), owner=owner, templates={"default": template})
    with running(settings) as service, service.client("alice") as alice:
        sandbox = create(alice, template="default")
        app = (Path(__file__).parent / "preview_app.py").read_bytes()
        files = [{"path": f"{sandbox['workdir']}/app.py", "content_b64": base64.b64encode(app).decode()}]
        assert alice.post(f"/v1/sandboxes/{sandbox['id']}/files/upload", json={"files": files}).status_code == 200
        start_process(alice, sandbox["id"], f"exec python3 app.py {APP_PORT}")
        ready = Capped(service, sandbox["id"], alice)
        try:
            deadline = time.monotonic() + 30
            while (answer := alice.get(f"{ready.base}/health")).status_code != 200:
                assert answer.status_code == 502, answer.text  # nothing listens yet
                assert time.monotonic() < deadline, "the app in the sandbox never listened"
                time.sleep(0.05)
            yield ready
        finally:
            alice.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_past_the_cap_a_preview_is_refused_429_and_taken_again_once_a_connection_closed(capped: Capped) -> None:
    with contextlib.ExitStack() as stack:
        held = [stack.enter_context(capped.tunnel()) for _ in range(CONNECTIONS)]  # each holds a relay while open
        refused = capped.alice.get(f"{capped.base}/health")
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"] == "rate_limited"
        assert f"{CONNECTIONS} relayed connections open" in refused.json()["message"]
        with pytest.raises(InvalidStatus) as denied:
            capped.tunnel()
        assert denied.value.response.status_code == 429
        held.pop().close()
        deadline = time.monotonic() + 10
        while (answer := capped.alice.get(f"{capped.base}/health")).status_code == 429:  # until the service saw it
            assert time.monotonic() < deadline, "the closed tunnel's relay was never let go"
            time.sleep(0.02)
        assert answer.status_code == 200
        assert answer.text == "ok"


def test_a_preview_body_passes_at_the_templates_rate(capped: Capped) -> None:
    size = 3 * RATE  # three seconds of the rate, less its one-second burst
    started = time.monotonic()
    answer = capped.alice.get(f"{capped.base}/big", params={"n": size}, timeout=60)
    elapsed = time.monotonic() - started
    assert answer.status_code == 200
    assert len(answer.content) == size
    assert elapsed >= (size - RATE) / RATE * 0.9


def test_a_sandbox_held_back_by_its_rate_still_answers_commands_at_once(capped: Capped) -> None:
    size = 6 * RATE  # five seconds of the rate past its burst: a command answers well within them
    started, finished, stop = threading.Event(), threading.Event(), threading.Event()
    received = [0]

    def download() -> None:
        with capped.alice.stream("GET", f"{capped.base}/big", params={"n": size}, timeout=60) as answer:
            for chunk in answer.iter_bytes():
                received[0] += len(chunk)
                if received[0] > RATE:  # past its burst: held back from now on
                    started.set()
                if stop.is_set():
                    return
        finished.set()

    thread = threading.Thread(target=download, daemon=True)
    thread.start()
    try:
        assert started.wait(30), "the download never started"
        answer = execute(capped.alice, capped.sandbox_id, "echo beside", timeout=10)
        assert answer["output"] == "beside\n"
        assert not finished.is_set(), received  # the command did not wait for the held-back relay
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
