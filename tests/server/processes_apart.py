"""A background process's stdout and stderr kept apart through the service, checked the same
way on every backend: over HTTP, through the Python client (sync and async) and the CLI."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from service_harness import KEYS, Running

from sandboxes.cli import main as cli_main
from sandboxes.client import AsyncSandboxClient, SandboxClient

BOTH = "printf 'out1\\n'; printf 'err1\\n' >&2; printf 'out2\\n'; printf 'err2\\n' >&2; exit 3"
"""Prints to both streams, interleaved, and exits 3."""


def _poll_until(client: httpx.Client, url: str, done: Any, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while not done(info := client.get(url).json()):
        assert time.monotonic() < deadline, f"{what}: {info}"
        time.sleep(0.05)
    result: dict[str, Any] = info
    return result


def _started(client: httpx.Client, base: str, command: str) -> dict[str, Any]:
    """The process ``command`` started, once one of the sandbox's process slots is free (a slot
    an earlier test's killed process held is freed once its end is recorded): within 30 s."""
    deadline = time.monotonic() + 30
    while (answer := client.post(base, json={"command": command})).status_code in (403, 429):
        assert time.monotonic() < deadline, f"no process slot within 30 s: {answer.status_code} {answer.text}"
        time.sleep(0.05)
    assert answer.status_code == 202, answer.text
    started: dict[str, Any] = answer.json()
    return started


def assert_background_streams_apart(
    service: Running, client: httpx.Client, sandbox_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both streams apart while the process runs, once it exited and once it was killed; the
    merged ``output`` is the stdout, then the stderr; the clients and the CLI answer both."""
    base = f"/v1/sandboxes/{sandbox_id}/processes"
    process = _started(client, base, BOTH)
    done = _poll_until(client, f"{base}/{process['id']}", lambda i: i["status"] != "running", "still running")
    assert (done["status"], done["result"]["exit_code"]) == ("exited", 3), done
    assert (done["stdout"], done["stderr"]) == ("out1\nout2\n", "err1\nerr2\n")
    assert done["output"] == done["result"]["output"] == "out1\nout2\nerr1\nerr2\n"

    waiting = _started(client, base, "printf o; printf e >&2; sleep 60")
    url = f"{base}/{waiting['id']}"
    running = _poll_until(client, url, lambda i: i["stdout"] and i["stderr"], "no output on both streams")
    assert (running["status"], running["stdout"], running["stderr"], running["output"]) == ("running", "o", "e", "o\ne")
    killed = client.delete(url).json()
    assert (killed["status"], killed["stdout"], killed["stderr"]) == ("killed", "o", "e")

    with SandboxClient(service.url, KEYS["alice"]) as sdk:
        sandbox = sdk.attach(sandbox_id)
        status = sandbox.wait_process(sandbox.start_process(BOTH).id, timeout=30)
        assert (status.stdout, status.stderr, status.output) == ("out1\nout2\n", "err1\nerr2\n", done["output"])

    async def through_async() -> tuple[str, str]:
        async with AsyncSandboxClient(service.url, KEYS["alice"]) as asdk:
            remote = asdk.attach(sandbox_id)
            ended = await remote.await_process((await remote.astart_process(BOTH)).id, timeout=30)
            return ended.stdout, ended.stderr

    assert asyncio.run(through_async()) == ("out1\nout2\n", "err1\nerr2\n")

    options = ["--url", service.url, "--api-key", KEYS["alice"]]
    capsys.readouterr()
    assert cli_main(["process", *options, "start", sandbox_id, BOTH]) == 0
    started = capsys.readouterr().out.strip()
    assert cli_main(["process", *options, "--timeout", "30", "wait", sandbox_id, started]) == 3
    printed = capsys.readouterr()
    assert (printed.out, printed.err) == ("out1\nout2\n", "err1\nerr2\n")
