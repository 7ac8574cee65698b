"""Running the service for tests: in-process (a real uvicorn server on 127.0.0.1 in a thread)
or as a subprocess (``python -m sandboxes.server``), and talking to it with httpx."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from support import SESSION_OWNER

from sandboxes.local import LocalTemplate
from sandboxes.server.app import create_app
from sandboxes.server.auth import hash_key
from sandboxes.server.clock import Clock
from sandboxes.server.serving import uvicorn_config
from sandboxes.server.settings import ServiceSettings, TenantPolicy

CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}
"""The label by which the session's cleanup removes what a test left in the Docker engine."""
KEYS = {"alice": "key-alice-0123456789", "bob": "key-bob-0123456789", "tiny": "key-tiny-0123", "slow": "key-slow-0123"}
"""Tenant -> API key. ``tiny`` has a quota of one small sandbox; ``slow`` 2 requests/s."""

POLICIES = {
    "tiny": TenantPolicy(max_sandboxes=1, max_cpus=1.5, max_memory="1g"),
    "slow": TenantPolicy(rate=2.0, burst=3),
}
UNTHROTTLED = {**POLICIES, "alice": TenantPolicy(rate=10_000, burst=10_000)}
"""For suites that drive a whole backend through the service (conformance, langchain-tests):
on a fast machine they exceed the default 100 requests/s, and a refused write is not retried."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def settings_for(data_dir: Path, **overrides: Any) -> ServiceSettings:
    options: dict[str, Any] = {
        "data_dir": data_dir,
        "api_keys": {hash_key(key): tenant for tenant, key in KEYS.items()},
        "tenants": POLICIES,
        "templates": {"default": LocalTemplate(default_timeout=30), "big": LocalTemplate(cpus=4, memory="1g")},
        "sweep_interval": 0.2,
    }
    options.update(overrides)
    return ServiceSettings(**options)


class ManualClock:
    """A FAKE clock (`sandboxes.server.clock.Clock`): it moves only when told to (`advance`),
    from the wall clock's time at creation, so a test expires a TTL without sleeping through it.

    Expiry decisions follow it; the per-sandbox timers still wait real seconds, so with this clock
    a sandbox expires when a sweep runs after `advance` has moved past its expiry."""

    def __init__(self) -> None:
        self._now = time.time()
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (never back: expiries only pass); the new time."""
        if seconds < 0:
            raise ValueError("a clock does not go back")
        with self._lock:
            self._now += seconds
            return self._now


@dataclass
class Running:
    url: str
    app: Any
    server: uvicorn.Server

    def client(self, tenant: str | None = "alice", **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {KEYS[tenant]}"} if tenant else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60, **kwargs)

    @property
    def registry(self) -> Any:
        return self.app.state.service.registry

    def sweep(self) -> None:
        """One sweep of the registry now, returning when it is done: what expired on the
        service's clock is destroyed by then."""
        self.registry.sweep_soon().result(60)


@contextlib.contextmanager
def running(
    settings: ServiceSettings, *, docker_client: Any = None, drain: int = 10, clock: Clock | None = None
) -> Iterator[Running]:
    app = create_app(settings, docker_client=docker_client, clock=clock)
    port = free_port()
    config = uvicorn_config(  # as deployed
        app, host="127.0.0.1", port=port, drain_timeout=drain, max_header_bytes=settings.max_header_bytes
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the service did not start")
        time.sleep(0.02)
    try:
        yield Running(f"http://127.0.0.1:{port}", app, server)
    finally:
        server.should_exit = True
        thread.join(30)


def alice_fixtures() -> tuple[Callable[..., Iterator[httpx.Client]], Callable[..., Iterator[dict[str, Any]]]]:
    """Module-scoped ``client`` and ``sandbox`` fixtures: alice's client to the module's
    ``service``, and one sandbox made through it, deleted after the module's tests."""

    @pytest.fixture(scope="module")
    def client(service: Running) -> Iterator[httpx.Client]:
        with service.client("alice") as client:
            yield client

    @pytest.fixture(scope="module")
    def sandbox(client: httpx.Client) -> Iterator[dict[str, Any]]:
        created = create(client)
        yield created
        client.delete(f"/v1/sandboxes/{created['id']}")

    return client, sandbox


def create(client: httpx.Client, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/sandboxes", json=body)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def execute(client: httpx.Client, sandbox_id: str, command: str, **body: Any) -> dict[str, Any]:
    response = client.post(f"/v1/sandboxes/{sandbox_id}/execute", json={"command": command, **body})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def wait_until_expired(sandbox: dict[str, Any]) -> None:
    """Until the wall clock is past ``sandbox``'s expiry, as the service answered it. A service in
    a subprocess runs on the real clock (in-process tests move a `ManualClock` instead), so
    its TTLs pass only with time: this waits for exactly that instant, not a guessed margin."""
    expires_at = float(sandbox["expires_at"])
    while (left := expires_at - time.time()) >= 0:
        time.sleep(left + 0.01)


def heartbeat(path: str) -> str:
    """A loop that writes the time (ns) to ``path`` every 0.1 s, for as long as it lives. In a
    ``sh -c`` of its own (exec'd: the same process), so that the loop's text is in its command
    line (`heartbeat_processes`) also when the command runs in a shell the exec helper started
    ahead of it, whose command line is ``/bin/sh -s`` (`sandboxes._helper._spawn`)."""
    return "exec sh -c " + shlex.quote(f"while :; do {_beat(path)} sleep 0.1; done")


def _beat(path: str) -> str:
    """The heartbeat loop's write, which every process running the loop (its shell, and the
    command that started it) has in its command line."""
    return f"date +%s%N > {shlex.quote(path)};"


def last_beat(client: httpx.Client, sandbox_id: str, path: str) -> str:
    """What the heartbeat loop last wrote to ``path``. Fails if it never wrote there: a loop
    that never started would otherwise look exactly like one that was stopped."""
    result = execute(client, sandbox_id, f"cat {shlex.quote(path)}")
    assert result["exit_code"] == 0, f"the loop never started: {result['output']!r}"
    return str(result["output"])


def start_process(client: httpx.Client, sandbox_id: str, command: str, **body: Any) -> dict[str, Any]:
    """Start ``command`` through the background-process API; fails unless the service answers
    it started (a loop whose start failed would otherwise look like one that never ran)."""
    response = client.post(f"/v1/sandboxes/{sandbox_id}/processes", json={"command": command, **body})
    assert response.status_code == 202, response.text
    process: dict[str, Any] = response.json()
    assert process["status"] == "running", process
    return process


def wait_beating(
    client: httpx.Client, sandbox_id: str, path: str, timeout: float = 10, process: dict[str, Any] | None = None
) -> None:
    """Until the heartbeat loop at ``path`` has beaten twice: it runs. ``process``: the
    background process that started it, whose state the failure reports."""
    deadline = time.monotonic() + timeout
    seen: set[str] = set()
    result: dict[str, Any] = {}
    while len(seen) < 2:
        if time.monotonic() >= deadline:
            state = "" if process is None else client.get(f"/v1/sandboxes/{sandbox_id}/processes/{process['id']}").text
            raise AssertionError(f"the loop at {path} never beat twice in {timeout}s: {seen=} {result=} {state}")
        result = execute(client, sandbox_id, f"cat {shlex.quote(path)} 2>/dev/null")
        if result["exit_code"] == 0 and result["output"].strip():
            seen.add(result["output"])
        time.sleep(0.05)


def heartbeat_stopped(client: httpx.Client, sandbox_id: str, path: str) -> bool:
    """Whether the heartbeat loop at ``path`` ran (it wrote there) and has stopped: no process in
    the sandbox runs it any more. Asked of the sandbox's process table, not inferred from a
    beat missing for a while, which a loop that lives on but is slow to be scheduled (a loaded
    machine) would also show."""
    last_beat(client, sandbox_id, path)
    return not heartbeat_processes(client, sandbox_id, path)


def heartbeat_processes(client: httpx.Client, sandbox_id: str, path: str) -> list[str]:
    """The ``/proc/<pid>/cmdline`` of every live process in the sandbox that runs the heartbeat
    loop at ``path``. The loop's text reaches ``grep`` on its stdin, so the search is not in
    its own command line; a process that died (a zombie too) has an empty one."""
    search = "grep -lsF -f - /proc/[0-9]*/cmdline; true"
    stdin = base64.b64encode(_beat(path).encode()).decode()
    result = execute(client, sandbox_id, search, stdin_b64=stdin)
    assert result["exit_code"] == 0, result
    return str(result["output"]).split()


SHELL_STARTED_AS = "tr '\\0' ' ' </proc/$$/cmdline | cut -c1-10"
"""Prints how the command's own shell was started: ``/bin/sh -s`` when the exec helper started
it ahead of the command (`sandboxes._helper._spawn`), ``/bin/sh -c`` when it came with it."""


def assert_commands_run_warm_with_the_services_markers(client: httpx.Client, sandbox_id: str) -> None:
    """The service marks each command with a token of its own (what its kills look for); the
    exec helper's shell started ahead carries the one announced for it
    (`sandboxes.base.MarksAhead`). From the third command of a helper on: the first may start
    the helper, the second announces the third's."""
    answers = [execute(client, sandbox_id, f"echo $SANDBOXES_EXEC_ID; {SHELL_STARTED_AS}") for _ in range(5)]
    lines = [str(answer["output"]).split("\n") for answer in answers]
    markers = [line[0] for line in lines]
    assert len(set(markers)) == 5, markers
    assert all(len(marker) == 32 for marker in markers), markers  # the service's (`unique_id`)
    assert [line[1] for line in lines][2:] == ["/bin/sh -s"] * 3, lines


def assert_a_left_warm_command_is_killed(service: Running, client: httpx.Client, sandbox_id: str, beat: str) -> None:
    """A client leaving a plain execute that runs in a shell started ahead: the command is not
    left running until its (long) timeout, but killed by the service's token for it, which its
    tree (the shell included) carries from the start."""
    command = f"{SHELL_STARTED_AS} > {beat}.shell; (setsid sh -c {shlex.quote(heartbeat(beat))} &); sleep 100"
    for _ in range(2):  # the next runs in a shell started ahead (see above)
        assert execute(client, sandbox_id, "true")["exit_code"] == 0
    impatient = httpx.Client(base_url=service.url, headers=client.headers, timeout=httpx.Timeout(60, read=1.5))
    with impatient, pytest.raises(httpx.ReadTimeout):
        impatient.post(f"/v1/sandboxes/{sandbox_id}/execute", json={"command": command, "timeout": 120})
    assert execute(client, sandbox_id, f"cat {beat}.shell")["output"] == "/bin/sh -s\n"
    deadline = time.monotonic() + 10
    while not heartbeat_stopped(client, sandbox_id, beat):
        assert time.monotonic() < deadline, "the abandoned command kept running"


def error_of(response: httpx.Response) -> str:
    body = response.json()
    assert set(body) == {"error", "message", "request_id"}, body
    return str(body["error"])


class ServiceProcess:
    """``python -m sandboxes.server`` with a config file; its JSON log goes to a file."""

    def __init__(self, config: dict[str, Any], workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = workdir / "service.json"
        self.config_path.write_text(json.dumps({**config, "port": self.port}))
        self.log_path = workdir / f"service-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(
        self,
        *extra: str,
        timeout: float = 120,
        env: dict[str, str] | None = None,
        program: tuple[str, ...] = ("-m", "sandboxes.server"),
    ) -> ServiceProcess:
        """The service, once its ``/readyz`` answers 200 (polled: a fast start waits for nothing
        more); ``timeout`` leaves room for a start that adopts sandboxes on a loaded machine;
        ``env`` adds to its environment (none of the caller's ``SANDBOXES_`` variables reach it);
        ``program``: what the interpreter runs, given the service's arguments (a script that
        changes the service before serving, for a test)."""
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("SANDBOXES_")}, **(env or {})}
        env["TMPDIR"] = str(self.config_path.parent)  # what a SIGKILL leaves in /tmp stays in the test's dir
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, *program, "--config", str(self.config_path), *extra],
                stdout=log,
                stderr=log,
                env=env,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"service exited {self.process.returncode}: {self.log_path.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return self
            time.sleep(0.1)
        raise RuntimeError(f"service not ready in {timeout}s: {self.log_path.read_text()[-3000:]}")

    def client(self, tenant: str = "alice") -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {KEYS[tenant]}"}, timeout=60)

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()  # SIGKILL: no shutdown code runs
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log_path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                lines.append(json.loads(line))
        return lines


def subprocess_config(data_dir: Path, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "data_dir": str(data_dir),
        "api_keys": {hash_key(key): tenant for tenant, key in KEYS.items()},
        "templates": {"default": {"default_timeout": 30}},
        "sweep_interval": 0.2,
    }
    config.update(overrides)
    return config


def backend_process(
    tmp_path: Path, runtime_image: str, backend: str, tag: str, **template: Any
) -> tuple[ServiceProcess, str]:
    """A service process, not started, kept in ``tmp_path`` (its data in ``data``) and its owner:
    the session's, ``tag`` and a random suffix. Its one template runs ``backend``: ``docker`` (the
    runtime image, labelled with `CLEANUP`) or ``local`` (a jail), with ``template`` added."""
    owner = f"{SESSION_OWNER}-{tag}-{uuid.uuid4().hex[:6]}"
    base: dict[str, Any] = {"backend": "local", "default_timeout": 30}
    if backend == "docker":
        base = {"backend": "docker", "image": runtime_image, "cpus": 0.5, "memory": "256m", "labels": CLEANUP}
    config = subprocess_config(tmp_path / "data", owner=owner, templates={"default": {**base, **template}})
    return ServiceProcess(config, tmp_path), owner


@contextlib.contextmanager
def started(
    service: ServiceProcess, owner: str, docker_client: Any, env: dict[str, str] | None = None
) -> Iterator[ServiceProcess]:
    """``service`` started with ``env``; at the end, stopped (if it still runs) and every
    container of ``owner``'s removed, whatever the test left."""
    service.start(env=env)
    try:
        yield service
    finally:
        service.stop()
        remove_owned(docker_client, owner)


def owned_containers(docker_client: Any, owner: str) -> list[Any]:
    """Every container of ``owner``'s, whatever its state."""
    return list(docker_client.containers.list(all=True, filters={"label": f"io.sandboxes.owner={owner}"}))


def remove_owned(docker_client: Any, owner: str) -> None:
    """Every container of ``owner``'s removed, with its volumes."""
    for container in owned_containers(docker_client, owner):
        container.remove(force=True, v=True)


def assert_an_archive_streams_whole(client: httpx.Client, size: int) -> None:
    """``GET /archive`` of a tree holding ``size`` random bytes answers them whole."""
    import hashlib
    import io
    import tarfile

    sandbox = create(client)
    base = f"/v1/sandboxes/{sandbox['id']}"
    try:
        made = execute(
            client, sandbox["id"], f"mkdir big && head -c {size} /dev/urandom > big/blob && sha256sum big/blob"
        )
        digest = made["output"].split()[0]
        archive = client.get(f"{base}/archive", params={"path": f"{sandbox['workdir']}/big"}, timeout=120)
        assert archive.status_code == 200, archive.text[:500]
        with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
            member = tar.extractfile("big/blob")
            assert member is not None
            assert hashlib.sha256(member.read()).hexdigest() == digest
    finally:
        client.delete(base)
