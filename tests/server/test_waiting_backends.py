"""The service's awaited path (`sandboxes.server.waiting`) on the local jail, SSH, Kubernetes (the
fake API server) and Docker, one service holding a template of each: with the sandbox's helper up, a
command through the service runs on no thread (the thread path, `run_marked`, is never entered,
and more commands run at once than the service has command threads), and answers exactly what
the sandbox's own ``execute_streaming`` (the thread path) answers for the same command: env and
cwd, a timeout (its tree killed), output past the limit, stdout and stderr apart in a stream, and
a helper killed under the command (``connection_lost``, in the backend's words; never run twice).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import UNTHROTTLED, Running, create, execute, running, settings_for
from ssh_fixtures import start_vm
from support import HAS_BWRAP, SESSION_OWNER, needs

from sandboxes import protocol as p
from sandboxes.base import BaseSandbox
from sandboxes.server import execution
from sandboxes.server.backends import MARKER_ENV
from sandboxes.server.settings import TenantPolicy

sys.path.append(str(Path(__file__).parent.parent / "kubernetes"))
from fake_cluster import fake_kubeconfig_fixture, fake_template

BACKENDS = ("local", "ssh", "kubernetes", "docker")
THREADS = 2
"""The service's command threads: fewer than the commands `test_running_commands_hold_no_thread`
runs at once."""
ANSWER = ("output", "exit_code", "truncated", "error", "message")
"""What an answer is compared on (not its duration)."""


fake_kubeconfig = fake_kubeconfig_fixture()


@pytest.fixture(scope="module")
def service(
    docker_client: Any, runtime_image: str, fake_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
    workdir = tmp_path_factory.mktemp("awaited")
    vm = start_vm(workdir / "ssh")
    host = vm.config_host(workdir / "ssh-key")
    sandbox_env = {"FROM_SANDBOX": "template", "SHADOWED": "template"}
    templates = {
        "local": {"backend": "local", "default_timeout": 30, "memory": "256m", "env": sandbox_env},
        "ssh": {
            "backend": "ssh",
            "hosts": [host],
            "workspace_root": f"/tmp/svc-{uuid.uuid4().hex[:8]}",
            "env": sandbox_env,
        },
        "docker": {
            "backend": "docker",
            "image": runtime_image,
            "cpus": 0.5,
            "memory": "256m",
            "labels": {"io.sandboxes.test-session": SESSION_OWNER},
            "env": sandbox_env,
        },
        "kubernetes": fake_template(fake_kubeconfig, runtime_image, env=sandbox_env),
    }
    owner = f"{SESSION_OWNER}-awaited-{uuid.uuid4().hex[:6]}"
    settings = settings_for(
        workdir / "service",
        owner=owner,
        templates=templates,
        tenants={**UNTHROTTLED, "alice": TenantPolicy(rate=10_000, burst=10_000, max_commands=16)},
        command_threads=THREADS,
    )
    try:
        with running(settings, docker_client=docker_client) as svc:
            yield svc
    finally:
        vm.stop()


@pytest.fixture(scope="module")
def client(service: Running) -> Iterator[httpx.Client]:
    with service.client("alice") as made:
        yield made


@pytest.fixture(scope="module", params=BACKENDS)
def made(request: pytest.FixtureRequest, client: httpx.Client) -> Iterator[dict[str, Any]]:
    sandbox = create(client, template=request.param)
    try:
        yield sandbox
    finally:
        client.delete(f"/v1/sandboxes/{sandbox['id']}")


@pytest.fixture
def threaded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The commands the service ran on the thread path (`run_marked`, in a command thread), from now."""
    ran: list[str] = []
    real = execution.run_marked

    def counted(sandbox: BaseSandbox, command: Any, token: str, on_output: Any) -> p.ExecuteResponse:
        ran.append(command.command)
        return real(sandbox, command, token, on_output)

    monkeypatch.setattr(execution, "run_marked", counted)
    return ran


def _sandbox(service: Running, made: dict[str, Any]) -> BaseSandbox:
    sandbox: BaseSandbox = service.registry._entries[made["id"]].sandbox
    return sandbox


def _up(client: httpx.Client, made: dict[str, Any]) -> None:
    """The sandbox's exec helper runs (the first command of a sandbox may start it, on a thread)."""
    assert execute(client, made["id"], "true")["exit_code"] == 0


def _direct(sandbox: BaseSandbox, command: str, **options: Any) -> p.ExecuteResponse:
    """``command`` as the thread path runs it (`sandboxes.server.processes.run_marked`)."""
    env = {**options.pop("env", {}), MARKER_ENV: uuid.uuid4().hex}
    return sandbox.execute_streaming(command, None, env=env, **options)


def _same(answer: dict[str, Any], direct: p.ExecuteResponse) -> None:
    assert {key: answer[key] for key in ANSWER} == {key: getattr(direct, key) for key in ANSWER}


def _wait_for(condition: Callable[[], bool], what: str | Callable[[], str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.05)


def test_running_commands_hold_no_thread(
    service: Running, client: httpx.Client, made: dict[str, Any], threaded: list[str]
) -> None:
    """Twice as many long commands at once as the service has command threads all run."""
    _up(client, made)
    threaded.clear()
    workdir, count = made["workdir"], 2 * THREADS
    release = f"{workdir}/release-{uuid.uuid4().hex[:6]}"
    log = f"{release}.log"
    command = f"echo started >> {log}; while [ ! -e {release} ]; do sleep 0.05; done; echo done"
    url = f"/v1/sandboxes/{made['id']}/execute"
    read = f"/v1/sandboxes/{made['id']}/files/read"

    seen: list[Any] = []

    def started() -> int:  # a file op, not a command: it needs no command thread
        seen[:] = [client.post(read, json={"file_path": log}).json(), list(threaded)]
        return str((seen[0].get("file_data") or {}).get("content", "")).count("started")

    try:
        with ThreadPoolExecutor(count) as pool:
            answers = [pool.submit(client.post, url, json={"command": command}) for _ in range(count)]
            _wait_for(
                lambda: started() == count, lambda: f"fewer than {count} commands ran at once: {seen}", timeout=20
            )
            assert not any(answer.done() for answer in answers)
            client.post(f"/v1/sandboxes/{made['id']}/files/write", json={"file_path": release, "content": ""})
            assert [answer.result().json()["output"] for answer in answers] == ["done\n"] * count
    finally:
        client.post(f"/v1/sandboxes/{made['id']}/files/write", json={"file_path": release, "content": ""})
    assert threaded == []


def test_env_and_cwd_as_on_the_thread_path(
    service: Running, client: httpx.Client, made: dict[str, Any], threaded: list[str]
) -> None:
    sandbox = _sandbox(service, made)
    sub = f"{made['workdir']}/sub dir"
    assert execute(client, made["id"], f"mkdir -p '{sub}'")["exit_code"] == 0
    threaded.clear()
    command = 'printf "%s|" "$FROM_SANDBOX" "$SHADOWED" "$MINE" "$HOME" "$PATH" "$LANG" "$PWD" "$(pwd)" "$(id -u)"'
    for cwd in (None, sub, f"{made['workdir']}/missing"):
        env = {"MINE": "request", "SHADOWED": "request"}
        answer = execute(client, made["id"], command, env=env, cwd=cwd)
        _same(answer, _direct(sandbox, command, env=env, cwd=cwd))
    assert answer["error"] == p.FILE_NOT_FOUND, answer  # the last: its working directory is missing
    assert threaded == []


def test_a_timeout_as_on_the_thread_path(
    service: Running, client: httpx.Client, made: dict[str, Any], threaded: list[str]
) -> None:
    """The answer alike, and the command's whole tree killed (a child left behind included)."""
    sandbox = _sandbox(service, made)
    _up(client, made)
    threaded.clear()
    survivors = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 4[12] '"
    answer = execute(client, made["id"], "echo before; (sleep 41 &); sleep 30", timeout=1)
    direct = _direct(sandbox, "echo before; (sleep 42 &); sleep 30", timeout=1.0)  # as the service has it
    _same(answer, direct)
    assert (answer["error"], answer["output"]) == (p.TIMEOUT, "before\n"), answer
    assert threaded == []
    _wait_for(lambda: execute(client, made["id"], survivors)["output"] == "0\n", "the tree outlived its timeout")


def test_output_past_the_limit_as_on_the_thread_path(
    service: Running, client: httpx.Client, made: dict[str, Any], threaded: list[str]
) -> None:
    sandbox = _sandbox(service, made)
    _up(client, made)
    threaded.clear()
    command = "seq 1 30000; echo tail >&2"
    answer = execute(client, made["id"], command, output_limit=10_000)
    _same(answer, _direct(sandbox, command, output_limit=10_000))
    assert (answer["truncated"], answer["output"][-5:]) == (True, "tail\n"), answer
    assert threaded == []


def test_a_stream_keeps_stderr_apart_as_on_the_thread_path(
    service: Running, client: httpx.Client, made: dict[str, Any], threaded: list[str]
) -> None:
    sandbox = _sandbox(service, made)
    _up(client, made)
    threaded.clear()
    command = "echo out; echo err >&2; echo more; echo again >&2"
    streams: dict[str, str] = {}
    with client.stream("POST", f"/v1/sandboxes/{made['id']}/execute/stream", json={"command": command}) as r:
        events = [json.loads(line) for line in r.iter_lines() if line]
    for event in events:
        if event["type"] == "output" and event.get("data"):
            streams[event.get("stream", "stdout")] = streams.get(event.get("stream", "stdout"), "") + event["data"]
    direct: dict[str, str] = {}

    def hook(chunk: bytes, stream: str = "merged") -> None:
        direct[stream] = direct.get(stream, "") + chunk.decode()

    env = {MARKER_ENV: uuid.uuid4().hex}
    final = sandbox.execute_streaming(command, hook, env=env)
    assert streams == direct == {"stdout": "out\nmore\n", "stderr": "err\nagain\n"}
    assert events[-1]["type"] == "exit"
    result = events[-1]["result"]  # merged: which of two pipes the helper read first may differ
    assert sorted(result.pop("output").splitlines()) == sorted(final.output.splitlines())
    _same({**result, "output": final.output}, final)
    assert threaded == []


def test_a_helper_killed_under_a_command_as_on_the_thread_path(
    service: Running, client: httpx.Client, made: dict[str, Any], threaded: list[str]
) -> None:
    """The command kills its own helper (its shell's parent): ``connection_lost`` in the
    backend's words, the command not run again; then the next command starts a new helper."""
    sandbox = _sandbox(service, made)
    ran = f"{made['workdir']}/ran-{uuid.uuid4().hex[:6]}"
    command = f"echo ran >> {ran}; kill -9 $PPID; sleep 10"
    _up(client, made)
    threaded.clear()
    answer = execute(client, made["id"], command)
    assert threaded == []
    assert answer["error"] == p.CONNECTION_LOST, answer
    assert execute(client, made["id"], f"cat {ran}")["output"] == "ran\n"
    _up(client, made)
    direct = _direct(sandbox, command)
    _same(answer, direct)
    assert execute(client, made["id"], f"cat {ran}")["output"] == "ran\nran\n"


def test_an_out_of_memory_kill_as_on_the_thread_path(
    service: Running, client: httpx.Client, made: dict[str, Any], threaded: list[str]
) -> None:
    """A command past the memory limit answers alike: ``out_of_memory`` where the backend tells an
    OOM kill from a plain exit 137 (SSH has no such check: whatever it answers, it answers alike)."""
    sandbox = _sandbox(service, made)
    _up(client, made)
    threaded.clear()
    command = "python3 -c \"b = b'x' * (1 << 30); print(len(b))\""
    answer = execute(client, made["id"], command)
    assert threaded == []
    _same(answer, _direct(sandbox, command))
    if getattr(sandbox, "_cgroup", None) is not None:  # a local jail in a memory cgroup of its own
        assert answer["error"] == p.OUT_OF_MEMORY, answer
