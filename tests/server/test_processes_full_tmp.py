"""A background process whose supervisor cannot record its end (the sandbox's ``/tmp`` is full)
gives back the tenant's command slot it held, and reads as ended: on Docker with a small
``/tmp``, filled from inside the sandbox."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support import SESSION_OWNER

from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.server.processes import Command, ProcessTable

FILL_TMP = "cat /dev/zero > /tmp/fill 2>/dev/null; { printf x > /tmp/probe; } 2>/dev/null || echo full"


@pytest.fixture(scope="module")
def sandbox(docker_client: Any, runtime_image: str) -> Iterator[DockerSandbox]:
    config = DockerSandboxConfig(image=runtime_image, owner=SESSION_OWNER, tmp_size="4m")
    with DockerSandbox.create(config, client=docker_client) as sb:
        yield sb


def test_a_process_that_cannot_record_its_end_frees_its_slot(sandbox: DockerSandbox) -> None:
    table = ProcessTable(sandbox, max_running=16, max_read=1 << 20)
    released = threading.Event()
    wait = "while [ ! -e /workspace/go ]; do sleep 0.05; done; echo done"
    started = table.start(Command(wait, timeout=60.0, output_limit=4096), on_end=released.set)
    try:
        assert sandbox.execute(FILL_TMP).output == "full\n"
        assert sandbox.execute("touch /workspace/go").exit_code == 0
        assert released.wait(15), "the process ended but its slot is still held"
        assert table.get(started.id).status == "exited"
    finally:
        table.close()
        sandbox.execute("rm -f /tmp/fill /workspace/go")
