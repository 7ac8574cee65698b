"""A template's start command through the service (`TemplateConfig.start`, `ready_port`): the
`code-interpreter` template on Docker, whose image's Jupyter server is up and answering E2B's
code-interpreter API when the create answers (read with the real `e2b_code_interpreter`
parser, from inside the sandbox); and a start command that never listens fails the create with
its output, leaving no container behind."""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b_code_interpreter.models import Execution, parse_output
from service_harness import UNTHROTTLED, Running, create, execute, running, settings_for
from support import SESSION_OWNER

from sandboxes.docker import DockerTemplate

IMAGE = "sandboxes/code-interpreter:latest"
CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}
START = "/opt/code-interpreter/bin/python /opt/code-interpreter/server.py"

_ASK = """
import http.client, json, sys
connection = http.client.HTTPConnection("127.0.0.1", 49999, timeout=120)
connection.request("POST", "/execute", json.dumps({"code": sys.argv[1]}), {"Content-Type": "application/json"})
answer = connection.getresponse()
assert answer.status == 200, answer.status
sys.stdout.write(answer.read().decode())
"""
"""Inside the sandbox: one execution on the interpreter's port, its lines printed."""


@pytest.fixture(scope="module")
def interpreter_image(docker_client: Any) -> str:
    try:
        docker_client.images.get(IMAGE)
    except Exception:
        pytest.fail(f"{IMAGE} is missing: build it with `bash images/build.sh`")
    return IMAGE


@pytest.fixture(scope="module")
def service(
    docker_client: Any, interpreter_image: str, runtime_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    owner = f"{SESSION_OWNER}-ci-{uuid.uuid4().hex[:6]}"
    templates = {
        "code-interpreter": DockerTemplate(
            backend="docker", image=interpreter_image, memory="1g", labels=CLEANUP, start=START, ready_port=49999
        ),
        "broken": DockerTemplate(
            backend="docker",
            image=runtime_image,
            memory="256m",
            labels=CLEANUP,
            start="echo it never listens; exit 3",
            ready_port=49998,
            ready_timeout=3,
        ),
    }
    settings = settings_for(tmp_path_factory.mktemp("interp"), owner=owner, templates=templates, tenants=UNTHROTTLED)
    with running(settings, docker_client=docker_client) as svc:
        yield svc


def _run_code(client: httpx.Client, sandbox_id: str, code: str) -> Execution:
    answer = execute(client, sandbox_id, f"python3 -c {shlex.quote(_ASK)} {shlex.quote(code)}", timeout=120)
    assert answer["exit_code"] == 0, answer
    execution = Execution()
    for line in answer["output"].splitlines():
        parse_output(execution, line)
    return execution


def test_the_interpreter_answers_as_soon_as_the_create_does(service: Running) -> None:
    with service.client() as client:
        sandbox = create(client, template="code-interpreter")
        try:
            assert _run_code(client, sandbox["id"], "1+1").text == "2"
            plot = _run_code(client, sandbox["id"], "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
            assert any(result.png for result in plot.results), plot
            frame = _run_code(client, sandbox["id"], "import pandas as pd\npd.DataFrame({'a': [1, 2]})")
            assert frame.results[0].html is not None
            failed = _run_code(client, sandbox["id"], "undefined_name")
            assert failed.error is not None
            assert failed.error.name == "NameError"
            who = execute(client, sandbox["id"], "id -u; ps -o user= -C python3 | sort -u")
            assert who["output"].split() == ["1000", "sandbox"]  # the server runs as the sandbox's user
        finally:
            client.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_a_start_command_that_never_listens_fails_the_create_and_leaves_nothing(
    service: Running, docker_client: Any
) -> None:
    owner = service.app.state.service.settings.owner
    before = {c.id for c in docker_client.containers.list(all=True, filters={"label": f"io.sandboxes.owner={owner}"})}
    with service.client() as client:
        answer = client.post("/v1/sandboxes", json={"template": "broken"})
    assert answer.status_code == 503, answer.text
    assert "49998" in answer.text
    assert "it never listens" in answer.text
    after = {c.id for c in docker_client.containers.list(all=True, filters={"label": f"io.sandboxes.owner={owner}"})}
    assert after == before
