"""The code interpreter image's server (images/code-interpreter/server.py) run on the host, as
it runs in the image, and read with the real `e2b_code_interpreter` SDK's own parser: what
`Sandbox.run_code` makes of its lines. The image itself is tested in
tests/server/test_code_interpreter_template.py."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b_code_interpreter.models import Execution, parse_output

SERVER = Path(__file__).resolve().parents[2] / "images" / "code-interpreter" / "server.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("interpreter")
    port = _free_port()
    env = {
        "HOME": str(home),
        "JUPYTER_RUNTIME_DIR": str(home / "rt"),
        "IPYTHONDIR": str(home / "ipy"),
        "PATH": "/usr/bin:/bin",
    }
    server = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", str(port), "--cwd", str(home)], env=env, stderr=subprocess.DEVNULL
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:  # a readiness probe: the server opens its port once its default kernel is up
        assert server.poll() is None, "the interpreter server exited"
        try:
            if httpx.get(f"{base}/health", timeout=2).text == "OK":
                break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the interpreter server did not listen within 60 s"
            time.sleep(0.1)
    yield base
    server.terminate()
    server.wait(10)


def _run(url: str, code: str, **body: Any) -> Execution:
    execution = Execution()
    with httpx.stream("POST", f"{url}/execute", json={"code": code, **body}, timeout=60) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            parse_output(execution, line)
    return execution


def test_one_plus_one_is_two_and_state_is_kept(url: str) -> None:
    assert _run(url, "1+1").text == "2"
    _run(url, "kept = 40")
    assert _run(url, "kept + 2").text == "42"


def test_stdout_and_stderr_come_apart_with_the_execution_count(url: str) -> None:
    execution = _run(url, "import sys\nprint('out')\nprint('err', file=sys.stderr)")
    assert execution.logs.stdout == ["out\n"]
    assert execution.logs.stderr == ["err\n"]
    assert isinstance(execution.execution_count, int)


def test_an_error_names_itself_with_its_traceback(url: str) -> None:
    execution = _run(url, "def f():\n    return 1/0\nf()")
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert "division by zero" in execution.error.value
    assert "f()" in execution.error.traceback


def test_rich_results_carry_their_formats(url: str) -> None:
    png = base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    )
    code = f"from IPython.display import HTML, Image, display\ndisplay(Image(data={png!r}))\nHTML('<b>hi</b>')"
    execution = _run(url, code)
    shown, main = execution.results
    assert base64.b64decode(shown.png) == png
    assert not shown.is_main_result
    assert main.is_main_result
    assert main.html == "<b>hi</b>"


def test_env_vars_hold_for_one_execution(url: str) -> None:
    assert _run(url, "import os; os.environ.get('ONLY_NOW')", env_vars={"ONLY_NOW": "it's here"}).text == "it's here"
    assert _run(url, "import os; os.environ.get('ONLY_NOW', 'gone')").text == "gone"


def test_contexts_are_apart_listed_and_removed(url: str, tmp_path: Path) -> None:
    made = httpx.post(f"{url}/contexts", json={"language": "python", "cwd": str(tmp_path)}, timeout=60).json()
    assert made["language"] == "python"
    assert made["cwd"] == str(tmp_path)
    _run(url, "mine = 'context'", context_id=made["id"])
    assert _run(url, "mine", context_id=made["id"]).text == "context"
    assert _run(url, "import os; os.getcwd()", context_id=made["id"]).text == str(tmp_path)
    assert _run(url, "'mine' in dir()").text == "False"  # the default context is another kernel
    assert made["id"] in {context["id"] for context in httpx.get(f"{url}/contexts").json()}
    assert httpx.delete(f"{url}/contexts/{made['id']}", timeout=30).status_code == 200
    assert httpx.post(f"{url}/execute", json={"code": "1", "context_id": made["id"]}).status_code == 404


def test_bad_requests_answer_clearly(url: str) -> None:
    both = httpx.post(f"{url}/execute", json={"code": "1", "language": "python", "context_id": "x"})
    assert both.status_code == 400
    assert "Only one" in both.text
    assert httpx.post(f"{url}/execute", json={"code": "1", "language": "cobol"}).status_code == 400
    assert httpx.post(f"{url}/execute", content=b"[1]").status_code == 400


def test_a_client_that_leaves_interrupts_its_execution(url: str) -> None:
    context = httpx.post(f"{url}/contexts", json={}, timeout=60).json()["id"]
    with httpx.stream(
        "POST",
        f"{url}/execute",
        json={"code": "print('started', flush=True)\nimport time\ntime.sleep(600)", "context_id": context},
    ) as response:
        lines = response.iter_lines()
        assert json.loads(next(line for line in lines if "started" in line))["type"] == "stdout"
    # the connection is closed: the sleep is interrupted, so the context answers again at once
    execution = _run(url, "'free'", context_id=context)
    assert execution.text == "free"
