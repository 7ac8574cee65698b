"""Over real HTTP: tenants' file operations get threads of their own, as many as their caps
together, so tenants each within its cap never starve another of threads, however few
``worker_threads`` (lifecycle and archives) the service has. With the defaults (64 worker
threads, 16 file operations a tenant), four stuck tenants used to take every thread."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from service_harness import POLICIES, Running, create, execute, running, settings_for
from test_service_file_fairness import _assert_prompt, _file_op, _jail_of, _wait_for

from sandboxes.server.settings import TenantPolicy

CAP = 2
"""Each tenant's file operations at once; the worker threads are as many: one tenant's fill them."""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    policy = TenantPolicy(max_file_operations=CAP, rate=10_000, burst=10_000)
    settings = settings_for(
        tmp_path_factory.mktemp("file-threads"),
        tenants={**POLICIES, "alice": policy, "bob": policy},
        worker_threads=CAP,
        file_operation_timeout=20,
    )
    with running(settings) as svc:
        yield svc


def test_a_tenant_within_its_cap_leaves_threads_to_the_others(service: Running) -> None:
    with service.client("alice") as alice, service.client("bob") as bob:
        mine, theirs = create(alice), create(bob)
        try:
            _stuck_while_bob_works(service, alice, mine, bob, theirs)
        finally:
            alice.delete(f"/v1/sandboxes/{mine['id']}")
            bob.delete(f"/v1/sandboxes/{theirs['id']}")


def _stuck_while_bob_works(
    service: Running, alice: httpx.Client, mine: dict[str, Any], bob: httpx.Client, theirs: dict[str, Any]
) -> None:
    execute(alice, mine["id"], "echo mine > note.txt")
    _file_op(bob, theirs, "write", file_path=f"{theirs['workdir']}/note.txt", content="bob's\n")
    jail = _jail_of(mine["workdir"])
    assert jail, "the jail of Alice's sandbox was not found"
    for pid in jail:
        os.kill(pid, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(CAP) as pool:
            answers = [
                pool.submit(_file_op, alice, mine, "read", file_path=f"{mine['workdir']}/note.txt") for _ in range(CAP)
            ]
            lanes = service.app.state.service.file_lanes._lanes
            _wait_for(lambda: "alice" in lanes and lanes["alice"].locked())  # all her cap is stuck
            _assert_prompt(service, bob, theirs)
            for pid in jail:
                os.kill(pid, signal.SIGCONT)
            reads = [a.result(timeout=30) for a in answers]
    finally:
        for pid in jail:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert [r.status_code for r in reads] == [200] * CAP
