"""A bounded load test over real HTTP on 127.0.0.1: 20 clients for ``SANDBOXES_LOAD_SECONDS``
(default 60) against the service run as a subprocess, with the Docker backend when an engine
answers, else the local one (``SANDBOXES_LOAD_BACKEND=docker|local`` forces one).

Each client owns one sandbox for the whole run and, every few seconds, asks for extra ones to
use and delete. The tenant's quota is one sandbox per client plus `EXTRA`, and every client
holds its own for the whole run, so at most `EXTRA` extras exist at a time across all clients:
a client asking for `EXTRA` + 1 is refused (``quota_exceeded``) at least once, every time. Those
refusals are the only errors allowed; they are counted, and the service's own metrics must
count exactly as many. Everything written (uploads of random binary content, writes of random
text, tar archives, stdin) is read back and compared, as it comes back through the API and as
the sandbox itself sees it (``sha256sum``), then once more at the end.

The run is bounded: each client stops at the deadline or after `MAX_ITERATIONS`, every request
has a timeout, and the threads are joined with one. Throughput is printed, never asserted.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import random
import re
import statistics
import tarfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import KEYS, ServiceProcess, subprocess_config
from support import SESSION_OWNER

LOAD_SECONDS = float(os.environ.get("SANDBOXES_LOAD_SECONDS", "60"))
CLIENTS = 20
EXTRA = 2
"""Sandboxes the quota allows beyond one per client."""
MAX_ITERATIONS = 100_000
"""Per client: a bound on the work even if every request were instant."""
REQUEST_TIMEOUT = 60.0
SETUP_TIMEOUT = 300.0
CHURN_SECONDS = (2.0, 6.0)
"""A client asks for extra sandboxes at its first iteration, then after a random pause in this range."""
SLOTS = 4
"""Files per kind each client rotates through in its sandbox, so later writes overwrite earlier ones."""
TENANT = "alice"
CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}

_TEXT_ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    " \t\n\n\n\r\n\"'`$\\{}[]()<>|&;*?~#%!=+-_.,:/@^"
    "éüßñøЖжΩπ中文字😀🚀\u00a0\u2028\x0b\x0c\x1e\x85"
)
"""Random text draws from this: quotes and shell metacharacters, CR, CRLF, multi-byte and
astral characters, and the other line boundaries of ``str.splitlines``; no NUL (that would
make the file binary)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _code(response: httpx.Response) -> str | None:
    with contextlib.suppress(ValueError, AttributeError):
        return str(response.json().get("error"))
    return None


@dataclass
class _Client:
    """One load client: its own connection, random source, tallies and expectations."""

    index: int
    url: str
    rng: random.Random
    http: httpx.Client = field(init=False)
    errors: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    refusals: int = 0
    extras_made: int = 0
    iterations: int = 0
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    load_requests: int = 0
    load_started: float = 0.0
    load_ended: float = 0.0
    home: str = ""
    directory: str = ""
    expected: dict[str, bytes] = field(default_factory=dict)
    """Path in the home sandbox -> the content last written there."""
    stalled: bool = False
    """A request failed in transport (a timeout): this client sends nothing more until its
    cleanup, so one stuck sandbox costs one timeout, not one per remaining operation."""

    def __post_init__(self) -> None:
        headers = {"Authorization": f"Bearer {KEYS[TENANT]}"}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=REQUEST_TIMEOUT)

    # ------------------------------------------------------------------ plumbing

    def _call(self, op: str, method: str, url: str, **kwargs: Any) -> httpx.Response | None:
        if self.stalled:
            return None
        started = time.perf_counter()
        try:
            response = self.http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            self.errors.append(f"{op} {url}: {type(exc).__name__}: {exc}")
            self.stalled = True
            return None
        self.latencies[op].append((time.perf_counter() - started) * 1000)
        return response

    def _ok(self, op: str, response: httpx.Response | None, status: int = 200) -> Any:
        if response is None:
            return None
        if response.status_code != status:
            self.errors.append(f"{op}: HTTP {response.status_code} {response.text[:300]}")
            return None
        return response.json() if response.content else {}

    def _check(self, what: str, ok: bool, detail: str) -> bool:
        if not ok:
            self.mismatches.append(f"client {self.index}: {what}: {detail[:300]}")
        return ok

    def _random_bytes(self) -> bytes:
        size = self.rng.choice((1, 7, 511, 4096, 65_536, self.rng.randint(1, 65_536)))
        data = bytearray(self.rng.randbytes(size))
        data[self.rng.randrange(size)] = 0  # a NUL makes it binary for read() whatever the rest
        return bytes(data)

    def _random_text(self) -> str:
        return "x" + "".join(self.rng.choices(_TEXT_ALPHABET, k=self.rng.randint(0, 4000)))

    def _files(self, op: str, sandbox_id: str, body: dict[str, Any]) -> Any:
        """``POST /files/{op}``: its protocol result, or None after recording an HTTP failure."""
        return self._ok(op, self._call(op, "POST", f"/v1/sandboxes/{sandbox_id}/files/{op}", json=body))

    def _execute(self, sandbox_id: str, command: str, **body: Any) -> dict[str, Any] | None:
        response = self._call(
            "execute", "POST", f"/v1/sandboxes/{sandbox_id}/execute", json={"command": command, **body}
        )
        result: dict[str, Any] | None = self._ok("execute", response)
        return result

    # ------------------------------------------------------------------ round trips

    def _download(self, sandbox_id: str, expected: dict[str, bytes]) -> None:
        body = {"paths": list(expected)}
        items = self._files("download", sandbox_id, body)
        if items is None:
            return
        got = {item["path"]: item for item in items}
        for path, data in expected.items():
            item = got.get(path, {})
            if self._check(f"download {path}", item.get("error") is None, str(item)):
                content = base64.b64decode(item.get("content_b64") or "")
                self._check(f"download {path}", content == data, f"{len(content)} bytes back for {len(data)} written")

    def _upload(self, sandbox_id: str, path: str) -> bytes | None:
        data = self._random_bytes()
        body = {"files": [{"path": path, "content_b64": _b64(data)}]}
        result = self._files("upload", sandbox_id, body)
        uploaded = [{"path": path, "error": None, "message": None}]
        if result is None or not self._check(f"upload {path}", result == uploaded, str(result)):
            return None
        self._download(sandbox_id, {path: data})
        read = self._files("read", sandbox_id, {"file_path": path})
        if read is not None and self._check(f"read {path}", read["error"] is None, str(read)):
            file_data = read["file_data"]
            self._check(f"read {path} (binary)", file_data["encoding"] == "base64", str(file_data)[:200])
            self._check(f"read {path}", base64.b64decode(file_data["content"]) == data, "content differs")
        return data

    def _write(self, sandbox_id: str, path: str) -> bytes | None:
        text = self._random_text()
        body = {"file_path": path, "content": text}
        result = self._files("write", sandbox_id, body)
        if result is None or not self._check(f"write {path}", result.get("error") is None, str(result)):
            return None
        read = self._files("read", sandbox_id, {"file_path": path, "limit": 1_000_000})
        if read is not None and self._check(f"read {path}", read["error"] is None, str(read)):
            shown = text.replace("\r\n", "\n").replace("\r", "\n")  # read() shows every line ending as LF
            self._check(f"read {path}", read["file_data"]["content"] == shown, "text differs")
        data = text.encode("utf-8")
        self._download(sandbox_id, {path: data})
        return data

    def _hashes_inside(self, names: list[str]) -> None:
        """The sandbox itself sees the bytes written: ``sha256sum`` run in it."""
        result = self._execute(self.home, "sha256sum " + " ".join(names), cwd=self.directory)
        if result is None:
            return
        expected = "".join(
            f"{hashlib.sha256(self.expected[f'{self.directory}/{n}']).hexdigest()}  {n}\n" for n in names
        )
        self._check("sha256sum", (result["exit_code"], result["output"]) == (0, expected), str(result))

    def _stdin_and_env(self) -> None:
        data = self.rng.randbytes(self.rng.randint(1, 4096))
        tag = f"t{self.rng.getrandbits(64):x}"
        command = 'printf "%s:" "$LOAD_TAG"; base64 -w0'
        result = self._execute(self.home, command, stdin_b64=_b64(data), env={"LOAD_TAG": tag})
        if result is not None:
            self._check("stdin", (result["exit_code"], result["output"]) == (0, f"{tag}:{_b64(data)}"), str(result))

    def _archive(self, n: int) -> None:
        target = f"{self.directory}/arc{n}"
        members = {f"a{j}.bin": self._random_bytes() for j in range(self.rng.randint(1, 3))}
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                archive.addfile(info, io.BytesIO(data))
        url = f"/v1/sandboxes/{self.home}/archive"
        put = self._call("archive put", "PUT", url, params={"path": target}, content=buffer.getvalue())
        if self._ok("archive put", put, 204) is None:
            return
        response = self._call("archive get", "GET", url, params={"path": target})
        if response is None:
            return
        if response.status_code != 200:
            self.errors.append(f"archive get: HTTP {response.status_code} {response.text[:300]}")
            return
        got = {}
        with tarfile.open(fileobj=io.BytesIO(response.content)) as archive:
            for member in archive.getmembers():
                handle = archive.extractfile(member) if member.isfile() else None
                if handle is not None:
                    got[member.name.split("/", 1)[-1]] = handle.read()
        self._check("archive round trip", got == members, f"{sorted(got)} for {sorted(members)}")
        deleted = self._files("delete", self.home, {"file_path": target})
        if deleted is not None:
            self._check(f"delete {target}", deleted.get("error") is None, str(deleted))

    def _stream(self) -> None:
        command = "printf 'one\\n'; printf 'two\\n' >&2; printf 'three\\n'; exit 3"
        if self.stalled:
            return
        started = time.perf_counter()
        events = []
        try:
            url = f"/v1/sandboxes/{self.home}/execute/stream"
            with self.http.stream("POST", url, json={"command": command}) as response:
                if response.status_code != 200:
                    response.read()
                    self.errors.append(f"stream: HTTP {response.status_code} {response.text[:300]}")
                    return
                events = [json.loads(line) for line in response.iter_lines() if line]
        except httpx.HTTPError as exc:
            self.errors.append(f"stream: {type(exc).__name__}: {exc}")
            self.stalled = True
            return
        self.latencies["stream"].append((time.perf_counter() - started) * 1000)
        streams: dict[str, str] = {}  # apart: between them, the order is as the helper read them
        for event in events:
            if event["type"] == "output" and event.get("data"):
                name = event.get("stream", "stdout")
                streams[name] = streams.get(name, "") + event["data"]
        last = events[-1] if events else {}
        apart = streams == {"stdout": "one\nthree\n", "stderr": "two\n"}
        merged = set(streams) == {"merged"} and sorted(streams["merged"].split()) == [
            "one",
            "three",
            "two",
        ]  # no helper
        ok = (apart or merged) and last.get("type") == "exit"
        ok = (
            ok
            and last["result"]["exit_code"] == 3
            and sorted(last["result"]["output"].split()) == ["one", "three", "two"]
        )
        self._check("stream", ok, str(events))

    def _churn(self) -> None:
        """Ask for one extra sandbox more than the quota can ever leave free; use and delete
        the ones granted."""
        made = []
        for _ in range(EXTRA + 1):
            response = self._call("create", "POST", "/v1/sandboxes", json={"labels": {"role": "extra"}})
            if response is None:
                continue
            if response.status_code == 201:
                made.append(response.json())
            elif response.status_code == 429 and _code(response) == "quota_exceeded":
                self.refusals += 1
            else:
                self.errors.append(f"create: HTTP {response.status_code} {response.text[:300]}")
        for info in made:
            self.extras_made += 1
            self._upload(info["id"], f"{info['workdir']}/extra.bin")
            result = self._execute(info["id"], "echo extra")
            if result is not None:
                self._check("execute in an extra", result["output"] == "extra\n", str(result))
            self._ok("delete sandbox", self._call("delete sandbox", "DELETE", f"/v1/sandboxes/{info['id']}"), 204)

    # ------------------------------------------------------------------ the run

    def setup(self) -> None:
        info = self._ok("create", self._call("create", "POST", "/v1/sandboxes", json={"labels": {"role": "home"}}), 201)
        if info is not None:
            self.home = info["id"]
            self.directory = f"{info['workdir']}/client{self.index}"

    def run(self, seconds: float) -> None:
        self.load_started = time.monotonic()
        deadline = self.load_started + seconds
        next_churn = self.load_started
        before = sum(len(v) for v in self.latencies.values())
        while time.monotonic() < deadline and self.iterations < MAX_ITERATIONS and not self.stalled:
            n = self.iterations
            if time.monotonic() >= next_churn:
                self._churn()
                next_churn = time.monotonic() + self.rng.uniform(*CHURN_SECONDS)
            slot = n % SLOTS
            for name, make in ((f"bin{slot}.dat", self._upload), (f"text{slot}.txt", self._write)):
                data = make(self.home, f"{self.directory}/{name}")
                if data is not None:
                    self.expected[f"{self.directory}/{name}"] = data
            if all(f"{self.directory}/{name}" in self.expected for name in (f"bin{slot}.dat", f"text{slot}.txt")):
                self._hashes_inside([f"bin{slot}.dat", f"text{slot}.txt"])
            self._stdin_and_env()
            if n % 5 == 0:
                self._archive(n)
            if n % 7 == 3:
                self._stream()
            self.iterations += 1
        self.load_ended = time.monotonic()
        self.load_requests = sum(len(v) for v in self.latencies.values()) - before

    def finish(self) -> None:
        """Everything last written is still there, intact; then the home sandbox goes."""
        if self.expected:
            self._download(self.home, self.expected)
        self.stalled = False  # the cleanup is tried whatever happened
        self._ok("delete sandbox", self._call("delete sandbox", "DELETE", f"/v1/sandboxes/{self.home}"), 204)
        self.http.close()


def _work(client: _Client, barrier: threading.Barrier) -> None:
    try:
        client.setup()
    finally:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            client.errors.append("setup: another client's sandbox was not created in time")
    if client.home and not client.errors:
        client.run(LOAD_SECONDS)
    if client.home:
        client.finish()


# ---------------------------------------------------------------------- the service


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=5).ping()
    except Exception:
        return False
    return True


@dataclass
class _Target:
    service: ServiceProcess
    backend: str
    docker_client: Any
    owner: str


@pytest.fixture(scope="module")
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Target]:
    chosen = os.environ.get("SANDBOXES_LOAD_BACKEND") or ("docker" if _docker_answers() else "local")
    workdir = tmp_path_factory.mktemp("load")
    owner = f"{SESSION_OWNER}-load-{uuid.uuid4().hex[:6]}"
    template: dict[str, Any] = {"default_timeout": 30}
    docker_client = None
    if chosen == "docker":
        docker_client = request.getfixturevalue("docker_client")
        image = request.getfixturevalue("runtime_image")
        template.update(backend="docker", image=image, cpus=0.5, memory="256m", labels=CLEANUP)
    # Each client runs one command at a time, but a stream's slot is freed by a task after its
    # last event, so its client's next command may come first: twice the clients, not the
    # default of 16 at once, which 20 clients reach whenever 17 of them are in a command (seen
    # once the file operations got faster and the clients spent more of their time in commands).
    policy = {"max_sandboxes": CLIENTS + EXTRA, "max_cpus": 1000, "max_memory": "1t", "rate": 1e6, "burst": 10**6,
              "max_commands": 2 * CLIENTS}  # fmt: skip
    config = subprocess_config(workdir / "data", owner=owner, templates={"default": template}, tenants={TENANT: policy})
    service = ServiceProcess(config, workdir).start(timeout=60)
    try:
        yield _Target(service, chosen, docker_client, owner)
    finally:
        with contextlib.suppress(httpx.HTTPError), service.client(TENANT) as http:  # a failed run's leftovers
            for sandbox in http.get("/v1/sandboxes").json().get("sandboxes", []):
                http.delete(f"/v1/sandboxes/{sandbox['id']}")
        service.stop()


def _error_counts(metrics: str) -> dict[str, float]:
    counts = {}
    for match in re.finditer(r'^sandboxes_errors_total\{code="([^"]+)"\} (\S+)$', metrics, re.MULTILINE):
        counts[match.group(1)] = float(match.group(2))
    return {code: value for code, value in counts.items() if value}


def _report(clients: list[_Client], backend: str) -> str:
    latencies: dict[str, list[float]] = defaultdict(list)
    for client in clients:
        for op, samples in client.latencies.items():
            latencies[op] += samples
    requests = sum(c.load_requests for c in clients)
    started = min(c.load_started for c in clients)
    ended = max(c.load_ended for c in clients)
    seconds = max(ended - started, 1e-9)
    lines = [
        f"load: {backend} backend, {len(clients)} clients, {seconds:.1f} s: {requests} requests, "
        f"{requests / seconds:.1f} requests/s, {sum(c.iterations for c in clients)} iterations, "
        f"{sum(c.extras_made for c in clients)} extra sandboxes made and deleted, "
        f"{sum(c.refusals for c in clients)} quota refusals",
        f"  {'op':<16}{'count':>8}{'p50 ms':>10}{'p99 ms':>10}",
    ]
    for op, samples in sorted(latencies.items()):
        ordered = sorted(samples)
        p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
        lines.append(f"  {op:<16}{len(samples):>8}{statistics.median(samples):>10.1f}{p99:>10.1f}")
    return "\n".join(lines)


def test_load(target: _Target, capsys: pytest.CaptureFixture[str]) -> None:
    clients = [_Client(i, target.service.url, random.Random(f"{target.owner}-{i}")) for i in range(CLIENTS)]
    barrier = threading.Barrier(CLIENTS, timeout=SETUP_TIMEOUT)
    threads = [threading.Thread(target=_work, args=(c, barrier), name=f"load-{c.index}") for c in clients]
    for thread in threads:
        thread.start()
    bound = time.monotonic() + SETUP_TIMEOUT + LOAD_SECONDS + 2 * REQUEST_TIMEOUT + 120
    for thread in threads:
        thread.join(max(0.0, bound - time.monotonic()))
    assert not any(thread.is_alive() for thread in threads), "load clients still running past their bound"
    with capsys.disabled():
        print("\n" + _report(clients, target.backend))

    errors = [f"client {c.index}: {e}" for c in clients for e in c.errors]
    warnings = [line.get("message") for line in target.service.log_lines() if line.get("level") != "info"]
    assert errors == [], f"{len(errors)} unexpected errors, first: {errors[:5]}; service warnings: {warnings[:5]}"
    mismatches = [m for c in clients for m in c.mismatches]
    assert mismatches == [], f"{len(mismatches)} round trips came back different, first: {mismatches[:5]}"
    assert all(c.iterations > 0 for c in clients)
    refusals = sum(c.refusals for c in clients)
    assert refusals > 0  # the provocation was real...
    assert sum(c.extras_made for c in clients) > 0  # ...and the quota let some extras through

    # The service saw what the clients saw: no error but the refusals, each counted once.
    key = {"Authorization": f"Bearer {KEYS[TENANT]}"}
    metrics = httpx.get(f"{target.service.url}/metrics", headers=key, timeout=30).text
    assert _error_counts(metrics) == {"quota_exceeded": refusals}
    assert not re.search(r'^sandboxes_requests_total\{status="5xx"\} [1-9]', metrics, re.MULTILINE)
    assert [line for line in target.service.log_lines() if line.get("level") in ("error", "critical")] == []

    # Nothing leaked: no sandbox listed, no container or directory left behind.
    with target.service.client(TENANT) as http:
        assert http.get("/v1/sandboxes").json() == {"sandboxes": []}
    if target.docker_client is not None:
        selector = {"label": f"io.sandboxes.owner={target.owner}"}
        assert target.docker_client.containers.list(all=True, filters=selector) == []
        assert target.docker_client.volumes.list(filters=selector) == []
    else:
        assert list(Path(target.service.config_path.parent / "data" / "local").iterdir()) == []
