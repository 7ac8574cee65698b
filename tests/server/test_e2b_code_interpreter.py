"""The real `e2b_code_interpreter` SDK, unchanged, against the service: its `code-interpreter-v1`
maps to the `code-interpreter` template (the sandboxes/code-interpreter image on Docker, its
Jupyter server started before the create answers), and its calls to port 49999 reach that
server through the exec helper's relay. Sync and async: 1+1, a matplotlib PNG, an error with
its traceback, stdout and stderr apart, and a context of its own."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from e2b_code_interpreter import AsyncSandbox, Sandbox
from e2b_harness import CLEANUP, opts
from service_harness import UNTHROTTLED, Running, running, settings_for
from support import SESSION_OWNER

from sandboxes.docker import DockerTemplate

IMAGE = "sandboxes/code-interpreter:latest"
START = "/opt/code-interpreter/bin/python /opt/code-interpreter/server.py"


@pytest.fixture(scope="module")
def service(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    try:
        docker_client.images.get(IMAGE)
    except Exception:
        pytest.fail(f"{IMAGE} is missing: build it with `bash images/build.sh`")
    template = DockerTemplate(
        backend="docker",
        image=IMAGE,
        memory="1g",
        labels=CLEANUP,
        start=START,
        ready_port=49999,
        workdir="/home/user",
    )
    owner = f"{SESSION_OWNER}-e2bci-{uuid.uuid4().hex[:6]}"
    settings = settings_for(
        tmp_path_factory.mktemp("e2bci"), owner=owner, templates={"code-interpreter": template}, tenants=UNTHROTTLED
    )
    with running(settings, docker_client=docker_client) as svc:
        yield svc


def test_run_code_as_e2b_programs_call_it(service: Running) -> None:
    sandbox = Sandbox.create(**opts(service))
    try:
        assert sandbox.run_code("1+1").text == "2"
        shown: list[str] = []
        printed = sandbox.run_code(
            "import sys\nprint('out')\nprint('err', file=sys.stderr)", on_stdout=lambda m: shown.append(m.line)
        )
        assert printed.logs.stdout == ["out\n"]
        assert printed.logs.stderr == ["err\n"]
        assert shown == ["out\n"]
        plot = sandbox.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
        png = next(result.png for result in plot.results if result.png)
        assert base64.b64decode(png).startswith(b"\x89PNG")
        failed = sandbox.run_code("1/0")
        assert failed.error is not None
        assert failed.error.name == "ZeroDivisionError"
        context = sandbox.create_code_context(cwd="/tmp")
        sandbox.run_code("x = 'mine'", context=context)
        assert sandbox.run_code("x", context=context).text == "mine"
        assert sandbox.run_code("import os; os.getcwd()", context=context).text == "/tmp"
        assert context.id in {item.id for item in sandbox.list_code_contexts()}
        sandbox.remove_code_context(context)
        assert sandbox.commands.run("id -un").stdout.strip() == "user"
    finally:
        sandbox.kill()


async def test_run_code_from_the_async_sdk(service: Running) -> None:
    sandbox = await AsyncSandbox.create(**opts(service))
    try:
        execution = await sandbox.run_code("sum(range(101))")
        assert execution.text == "5050"
    finally:
        await sandbox.kill()
