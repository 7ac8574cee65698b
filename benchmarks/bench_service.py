"""The sandbox service (real HTTP on 127.0.0.1) beside the same backend called directly.

One run measures, for the backend chosen (Docker when an engine answers, else local):

* latency, one client, calls in sequence: ``execute("true")`` and a 200-line file ``read``
  on a `RemoteSandbox` (``sandboxes.client``: what a program using the service calls, so its
  client-side cost counts) beside ``sandbox.execute`` / ``sandbox.read`` on a sandbox made here
  with the same template values. These two rows carry the target. Reference rows split the
  overhead: ``GET /healthz`` (the HTTP stack alone: httpx + uvicorn), ``GET /v1/sandboxes/{id}``
  (plus auth, rate limit, routing, lookup; no backend call), and the same execute and read as
  bare ``httpx`` posts (the service without the client library's cost).
* throughput: ``execute("true")`` from C concurrent clients for ``--duration`` seconds per
  side, beside C threads calling the sandbox directly. The target row's clients are threads of
  the lean load generator (`_http_load`: one keep-alive socket each, a request prepared once,
  answers parsed by httptools), since it shares this machine's cores with the service it
  measures; a reference row runs the same load from ``httpx.Client`` threads, whose own CPU the
  service then loses. Windows alternate lean, direct, httpx, httpx, direct, lean (half the time
  each) so drift in machine load hits every side alike. Each window records the CPU it cost per
  request: the service process's, this process's (the load generator, or the direct backend's
  client code), the sandbox side's (the commands; for Docker also dockerd, containerd and this
  run's containers with their exec helpers), and the share of the machine's busy CPU that none
  of these used: another test suite on a shared machine shows up there and explains a low rate.

The service runs as a SUBPROCESS (``python -m sandboxes.server`` with a config file), not in a
thread of this process: deployed, it has a process, an interpreter lock and an event loop of its
own, while an in-process server would share this process's lock with the C client threads and
measure their contention rather than the service. All clients of a side share ``--sandboxes``
sandboxes (default 1), so both sides have the same per-sandbox serialisation.

Targets (reported, never asserted): overhead (service p50 - direct p50) <= 1.2x the
``/healthz`` p50 of the same run for execute through the client (issue #36: the service adds
little beyond its HTTP stack), <= 3 ms for read; >= 300 execute/s through the service with 20 clients, and >= 0.8x the
direct rate (issue #14). The report names
the HTTP stack the service says it runs on (its "serving with" log line). ``--profile`` runs the service
under cProfile (its event-loop thread, during the throughput windows only, which it slows) and
prints where that thread's time goes, by function and by package.

    python benchmarks/bench_service.py [--iterations N] [--duration S] [--clients C]
        [--backend docker|local] [--json] [--save report.json] [--profile]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import _service_measures as measures
import httpx
from _common import machine, save_report
from _common import percentile as _percentile
from _http_load import KeepAliveClient
from _service_table import format_table

from sandboxes import protocol as p
from sandboxes.base import BaseSandbox
from sandboxes.client import RemoteSandbox, SandboxClient

IMAGE = "sandboxes/runtime:latest"
READ_LINES = 200
OVERHEAD_TARGET_MS = 3.0
HEALTHZ_FACTOR = 1.2
"""Issue #36: execute through the client costs at most the direct p50 plus this many /healthz p50s."""
RATE_TARGET = 300.0
RATIO_TARGET = 0.8
"""Issue #14: with 20 clients the service keeps at least this share of direct throughput."""
TENANT = "bench"


@dataclass(frozen=True, slots=True)
class Row:
    section: str
    """``latency`` (one client, ms) or ``throughput`` (C clients, requests/s)."""
    op: str
    service_p50: float
    service_p99: float
    direct_p50: float | None
    direct_p99: float | None
    overhead_ms: float | None
    """Latency rows: service p50 - direct p50 (a reference row: its own p50)."""
    ratio: float | None
    """Latency: service p50 / direct p50 (the slowdown). Throughput: service rate / direct rate."""
    service_rate: float | None = None
    direct_rate: float | None = None
    requests: int | None = None
    server_cpu_ms: float | None = None
    """Service process CPU per request (all its threads; not the commands it ran)."""
    client_cpu_ms: float | None = None
    """This process's CPU per request in the service windows: the load generator."""
    backend_cpu_ms: float | None = None
    """CPU per request of the sandboxes' side in the service windows: the commands and, for
    Docker, dockerd, containerd and everything under their shims (the exec helper)."""
    direct_cpu_ms: float | None = None
    """This process's CPU per request in the direct windows (the backend's client code)."""
    direct_backend_cpu_ms: float | None = None
    unrelated_cpu_share: float | None = None
    """Of the machine's busy CPU over all windows, the share that none of the above used: other
    programs on the machine, competing with both sides (0..1)."""
    target: str = ""
    met: bool | None = None
    note: str = ""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------- the two sides


class _Service:
    """``python -m sandboxes.server`` on a free loopback port, configured by a JSON file."""

    def __init__(self, workdir: Path, backend: str, image: str, owner: str, sandboxes: int, profile: bool,
                 limits: Mapping[str, Any] | None = None, templates: Mapping[str, Any] | None = None,
                 env: Mapping[str, str] | None = None) -> None:  # fmt: skip
        self.key = "sbx_" + secrets.token_urlsafe(24)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "service.log"
        self.profile_path = workdir / "service.prof" if profile else None
        template: dict[str, Any] = {"backend": backend, "default_timeout": 30}
        if backend == "docker":
            template.update(image=image, cpus=1.0, memory="512m")
        config = {
            "port": self.port,
            "data_dir": str(workdir / "data"),
            "owner": owner,
            "api_keys": {hashlib.sha256(self.key.encode()).hexdigest(): TENANT},
            "tenants": {
                TENANT: {
                    "max_sandboxes": sandboxes + 2,
                    "max_cpus": 64,
                    "max_memory": "64g",
                    "rate": 1e9,
                    "burst": 10**9,
                    "max_commands": 10_000,  # the load is the point here, not the per-tenant cap (16)
                    **(limits or {}),
                }
            },
            "templates": {"default": template, **(templates or {})},
            "log_level": "INFO",  # as deployed: one JSON access line per request is part of the cost
        }
        config_path = workdir / "service.json"
        config_path.write_text(json.dumps(config))
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("SANDBOXES_")}, **(env or {})}
        if self.profile_path is None:
            argv = [sys.executable, "-m", "sandboxes.server", "--config", str(config_path)]
        else:
            argv = [
                sys.executable,
                "-c",
                measures.PROFILED_SERVER,
                str(self.profile_path),
                "--config",
                str(config_path),
            ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=log, env=env)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the service exited {self.process.returncode}: {self._log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"the service was not ready within {timeout:g}s: {self._log_tail()}")

    def _log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=60)

    def profile_signal(self, sig: signal.Signals) -> None:
        if self.profile_path is None:
            return
        before = self.profile_path.stat().st_mtime_ns if self.profile_path.exists() else 0
        self.process.send_signal(sig)
        if sig == signal.SIGUSR1:  # wait for the dump, so the stats read later are complete
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if self.profile_path.exists() and self.profile_path.stat().st_mtime_ns != before:
                    time.sleep(0.2)
                    return
                time.sleep(0.05)
        else:
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop the service; what it logged at WARNING and above goes to stderr, prefixed
        ``service log:``, so a bench that finds something left behind says what the service saw."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                print("service log: not stopped 60 s after SIGTERM; killed", file=sys.stderr)
                self.process.kill()
                self.process.wait(10)
        for line in self.log_path.read_text(errors="replace").splitlines():
            if (said := _worth_saying(line)) is not None:
                print(f"service log: {said}", file=sys.stderr)


def _worth_saying(line: str) -> str | None:
    """A line of the service's log at WARNING or above, or not of its JSON: its level, message
    and the end of its traceback; ``None`` for the others."""
    try:
        entry = json.loads(line)
    except ValueError:
        return line[:500]
    if not isinstance(entry, dict) or entry.get("level") not in ("warning", "error", "critical"):
        return None
    said = f"{entry['level']} {entry.get('logger')}: {entry.get('message')}"
    if exception := entry.get("exception"):
        said += " | " + " / ".join(str(exception).strip().splitlines()[-3:])
    return said


def _checked(response: httpx.Response) -> Any:
    if response.status_code >= 300:
        raise RuntimeError(
            f"{response.request.method} {response.request.url.path}: {response.status_code} {response.text}"
        )
    return response.json() if response.content else None


def _ok_execute(result: Mapping[str, Any] | p.ExecuteResponse) -> None:
    code = result.get("exit_code") if isinstance(result, Mapping) else result.exit_code
    error = result.get("error") if isinstance(result, Mapping) else result.error
    if code != 0 or error is not None:
        raise RuntimeError(f"benchmark command failed: {result}")


def _direct_sandbox(backend: str, image: str, owner: str, workdir: Path, index: int) -> BaseSandbox:
    """A sandbox like the service's template makes, for calling directly."""
    if backend == "docker":
        import docker

        from sandboxes.docker import DockerSandbox, DockerSandboxConfig

        config = DockerSandboxConfig(image=image, owner=owner, cpus=1.0, memory="512m", default_timeout=30)
        return DockerSandbox.create(config, client=docker.from_env())
    from sandboxes.local import LocalSandbox, LocalSandboxConfig

    root = workdir / f"direct-{index}"
    root.mkdir(mode=0o755)
    return LocalSandbox(config=LocalSandboxConfig(root_dir=root, isolation="bwrap", default_timeout=30))


def _destroy(sandbox: BaseSandbox) -> None:
    for name in ("destroy", "close"):  # Docker removes its container; local only drops its tmp dir
        method = getattr(sandbox, name, None)
        if method is not None:
            with contextlib.suppress(Exception):
                method()
            return


# --------------------------------------------------------------------------- latency


def _paired(
    service: Callable[[], object], direct: Callable[[], object] | None, iterations: int, warmup: int
) -> tuple[list[float], list[float]]:
    service_ms: list[float] = []
    direct_ms: list[float] = []
    for i in range(warmup + iterations):
        sides: list[tuple[Callable[[], object], list[float]]] = [(service, service_ms)]
        if direct is not None:
            sides.append((direct, direct_ms))
        for fn, samples in sides if i % 2 == 0 else sides[::-1]:
            elapsed = measures.timed(fn)
            if i >= warmup:
                samples.append(elapsed)
    return service_ms, direct_ms


def _latency_row(op: str, service_ms: list[float], direct_ms: list[float], note: str = "", target: bool = True) -> Row:
    s50 = statistics.median(service_ms)
    if not direct_ms:  # a reference row: all of it is overhead
        return Row("latency", op, s50, _percentile(service_ms, 0.99), None, None, s50, None, note=note)
    d50 = statistics.median(direct_ms)
    overhead = s50 - d50
    return Row("latency", op, s50, _percentile(service_ms, 0.99), d50, _percentile(direct_ms, 0.99), overhead,
               s50 / d50 if d50 else None, target=f"overhead <= {OVERHEAD_TARGET_MS:g} ms" if target else "",
               met=overhead <= OVERHEAD_TARGET_MS if target else None, note=note)  # fmt: skip


def _bench_latency(client: httpx.Client, remote: RemoteSandbox, direct: BaseSandbox, read_path: str,
                   direct_read_path: str, iterations: int, warmup: int) -> list[Row]:  # fmt: skip
    sid = remote.id

    def raw_execute() -> None:
        _ok_execute(_checked(client.post(f"/v1/sandboxes/{sid}/execute", json={"command": "true"})))

    def raw_read() -> None:
        result = _checked(client.post(f"/v1/sandboxes/{sid}/files/read", json={"file_path": read_path}))
        if result["error"] is not None or result["total_lines"] != READ_LINES:
            raise RuntimeError(f"service read failed: {result}")

    def checked_read(sandbox: BaseSandbox | RemoteSandbox, path: str) -> Callable[[], None]:
        def read() -> None:
            result = sandbox.read(path)
            if result.error is not None or result.total_lines != READ_LINES:
                raise RuntimeError(f"read failed: {result}")

        return read

    direct_execute = lambda: _ok_execute(direct.execute("true"))  # noqa: E731
    direct_read = checked_read(direct, direct_read_path)
    rows = []
    for op, service_fn, direct_fn, note, target in [
        ("GET /healthz", lambda: _checked(client.get("/healthz")), None, "reference: the HTTP stack alone", False),
        ("GET /v1/sandboxes/{id}", lambda: _checked(client.get(f"/v1/sandboxes/{sid}")), None,
         "reference: + auth, rate limit, routing, lookup; no backend call", False),
        ("execute('true')", lambda: _ok_execute(remote.execute("true")), direct_execute,
         "through sandboxes.client (RemoteSandbox)", True),
        (f"read ({READ_LINES} lines)", checked_read(remote, read_path), direct_read,
         "through sandboxes.client (RemoteSandbox)", True),
        ("execute('true'), bare HTTP", raw_execute, direct_execute,
         "reference: an httpx post, without the client library", False),
        (f"read ({READ_LINES} lines), bare HTTP", raw_read, direct_read,
         "reference: an httpx post, without the client library", False),
    ]:  # fmt: skip
        service_ms, direct_ms = _paired(service_fn, direct_fn, iterations, warmup)
        rows.append(_latency_row(op, service_ms, direct_ms, note, target))
    return [_against_healthz(row, rows[0].service_p50) if row.op == "execute('true')" else row for row in rows]


def _against_healthz(row: Row, healthz_p50: float) -> Row:
    """``row`` with issue #36's target: its overhead within `HEALTHZ_FACTOR` /healthz p50s."""
    budget = HEALTHZ_FACTOR * healthz_p50
    assert row.overhead_ms is not None
    return replace(
        row, target=f"overhead <= {HEALTHZ_FACTOR:g}x healthz ({budget:.2f} ms)", met=row.overhead_ms <= budget
    )


# --------------------------------------------------------------------------- throughput


def _bench_throughput(
    service: _Service, sids: list[str], directs: list[BaseSandbox], clients: int, duration: float, containers: list[int]
) -> list[Row]:
    """Two rows: the service under the lean load generator (`_http_load`: the target row) and
    under ``httpx`` clients (a reference: what the load generator's own CPU takes from the
    service on a shared machine), each beside the same direct windows. Windows alternate lean,
    direct, httpx, httpx, direct, lean (half the time each), so drift hits every side alike."""
    path = "/v1/sandboxes/{}/execute"
    lean: list[KeepAliveClient] = []
    http: list[httpx.Client] = []

    def through_lean(index: int) -> None:
        _ok_execute(lean[index].call())

    def through_httpx(index: int) -> None:
        response = http[index].post(path.format(sids[index % len(sids)]), json={"command": "true"})
        _ok_execute(_checked(response))

    def direct_call(index: int) -> None:
        _ok_execute(directs[index % len(directs)].execute("true"))

    windows: dict[str, list[measures.Window]] = {"lean": [], "httpx": [], "direct": []}
    try:
        for side in ("lean", "direct", "httpx", "httpx", "direct", "lean"):
            if side == "direct":
                windows[side].append(measures.load(clients, duration / 2, direct_call, None, containers,
                                                   service.process.pid))  # fmt: skip
                continue
            for i in range(clients):  # fresh connections per window (one closed meanwhile is never
                if side == "lean":  # reused), each kept as soon as it is open, for `finally` to close
                    lean.append(KeepAliveClient(service.url, path.format(sids[i % len(sids)]), {"command": "true"},
                                                service.key))  # fmt: skip
                else:
                    http.append(service.client())
            call = through_lean if side == "lean" else through_httpx
            service.profile_signal(signal.SIGUSR2)
            windows[side].append(measures.load(clients, duration / 2, call, service.process.pid, containers))
            service.profile_signal(signal.SIGUSR1)
            for client in lean + http:
                client.close()
            lean.clear()
            http.clear()
    finally:
        for client in lean + http:
            client.close()
    failures = [f for side in windows.values() for w in side for f in w.failures]
    if failures:
        raise RuntimeError("throughput run failed: " + "; ".join(failures[:5]))
    op = f"execute('true') x {clients} clients"
    note = f"{len(sids)} sandbox(es) per side; p50/p99 = per-request latency under this load"
    return [
        _throughput_row(op, windows["lean"], windows["direct"], target=True,
                        note=f"{note}; lean load generator (one keep-alive socket per client, httptools)"),
        _throughput_row(f"{op}, httpx", windows["httpx"], windows["direct"], target=False,
                        note="reference: the same load from httpx.Client threads, whose own CPU the service loses"),
    ]  # fmt: skip


def _throughput_row(
    op: str, served: list[measures.Window], direct: list[measures.Window], *, target: bool, note: str
) -> Row:
    def total(windows: list[measures.Window], name: str) -> float:
        return float(sum(getattr(w, name) for w in windows))

    s_req, d_req = int(total(served, "requests")), int(total(direct, "requests"))
    s_rate, d_rate = s_req / total(served, "seconds"), d_req / total(direct, "seconds")
    ratio = s_rate / d_rate if d_rate else None
    s_lat = [ms for w in served for ms in w.latencies_ms]
    d_lat = [ms for w in direct for ms in w.latencies_ms]
    every = served + direct
    busy = total(every, "machine_busy")
    unrelated = max(0.0, busy - sum(total(every, name) for name in ("server_cpu", "own_cpu", "backend_cpu")))
    met = s_rate >= RATE_TARGET and ratio is not None and ratio >= RATIO_TARGET
    return Row("throughput", op, statistics.median(s_lat), _percentile(s_lat, 0.99),
               statistics.median(d_lat), _percentile(d_lat, 0.99), None, ratio,
               service_rate=s_rate, direct_rate=d_rate, requests=s_req,
               server_cpu_ms=total(served, "server_cpu") * 1000 / max(1, s_req),
               client_cpu_ms=total(served, "own_cpu") * 1000 / max(1, s_req),
               backend_cpu_ms=total(served, "backend_cpu") * 1000 / max(1, s_req),
               direct_cpu_ms=total(direct, "own_cpu") * 1000 / max(1, d_req),
               direct_backend_cpu_ms=total(direct, "backend_cpu") * 1000 / max(1, d_req),
               unrelated_cpu_share=unrelated / busy if busy else None,
               target=f">= {RATE_TARGET:g}/s, >= {RATIO_TARGET:g}x direct" if target else "",
               met=met if target else None, note=note)  # fmt: skip


# --------------------------------------------------------------------------- running


def _docker_available() -> bool:
    try:
        import docker

        docker.from_env().ping()
    except Exception:
        return False
    return True


def _sweep(owner: str) -> int:
    """Remove every container and volume labelled with this run's owner; their count."""
    import docker

    client = docker.from_env()
    selector = f"io.sandboxes.owner={owner}"
    removed = 0
    for container in client.containers.list(all=True, sparse=True, filters={"label": selector}):  # no inspect
        listed = container.attrs.get("Labels") or {}  # a sparse listing's own; `.labels` needs an inspect
        labels = {k: v for k, v in listed.items() if k.startswith("io.sandboxes.")}
        print(f"left behind: container {container.short_id} {labels}", file=sys.stderr)
        with contextlib.suppress(Exception):
            container.remove(force=True, v=True)
            removed += 1
    for volume in client.volumes.list(filters={"label": selector}):
        with contextlib.suppress(Exception):
            volume.remove(force=True)
    return removed


@contextlib.contextmanager
def _sides(
    backend: str, image: str, owner: str, sandboxes: int, profile: bool
) -> Iterator[tuple[_Service, list[BaseSandbox]]]:
    with tempfile.TemporaryDirectory(prefix="bench-service-") as tmp:
        workdir = Path(tmp)
        service = _Service(workdir, backend, image, owner, sandboxes, profile)
        directs: list[BaseSandbox] = []
        try:
            # Made after the service is ready: its start-up reconciliation reaps unknown
            # containers with its owner label, and these carry it too (for the final sweep).
            directs = [_direct_sandbox(backend, image, owner, workdir, i) for i in range(sandboxes)]
            yield service, directs
        finally:
            for sandbox in directs:
                _destroy(sandbox)
            service.stop()


def _prepare(client: httpx.Client, sids: list[str], directs: list[BaseSandbox]) -> tuple[str, str]:
    """The file to read on both sides (same content), and every exec helper started, untimed."""
    read_path = f"{_checked(client.get(f'/v1/sandboxes/{sids[0]}'))['workdir']}/read.txt"
    direct_path = str(Path(getattr(directs[0], "root", "/workspace")) / "read.txt")
    text = "".join(f"line {i} with some text\n" for i in range(READ_LINES))
    for sid in sids:
        written = _checked(
            client.post(f"/v1/sandboxes/{sid}/files/write", json={"file_path": read_path, "content": text})
        )
        if written["error"] is not None:
            raise RuntimeError(f"could not write the file to read through the service: {written}")
    for sandbox in directs:
        if sandbox.write(direct_path, text).error is not None:
            raise RuntimeError("could not write the file to read directly")
    for sid, sandbox in zip(sids, directs, strict=True):
        _ok_execute(_checked(client.post(f"/v1/sandboxes/{sid}/execute", json={"command": "true"})))
        _ok_execute(sandbox.execute("true"))
    return read_path, direct_path


def _server_stack(service: _Service, profile: bool) -> str:
    """The HTTP parser and event loop the service says it runs on (its "serving with" line)."""
    stack = "HTTP stack not logged"
    for line in service.log_path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and "http" in entry and "loop" in entry:
                stack = f"{entry['http']}, {entry['loop']} loop"
    return f"subprocess python -m sandboxes.server (uvicorn, {stack}){' under cProfile' if profile else ''}"


def run(
    iterations: int,
    warmup: int = 5,
    duration: float = 10.0,
    clients: int = 20,
    backend: str | None = None,
    sandboxes: int = 1,
    image: str = IMAGE,
    owner: str | None = None,
    profile: bool = False,
) -> dict[str, Any]:
    backend = backend or ("docker" if _docker_available() else "local")
    if backend == "local" and shutil.which("bwrap") is None:
        raise RuntimeError("the local backend isolates with bubblewrap, which is not installed")
    owner = owner or f"bench-{base64.b32encode(uuid.uuid4().bytes[:5]).decode().lower()}"
    started = time.monotonic()
    report: dict[str, Any] = {"backend": backend, "image": image if backend == "docker" else None}
    try:
        with _sides(backend, image, owner, sandboxes, profile) as (service, directs), service.client() as client:
            sids = [_checked(client.post("/v1/sandboxes", json={}))["id"] for _ in range(sandboxes)]
            read_path, direct_path = _prepare(client, sids, directs)
            with SandboxClient(service.url, service.key) as library:
                remote = library.attach(sids[0])
                rows = _bench_latency(client, remote, directs[0], read_path, direct_path, iterations, warmup)
            containers = measures.container_pids(owner) if backend == "docker" else []
            throughput = _bench_throughput(service, sids, directs, clients, duration, containers)
            rows += throughput
            for sid in sids:
                _checked(client.delete(f"/v1/sandboxes/{sid}"))
            stack = _server_stack(service, profile)
            if service.profile_path is not None and service.profile_path.exists():
                report["profile"] = measures.profile_report(
                    service.profile_path, sum(row.requests or 0 for row in throughput)
                )
    finally:
        leftovers = _sweep(owner) if backend == "docker" else 0
    report.update(
        iterations=iterations,
        warmup=warmup,
        clients=clients,
        duration_s=duration,
        sandboxes=sandboxes,
        server=stack,
        owner=owner,
        leftovers_swept=leftovers,
        seconds=round(time.monotonic() - started, 1),
        cpus=os.cpu_count(),
        python=platform.python_version(),
        platform=platform.platform(),
        rows=[asdict(r) for r in rows],
    )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=300, help="timed calls per latency op and side (default 300)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls first (default 5)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of load per side (default 10)")
    parser.add_argument("--clients", type=int, default=20, help="concurrent clients (default 20)")
    parser.add_argument("--sandboxes", type=int, default=1, help="sandboxes per side the clients share (default 1)")
    parser.add_argument("--backend", choices=["docker", "local"], default=None,
                        help="default: docker when an engine answers, else local")  # fmt: skip
    parser.add_argument("--image", default=IMAGE, help=f"Docker sandbox image (default {IMAGE})")
    parser.add_argument("--owner", default=None, help="owner label of every container made (default: unique)")
    parser.add_argument("--profile", action="store_true", help="profile the service's event loop under load")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--save", metavar="PATH", help="also write the JSON report to PATH")
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.warmup < 0 or args.duration <= 0 or args.clients < 1 or args.sandboxes < 1:
        parser.error("--iterations, --clients, --sandboxes must be >= 1, --warmup >= 0, --duration > 0")
    host = machine()  # before the run loads the machine
    report = run(args.iterations, args.warmup, args.duration, args.clients, args.backend, args.sandboxes, args.image,
                 args.owner, args.profile)  # fmt: skip
    report["machine"] = host
    save_report(report, args.save)
    print(json.dumps(report, indent=2) if args.json else f"{host}\n{format_table(report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
