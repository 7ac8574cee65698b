"""Over real HTTP, local jails: one tenant's file operations that block in its sandbox cannot
starve another tenant's. Writes into FIFOs are refused instead of blocking a worker thread,
each tenant holds at most its ``max_file_operations`` of the threads (past it, its operations
queue behind its own), and a file operation is bounded by the service's own timeout."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import Running, create, execute, running, settings_for

from sandboxes.server.settings import TenantPolicy

THREADS = 4
"""The service's worker threads: what file operations of every tenant share."""
CAP = 2
"""Alice's file operations at once."""
PROMPT = 5.0
"""Seconds within which Bob's operations must answer while Alice's are stuck."""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    settings = settings_for(
        tmp_path_factory.mktemp("file-fairness"),
        tenants={"alice": TenantPolicy(max_file_operations=CAP, rate=10_000, burst=10_000)},
        worker_threads=THREADS,
        file_operation_timeout=20,
    )
    with running(settings) as svc:
        yield svc


@pytest.fixture
def pair(service: Running) -> Iterator[tuple[httpx.Client, dict[str, Any], httpx.Client, dict[str, Any]]]:
    with service.client("alice") as alice, service.client("bob") as bob:
        mine, theirs = create(alice), create(bob)
        try:
            yield alice, mine, bob, theirs
        finally:
            alice.delete(f"/v1/sandboxes/{mine['id']}")
            bob.delete(f"/v1/sandboxes/{theirs['id']}")


def _file_op(client: httpx.Client, sandbox: dict[str, Any], op: str, **body: Any) -> httpx.Response:
    return client.post(f"/v1/sandboxes/{sandbox['id']}/files/{op}", json=body)


def _assert_prompt(service: Running, client: httpx.Client, sandbox: dict[str, Any]) -> None:
    """Bob's ls and read each answer within `PROMPT` seconds (the client gives up after it)."""
    root = sandbox["workdir"]
    with httpx.Client(base_url=service.url, headers=client.headers, timeout=PROMPT) as quick:
        started = time.monotonic()
        listed = _file_op(quick, sandbox, "ls", path=root)
        read = _file_op(quick, sandbox, "read", file_path=f"{root}/note.txt")
    assert listed.status_code == 200
    assert listed.json()["error"] is None
    assert read.json()["file_data"]["content"] == "bob's\n"
    assert time.monotonic() - started < PROMPT


def _wait_for(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_writes_into_fifos_are_refused_and_starve_nobody(
    service: Running, pair: tuple[httpx.Client, dict[str, Any], httpx.Client, dict[str, Any]]
) -> None:
    """Alice writes and uploads into twice as many FIFOs as the service has worker threads:
    each is refused at once (nobody reads them, so each write would block in the sandbox), and
    Bob's ls and read answer at once meanwhile."""
    alice, mine, bob, theirs = pair
    root = mine["workdir"]
    fifos = [f"{root}/fifo-{n}" for n in range(2 * THREADS)]
    assert execute(alice, mine["id"], f"mkfifo {shlex.join(fifos)} && echo ok")["output"] == "ok\n"
    assert (
        _file_op(bob, theirs, "write", file_path=f"{theirs['workdir']}/note.txt", content="bob's\n").json()["error"]
        is None
    )
    with ThreadPoolExecutor(len(fifos)) as pool:
        answers: list[Future[httpx.Response]] = []
        for n, fifo in enumerate(fifos):
            if n % 2:
                upload = {"files": [{"path": fifo, "content_b64": "eA=="}]}
                answers.append(pool.submit(_file_op, alice, mine, "upload", **upload))
            else:
                answers.append(pool.submit(_file_op, alice, mine, "write", file_path=fifo, content="x"))
        try:
            _assert_prompt(service, bob, theirs)
            _wait_for(lambda: all(a.done() for a in answers), PROMPT)
        finally:  # the old behaviour: each write blocked until something read its FIFO
            readers = " ".join(f"timeout 1 cat {shlex.quote(f)} >/dev/null 2>&1 &" for f in fifos)
            execute(alice, mine["id"], f"{readers} wait")
        bodies = [a.result().json() for a in answers]
    errors = [(body[0] if isinstance(body, list) else body)["error"] for body in bodies]
    assert errors == ["invalid_argument"] * len(fifos)
    assert "not a regular file" in bodies[0]["message"]


def _jail_of(workdir: str) -> list[int]:
    """The pids of the jail working in ``workdir`` (its bwrap and everything under it): children
    of this process, which runs the service."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                parents[int(name)] = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    roots = []
    for pid in parents:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"bwrap") and b"--chdir" in argv and argv[argv.index(b"--chdir") + 1] == workdir.encode():
            roots.append(pid)
    jail = list(roots)
    for pid in jail:  # grows while walking: breadth first
        jail += [child for child, parent in parents.items() if parent == pid]
    return jail


def test_a_tenants_stuck_file_operations_hold_only_its_own_share_of_threads(
    service: Running, pair: tuple[httpx.Client, dict[str, Any], httpx.Client, dict[str, Any]]
) -> None:
    """Alice's jail is frozen, so every file operation of hers blocks; she sends more of them
    than the service has threads. Only `CAP` of them hold a thread: Bob's ls and read answer
    at once, and once her jail thaws, all of hers are answered (those past her cap waited their
    turn rather than being refused)."""
    alice, mine, bob, theirs = pair
    execute(alice, mine["id"], "echo mine > note.txt")
    _file_op(bob, theirs, "write", file_path=f"{theirs['workdir']}/note.txt", content="bob's\n")
    jail = _jail_of(mine["workdir"])
    assert jail, "the jail of Alice's sandbox was not found"
    for pid in jail:
        os.kill(pid, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(2 * THREADS) as pool:
            answers = [
                pool.submit(_file_op, alice, mine, "read", file_path=f"{mine['workdir']}/note.txt")
                for _ in range(2 * THREADS)
            ]
            lanes = service.app.state.service.file_lanes._lanes
            _wait_for(lambda: "alice" in lanes and lanes["alice"].locked())  # her cap's worth hold a thread
            _assert_prompt(service, bob, theirs)
            assert not any(a.done() for a in answers)
            for pid in jail:
                os.kill(pid, signal.SIGCONT)
            reads = [a.result(timeout=30) for a in answers]
    finally:
        for pid in jail:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert [r.status_code for r in reads] == [200] * len(reads)
    assert [r.json()["file_data"]["content"] for r in reads] == ["mine\n"] * len(reads)


def test_file_operations_run_under_the_services_timeout(
    service: Running, pair: tuple[httpx.Client, dict[str, Any], httpx.Client, dict[str, Any]]
) -> None:
    """A sandbox's file operations are killed past ``file_operation_timeout`` (20 s here), not
    the library's 300 s."""
    alice, mine, _, _ = pair
    assert _file_op(alice, mine, "ls", path=mine["workdir"]).json()["error"] is None
    entry = service.registry._entries[mine["id"]]
    assert entry.sandbox.operation_timeout == 20


def test_every_sandbox_held_is_bounded_before_its_first_file_operation(tmp_path: Path) -> None:
    """Created, or adopted by a restarted service, a sandbox carries the service's bound from
    the start, whatever reaches it first (a file operation, an archive, its removal)."""
    settings = settings_for(tmp_path, file_operation_timeout=20)
    with running(settings) as first, first.client("alice") as alice:
        made = create(alice)
        assert first.registry._entries[made["id"]].sandbox.operation_timeout == 20
    with running(settings) as again, again.client("alice") as alice:
        try:
            assert again.registry._entries[made["id"]].sandbox.operation_timeout == 20
        finally:
            alice.delete(f"/v1/sandboxes/{made['id']}")
