"""Over real HTTP: re-attached streams of streamed commands are bounded per tenant (its
``max_commands``), however many a client opens on one command: each holds up to an event of
output in the service while its client reads, so their number bounds the service's memory."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from service_harness import POLICIES, Running, create, error_of, running, settings_for

from sandboxes.server.settings import TenantPolicy

CAP = 2


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tenants = {**POLICIES, "bob": TenantPolicy(max_commands=CAP)}
    with running(settings_for(tmp_path_factory.mktemp("readers"), tenants=tenants)) as svc:
        yield svc


def _first(response: httpx.Response, lines: list[Iterator[str]] | None = None) -> dict[str, Any]:
    """The stream's first event; its lines go on in ``lines`` (left unread, kept open: an
    abandoned line iterator closes its connection)."""
    assert response.status_code == 200, response.read()
    events = response.iter_lines()
    if lines is not None:
        lines.append(events)
    first: dict[str, Any] = json.loads(next(events))
    return first


def test_a_tenant_follows_at_most_its_cap_of_streams_at_once(service: Running) -> None:
    with service.client("bob") as bob, service.client("alice") as alice:
        sandbox_id = create(bob)["id"]
        try:
            command = {"command": "sleep 60", "timeout": 60}
            with bob.stream("POST", f"/v1/sandboxes/{sandbox_id}/execute/stream", json=command) as started:
                command_id = _first(started)["id"]
            url = f"/v1/sandboxes/{sandbox_id}/execute/{command_id}/stream"
            with contextlib.ExitStack() as stack:
                followed: list[Iterator[str]] = []
                for _ in range(CAP):
                    assert _first(stack.enter_context(bob.stream("GET", url)), followed)["id"] == command_id
                with bob.stream("GET", url) as refused:
                    assert refused.status_code == 429, "one stream past the tenant's cap was served"
                    refused.read()
                assert error_of(refused) == "rate_limited"
                assert refused.headers["retry-after"] == "1"
                other = create(alice)["id"]  # another tenant's streams are not counted with bob's
                try:
                    run = alice.post(f"/v1/sandboxes/{other}/execute/stream", json={"command": "echo hi"})
                    alice_id = json.loads(run.text.splitlines()[0])["id"]
                    assert alice.get(f"/v1/sandboxes/{other}/execute/{alice_id}/stream").status_code == 200
                finally:
                    alice.delete(f"/v1/sandboxes/{other}")
            deadline = time.monotonic() + 10  # closed streams give their places back
            while not _opens(bob, url):
                assert time.monotonic() < deadline, "a closed stream kept its place"
        finally:
            bob.delete(f"/v1/sandboxes/{sandbox_id}")


def _opens(client: httpx.Client, url: str) -> bool:
    """Whether a stream of ``url`` opens now (``False``: refused with 429)."""
    with client.stream("GET", url) as response:
        if response.status_code == 429:
            return False
        return _first(response)["type"] == "output"


def test_another_tenants_command_is_not_found(service: Running) -> None:
    """Neither through its sandbox nor through one's own: a command id is no key to another
    tenant's output."""
    with service.client("bob") as bob, service.client("alice") as alice:
        theirs, mine = create(bob)["id"], create(alice)["id"]
        try:
            with bob.stream("POST", f"/v1/sandboxes/{theirs}/execute/stream", json={"command": "echo secret"}) as run:
                command_id = _first(run)["id"]
            for sandbox_id in (theirs, mine):
                found = alice.get(f"/v1/sandboxes/{sandbox_id}/execute/{command_id}/stream")
                assert (found.status_code, error_of(found)) == (404, "not_found")
        finally:
            bob.delete(f"/v1/sandboxes/{theirs}")
            alice.delete(f"/v1/sandboxes/{mine}")
