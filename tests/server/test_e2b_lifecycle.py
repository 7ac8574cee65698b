"""E2B's ``lifecycle`` through the real SDK (sync and async), over the local jail and over
Docker, on the service's clock (a `ManualClock`: no waiting for a timeout): ``on_timeout:
pause`` pauses a sandbox at the end of its timeout instead of killing it, with its files (and,
unless ``keep_memory`` is ``False``, its processes); ``connect`` resumes it; with
``auto_resume`` an envd request or a request to one of its ports wakes it, without it they
find it not running."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox, SandboxNotFoundException, SandboxState
from e2b_harness import opts, service_fixture
from service_harness import Running

service = service_fixture("e2blife", manual_clock=True)

TIMEOUT = 60
BLOB = bytes(range(256)) * 16
PORT = 8000


def _time_out(service: Running, seconds: float = TIMEOUT + 1) -> None:
    """The service's clock past the sandbox's timeout, and its sweep run: what expired is done."""
    service.registry.clock.advance(seconds)
    service.sweep()


def _port_headers(sandbox: Sandbox) -> dict[str, str]:
    return {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "E2b-Sandbox-Port": str(PORT),
        "X-Access-Token": sandbox._envd_access_token or "",
    }


def _get_port(service: Running, sandbox: Sandbox) -> httpx.Response:
    return httpx.get(f"{service.url}/e2b/envd/", headers=_port_headers(sandbox), timeout=30)


def _wait_listening(service: Running, sandbox: Sandbox) -> None:
    deadline = time.monotonic() + 30
    while _get_port(service, sandbox).status_code != 200:
        assert time.monotonic() < deadline, f"nothing listened on port {PORT}"
        time.sleep(0.05)


def test_a_timeout_pause_without_auto_resume_waits_for_connect_with_files_and_processes(service: Running) -> None:
    """test_create.py::test_auto_pause_without_auto_resume_requires_connect."""
    sandbox = Sandbox.create(timeout=TIMEOUT, lifecycle={"on_timeout": "pause", "auto_resume": False}, **opts(service))
    try:
        assert sandbox.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
        sandbox.files.write("kept.bin", BLOB)
        sandbox.commands.run("sleep 600", background=True)
        _time_out(service)
        assert sandbox.get_info().state == SandboxState.PAUSED
        assert not sandbox.is_running()  # an envd request does not wake it
        assert _get_port(service, sandbox).status_code == 502  # nor one to its ports
        assert sandbox.get_info().state == SandboxState.PAUSED

        sandbox.connect()
        assert sandbox.get_info().state == SandboxState.RUNNING
        assert sandbox.is_running()
        assert bytes(sandbox.files.read("kept.bin", format="bytes")) == BLOB
        assert any(process.args[-1:] == ["sleep 600"] for process in sandbox.commands.list())  # frozen, kept
    finally:
        sandbox.kill()


def test_auto_resume_wakes_on_a_request_to_a_port(service: Running) -> None:
    """test_create.py::test_auto_resume_wakes_on_http_request, at ``E2B_SANDBOX_URL`` with
    ``E2b-Sandbox-Port`` (where E2B's host names are not served)."""
    sandbox = Sandbox.create(timeout=TIMEOUT, lifecycle={"on_timeout": "pause", "auto_resume": True}, **opts(service))
    try:
        sandbox.commands.run(f"python3 -m http.server {PORT}", background=True)
        _wait_listening(service, sandbox)
        _time_out(service)
        assert sandbox.get_info().state == SandboxState.PAUSED
        assert _get_port(service, sandbox).status_code == 200
        assert sandbox.get_info().state == SandboxState.RUNNING
        assert sandbox.is_running()
    finally:
        sandbox.kill()


async def test_a_filesystem_only_timeout_pause_keeps_the_files_for_connect(service: Running) -> None:
    """test_create.py::test_auto_pause_filesystem_only_reboots: ``keep_memory: False`` hibernates."""
    lifecycle: Any = {"on_timeout": {"action": "pause", "keep_memory": False}}
    sandbox = await AsyncSandbox.create(timeout=TIMEOUT, lifecycle=lifecycle, **opts(service))
    try:
        await sandbox.files.write("kept.bin", BLOB)
        _time_out(service)
        assert (await sandbox.get_info()).state == SandboxState.PAUSED
        assert service.registry._entries[sandbox.sandbox_id].state.hibernated
        assert not await sandbox.is_running()

        resumed = await sandbox.connect()
        assert bytes(await resumed.files.read("kept.bin", format="bytes")) == BLOB
        assert (await resumed.get_info()).state == SandboxState.RUNNING
    finally:
        await sandbox.kill()


async def test_keep_memory_none_is_a_full_pause_and_auto_resume_wakes_on_envd(service: Running) -> None:
    """test_create.py::test_keep_memory_none_defaults_to_full_memory, and an envd request
    (a file read) waking a sandbox created with ``auto_resume``."""
    lifecycle: Any = {"on_timeout": {"action": "pause", "keep_memory": None}, "auto_resume": True}
    sandbox = await AsyncSandbox.create(timeout=TIMEOUT, lifecycle=lifecycle, **opts(service))
    try:
        await sandbox.files.write("kept.txt", "kept\n")
        await sandbox.set_timeout(0)  # ends a second from now, on the service's clock
        _time_out(service, 2)
        assert (await sandbox.get_info()).state == SandboxState.PAUSED
        assert not service.registry._entries[sandbox.sandbox_id].state.hibernated  # frozen: memory kept
        assert await sandbox.files.read("kept.txt") == "kept\n"
        assert (await sandbox.get_info()).state == SandboxState.RUNNING
    finally:
        await sandbox.kill()


def test_a_sandbox_paused_by_its_timeout_is_removed_after_the_services_maximum(service: Running) -> None:
    """A sandbox that keeps pausing does not leak: paused, it is kept ``max_ttl``, then removed."""
    sandbox = Sandbox.create(timeout=TIMEOUT, lifecycle={"on_timeout": "pause"}, **opts(service))
    try:
        _time_out(service)
        assert sandbox.get_info().state == SandboxState.PAUSED
        _time_out(service, service.registry.settings.max_ttl + 1)
        with pytest.raises(SandboxNotFoundException):
            sandbox.get_info()
    finally:
        Sandbox.kill(sandbox.sandbox_id, **opts(service))
