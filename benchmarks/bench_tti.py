"""Time to interactive: create a sandbox -> its first command answered, beside raw baselines.

One run measures, per backend, with every figure's baseline taken in the same run:

* sequential (``--n`` each, default 100; p50/p95/p99 in ms), one create + ``execute("true")``
  after another, the sandbox destroyed (untimed) before the next:
  - through the SERVICE (``python -m sandboxes.server`` started here on 127.0.0.1, called
    through ``sandboxes.client.SandboxClient``): Docker and Local templates, cold; and for
    Docker a template with ``pool_size = 2`` (`sandboxes.server.pool`), each create claiming a
    pooled sandbox once the pool has refilled, untimed (warm);
  - through the LIBRARY: ``DockerSandbox.create`` (cold) and ``DockerProvider(pool_size=2)
    .acquire()`` once the pool has refilled, untimed (warm); ``LocalSandbox``; ``SSHSandbox``
    on one ``sandboxes/ssh-vm`` container (as ``bench_ssh``); ``KubernetesSandbox`` on the
    cluster ``$KUBECONFIG`` names (skipped, with the reason printed, without one);
  - RAW: ``containers.run(image, sleep infinity, network none)`` + ``exec_run("true")`` through
    the Docker SDK (cold; what our create is held to), the same with the ``docker`` CLI
    (``docker run -d`` + ``docker exec``: a reference, it adds two CLI process starts), and
    ``exec_run("true")`` / ``docker exec`` on a running container (warm); for Local a bare
    ``bwrap`` running ``true``; for SSH ``exec_command("true")`` on a fresh channel of the
    sandbox's transport.
* crowds through the service (Docker): ``--burst`` creates at once (threads released by one
  barrier, each with its own client, no client retries: what a client is told is counted as
  told) and the same number staggered one every ``--stagger`` ms: success %, p50/p99 of the
  successes, and every failure by HTTP status; then, with ``--burst`` sandboxes alive and the
  tenant's ``max_sandboxes`` at ``--burst``, ``--extra`` more at once: what a client gets past
  capacity (429s, with or without ``Retry-After``). Beside them the raw cold burst (SDK run +
  exec at once) and, through the library, a burst of acquires from a warm pool of ``--burst``.
  Then, on a service of its own, ``--pool-burst`` creates at once (default 100; 0: none) from
  a warm pool of as many, each with its first command, and cold creates one after another
  while that pool refills (what the refill leaves to creates), with the time it took.
* CLI start: ``python -m sandboxes.cli exec true`` against the service, beside ``python -c
  pass`` (the interpreter alone) and the same command through the client in-process.

Targets (issue #36; reported, never asserted): warm TTI p50 <= 10 ms and p99 <= 50 ms; burst
of 100 from a warm pool of 100: 100% success, p99 <= 500 ms; cold TTI <= 1.1x raw run + exec;
a cold burst of 100: 100% success, p99 <= 1.2x the raw burst. Every container made carries an
owner label unique to the run and is swept by that label at the end, whatever happens.

    python benchmarks/bench_tti.py [--n N] [--burst B] [--backends docker,local,ssh,kubernetes]
        [--pool-burst N] [--no-crowds] [--json] [--save report.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _common import machine, percentile, save_report
from _tti_table import format_table
from bench_service import TENANT, _Service, _sweep

from sandboxes.client import SandboxClient, SandboxServiceError

IMAGE = "sandboxes/runtime:latest"
WARM_P50_MS, WARM_P99_MS = 10.0, 50.0
POOL_BURST_P99_MS = 500.0
COLD_RATIO, COLD_BURST_RATIO = 1.1, 1.2
POOLED, POOL_SIZE = "pooled", 2
"""The service's pooled Docker template, and its ``pool_size``."""


@dataclass
class Row:
    section: str
    op: str
    n: int
    p50: float | None
    p95: float | None
    p99: float | None
    ok: int | None = None
    """Crowds: how many succeeded (of ``n``)."""
    failures: dict[str, int] = field(default_factory=dict)
    """Crowds: failures by HTTP status (or exception class)."""
    target: str = ""
    met: bool | None = None
    note: str = ""


def _row(section: str, op: str, samples: list[float], note: str = "", n: int | None = None) -> Row:
    if not samples:
        return Row(section, op, n or 0, None, None, None, ok=0, note=note)
    return Row(section, op, n or len(samples), statistics.median(samples), percentile(samples, 0.95),
               percentile(samples, 0.99), note=note)  # fmt: skip


def _checked(response: Any) -> None:
    if getattr(response, "exit_code", None) != 0 or getattr(response, "error", None) is not None:
        raise RuntimeError(f"first command failed: {response}")


One = Callable[[], Callable[[], None] | None]
"""A timed step that returns its untimed cleanup (or None)."""


def _sequential(n: int, one: One, warmup: int = 2) -> list[float]:
    """``one()`` timed ``n`` times, after ``warmup`` untimed runs."""
    return _interleaved(n, {"": one}, warmup)[""]


def _interleaved(n: int, sides: dict[str, One], warmup: int = 2) -> dict[str, list[float]]:
    """Each side timed ``n`` times in one loop, the order rotating each round, so that drift in
    the machine's load hits every side alike; ``warmup`` untimed rounds first."""
    samples: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for i in range(warmup + n):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            started = time.perf_counter()
            cleanup = sides[name]()
            elapsed = (time.perf_counter() - started) * 1000
            if i >= warmup:
                samples[name].append(elapsed)
            if cleanup is not None:
                cleanup()
    return samples


def raw_docker(client: Any, owner: str) -> One:
    """``containers.run(sleep infinity, network none)`` + ``exec_run("true")``: the raw cold TTI."""
    from sandboxes.docker import LABEL_OWNER

    def raw() -> Callable[[], None]:
        container = client.containers.run(IMAGE, ["sleep", "infinity"], detach=True, network_mode="none",
                                          labels={LABEL_OWNER: owner})  # fmt: skip
        _checked_raw(container.exec_run("true"))
        return lambda: container.remove(force=True, v=True)

    return raw


# --------------------------------------------------------------------------- crowds


@dataclass
class Crowd:
    latencies: list[float] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)
    retry_after: int = 0
    """Refusals that carried a ``Retry-After``."""
    held: list[Any] = field(default_factory=list)
    """What the successes made (to clean up)."""


def _crowd(count: int, interval_s: float, attempt: Callable[[], Any]) -> Crowd:
    """``count`` threads each calling ``attempt`` (timed): all released at once by a barrier
    (``interval_s`` 0), or one every ``interval_s``."""
    crowd = Crowd()
    lock = threading.Lock()
    barrier = threading.Barrier(count + 1)
    start_at: list[float] = []

    def one(index: int) -> None:
        barrier.wait()
        if interval_s:
            delay = start_at[0] + index * interval_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        started = time.perf_counter()
        try:
            made = attempt()
        except SandboxServiceError as exc:
            with lock:
                crowd.failures[f"HTTP {exc.status}" if exc.status else exc.code] += 1
                crowd.retry_after += getattr(exc, "retry_after", None) is not None
            return
        except Exception as exc:
            with lock:
                crowd.failures[type(exc).__name__] += 1
            return
        elapsed = (time.perf_counter() - started) * 1000
        with lock:
            crowd.latencies.append(elapsed)
            crowd.held.append(made)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    start_at.append(time.monotonic())
    barrier.wait()
    for thread in threads:
        thread.join()
    return crowd


def _crowd_row(op: str, count: int, crowd: Crowd, note: str = "") -> Row:
    row = _row("crowd", op, crowd.latencies, note, n=count)
    row.ok = len(crowd.latencies)
    row.failures = dict(crowd.failures)
    if crowd.retry_after:
        row.failures["of which with Retry-After"] = crowd.retry_after
    return row


def _in_parallel(calls: list[Callable[[], object]], workers: int = 8) -> None:
    with ThreadPoolExecutor(workers) as pool:
        for future in [pool.submit(call) for call in calls]:
            with contextlib.suppress(Exception):
                future.result()


# --------------------------------------------------------------------------- through the service


def _service_rows(service: _Service, backend: str, n: int, raw: One | None) -> list[Row]:
    """Cold creates through the service; for Docker beside the raw SDK run + exec in one loop."""
    with SandboxClient(service.url, service.key, retries=0) as client:

        def one() -> Callable[[], None]:
            sandbox = client.create()
            _checked(sandbox.execute("true"))
            return lambda: client.delete(sandbox.id)

        samples = _interleaved(n, {"service": one} | ({"raw": raw} if raw else {}))
    row = _row("sequential", f"service {backend}: create + execute (cold)", samples["service"],
               "SandboxClient.create + RemoteSandbox.execute; a template without pool_size")  # fmt: skip
    if not raw or row.p50 is None:
        return [row]
    raw_p50 = statistics.median(samples["raw"])
    row.target, row.met = f"<= {COLD_RATIO:g}x raw SDK", row.p50 <= COLD_RATIO * raw_p50
    row.note += f"; {row.p50 / raw_p50:.2f}x raw SDK run + exec of the same loop"
    return [row, _row("sequential", "raw docker: containers.run + exec_run (cold, SDK), beside the service",
                      samples["raw"])]  # fmt: skip


def _pool_ready(service: _Service) -> float:
    """The service's ready pooled sandboxes of the ``pooled`` template, as ``/metrics`` says."""
    headers = {"Authorization": f"Bearer {service.key}"}
    for line in httpx.get(f"{service.url}/metrics", headers=headers, timeout=30).text.splitlines():
        if line.startswith(f'sandboxes_pool_ready{{template="{POOLED}"}}'):
            return float(line.split()[-1])
    return 0.0


def _service_warm_rows(service: _Service, n: int) -> list[Row]:
    """Creates that claim a pooled sandbox through the service, the pool refilled (untimed) before each."""

    def refilled() -> None:
        deadline = time.monotonic() + 120
        while _pool_ready(service) < POOL_SIZE:
            if time.monotonic() > deadline:
                raise RuntimeError("the service's warm pool did not refill within 120 s")
            time.sleep(0.05)

    with SandboxClient(service.url, service.key, retries=0) as client:

        def one() -> Callable[[], None]:
            sandbox = client.create(POOLED)
            _checked(sandbox.execute("true"))

            def cleanup() -> None:
                client.delete(sandbox.id)
                refilled()

            return cleanup

        refilled()
        samples = _sequential(n, one)
    row = _row("sequential", "service docker: create from warm pool + execute (warm)", samples,
               f"SandboxClient.create + RemoteSandbox.execute; pool_size={POOL_SIZE}, refilled untimed")  # fmt: skip
    if row.p50 is not None and row.p99 is not None:
        row.target = f"p50 <= {WARM_P50_MS:g} ms, p99 <= {WARM_P99_MS:g} ms"
        row.met = row.p50 <= WARM_P50_MS and row.p99 <= WARM_P99_MS
    return [row]


def _service_crowds(service: _Service, docker_client: Any, owner: str, burst: int, stagger_ms: float,
                    extra: int) -> list[Row]:  # fmt: skip
    clients = [SandboxClient(service.url, service.key, retries=0) for _ in range(burst + extra)]
    rows: list[Row] = []
    try:

        def attempt_with(client: SandboxClient) -> Callable[[], Any]:
            def attempt() -> Any:
                sandbox = client.create()
                _checked(sandbox.execute("true"))
                return sandbox.id

            return attempt

        attempts = iter([attempt_with(c) for c in clients])
        staggered = _crowd(burst, stagger_ms / 1000, lambda: next(attempts)())
        _delete_all(clients[0], docker_client, owner)
        rows.append(_crowd_row(f"service docker: {burst} staggered, one per {stagger_ms:g} ms", burst, staggered))
        attempts = iter([attempt_with(c) for c in clients])
        burst_crowd = _crowd(burst, 0, lambda: next(attempts)())
        row = _crowd_row(f"service docker: burst of {burst} (cold)", burst, burst_crowd,
                         f"tenant max_sandboxes = {burst}")  # fmt: skip
        rows.append(row)
        try:
            past = _crowd(extra, 0, lambda: next(attempts)())
            rows.append(_crowd_row(f"service docker: {extra} more past capacity", extra, past,
                                   f"{len(burst_crowd.held)} alive of max_sandboxes {burst}"))  # fmt: skip
            _delete_all(clients[0], docker_client, owner)
        finally:
            _delete_all(clients[0], docker_client, owner)
    finally:
        for client in clients:
            client.close()
    return rows


def _delete_all(client: SandboxClient, docker_client: Any, owner: str) -> None:
    """The tenant's sandboxes deleted (a crowd's, and one whose create answered but whose first
    command failed), and gone from the engine (a delete refused under load is tried again; a
    container whose removal the service retries still counts against the tenant, and a service
    stopped meanwhile would leave it behind)."""
    deadline = time.monotonic() + 120
    while left := {info.id for info in client.list()} or _tenant_containers(docker_client, owner):
        if time.monotonic() > deadline:
            raise RuntimeError(f"sandboxes {sorted(left)} were not deleted in 120 s")
        _in_parallel([lambda sid=sid: client.delete(sid) for sid in left if not sid.startswith("container ")])
        time.sleep(0.05)


def _tenant_containers(docker_client: Any, owner: str) -> set[str]:
    """The bench tenant's containers the engine still has (a removal the service retries)."""
    selector = [f"io.sandboxes.owner={owner}", f"io.sandboxes.tenant={TENANT}"]
    return {f"container {c.short_id}" for c in docker_client.containers.list(all=True, filters={"label": selector})}


def _wait_pool(service: _Service, size: int, timeout: float) -> float:
    """Seconds until the service's ``pooled`` template holds ``size`` ready sandboxes."""
    started = time.monotonic()
    while _pool_ready(service) < size:
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"the service's warm pool did not reach {size} within {timeout:g} s")
        time.sleep(0.05)
    return time.monotonic() - started


def _service_pool_burst(workdir: Path, owner: str, count: int) -> list[Row]:
    """``count`` creates at once from a warm pool of ``count``, each with its first command, on a
    service of its own; then cold creates while the pool refills (they must not starve)."""
    workdir.mkdir()
    (workdir / "docker").mkdir()
    fill_timeout = 60.0 + 5.0 * count
    with _service(workdir, "docker", owner, count, pool_size=count) as service:
        filled = _wait_pool(service, count, fill_timeout)
        clients = [SandboxClient(service.url, service.key, retries=0) for _ in range(count)]
        try:

            def attempt_with(client: SandboxClient) -> Callable[[], Any]:
                def attempt() -> Any:
                    sandbox = client.create(POOLED)
                    _checked(sandbox.execute("true"))
                    return sandbox.id

                return attempt

            attempts = iter([attempt_with(c) for c in clients])
            crowd = _crowd(count, 0, lambda: next(attempts)())
            _in_parallel([lambda sid=sid: clients[0].delete(sid) for sid in crowd.held])
            during: list[float] = []
            refilling = _pool_ready(service) < count

            def cold() -> Callable[[], None]:
                sandbox = clients[0].create()
                _checked(sandbox.execute("true"))
                return lambda: clients[0].delete(sandbox.id)

            refill_started = time.monotonic()
            while _pool_ready(service) < count and len(during) < count:  # creates served while it refills
                started = time.perf_counter()
                cleanup = cold()
                during.append((time.perf_counter() - started) * 1000)
                cleanup()
            refilled = time.monotonic() - refill_started + _wait_pool(service, count, fill_timeout)
        finally:
            for client in clients:
                client.close()
    burst = _crowd_row(f"service docker: burst of {count} creates from a warm pool of {count} + first command",
                       count, crowd, f"pool_size={count}, filled in {filled:.1f} s before the burst")  # fmt: skip
    if burst.p99 is not None:
        burst.target = f"100% ok, p99 <= {POOL_BURST_P99_MS:g} ms"
        burst.met = burst.ok == count and burst.p99 <= POOL_BURST_P99_MS
    refill = _row("crowd", f"service docker: create + execute (cold) while the pool of {count} refills", during,
                  f"the pool back to {count} in {refilled:.1f} s after the burst"
                  + ("" if refilling else "; it had refilled before the first"))  # fmt: skip
    return [burst, refill]


def _cli_rows(service: _Service, n: int) -> list[Row]:
    """``sandboxes exec true`` as a fresh process, beside the bare interpreter and in-process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXES_")}
    env.update(SANDBOXES_API_KEY=service.key, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    with SandboxClient(service.url, service.key) as client:
        sandbox = client.create()
        try:
            argv = [sys.executable, "-m", "sandboxes.cli", "--url", service.url, "--sandbox", sandbox.id]
            argv += ["exec", "true"]
            cpu: dict[str, list[float]] = {"cli": [], "bare": []}

            def process(name: str, command: list[str]) -> None:
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                subprocess.run(command, env=env, check=True, capture_output=True)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                used = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
                cpu[name].append(used * 1000)

            samples = _interleaved(n, {
                "cli": lambda: process("cli", argv),
                "bare": lambda: process("bare", [sys.executable, "-c", "pass"]),
                "inproc": lambda: _checked(sandbox.execute("true")),
            }, 1)  # fmt: skip
            cli, bare, inproc = samples["cli"], samples["bare"], samples["inproc"]
        finally:
            client.delete(sandbox.id)
    row = _row("cli", "sandboxes exec true (new process)", cli, "python -m sandboxes.cli --url --sandbox")
    start = row.p50 - statistics.median(bare) - statistics.median(inproc) if row.p50 is not None else None
    row.target, row.met = "start < 150 ms", start is not None and start < 150
    row.note += f"; start (p50 - interpreter - call) = {start:.0f} ms" if start is not None else ""
    cpu_start = statistics.median(cpu["cli"]) - statistics.median(cpu["bare"])
    row.note += f"; its CPU p50 {statistics.median(cpu['cli']):.0f} ms, {cpu_start:.0f} ms over the interpreter's"
    return [row, _row("cli", "python -c pass", bare, "reference: the interpreter alone"),
            _row("cli", "RemoteSandbox.execute('true')", inproc, "reference: the call, in-process")]  # fmt: skip


# --------------------------------------------------------------------------- through the library


def _docker_rows(client: Any, owner: str, n: int, burst: int, crowds: bool) -> list[Row]:
    from sandboxes.docker import LABEL_OWNER, DockerSandbox, DockerSandboxConfig
    from sandboxes.docker.provider import DockerProvider

    config = DockerSandboxConfig(image=IMAGE, owner=owner, cpus=1.0, memory="512m", default_timeout=30)

    def ours() -> Callable[[], None]:
        sandbox = DockerSandbox.create(config, client=client)
        _checked(sandbox.execute("true"))
        return sandbox.destroy

    def raw_run() -> Any:
        return client.containers.run(IMAGE, ["sleep", "infinity"], detach=True, network_mode="none",
                                     labels={LABEL_OWNER: owner})  # fmt: skip

    def raw_cli() -> Callable[[], None]:
        made = subprocess.run(["docker", "run", "-d", "--network", "none", "--label", f"{LABEL_OWNER}={owner}",
                               IMAGE, "sleep", "infinity"], check=True, capture_output=True, text=True)  # fmt: skip
        cid = made.stdout.strip()
        subprocess.run(["docker", "exec", cid, "true"], check=True)
        return lambda: subprocess.run(["docker", "rm", "-f", cid], check=True, capture_output=True) and None

    rows = []
    samples = _interleaved(n, {"ours": ours, "raw": raw_docker(client, owner), "cli": raw_cli})
    cold, base, base_cli = samples["ours"], samples["raw"], samples["cli"]
    row = _row("sequential", "library docker: DockerSandbox.create + execute (cold)", cold)
    raw_p50 = statistics.median(base)
    row.target, row.met = f"<= {COLD_RATIO:g}x raw SDK", row.p50 is not None and row.p50 <= COLD_RATIO * raw_p50
    row.note = f"{row.p50 / raw_p50:.2f}x raw SDK run + exec of the same loop" if row.p50 else ""
    rows += [row, _row("sequential", "raw docker: containers.run + exec_run (cold, SDK)", base),
             _row("sequential", "raw docker: docker run -d + docker exec (cold, CLI)", base_cli,
                  "reference: two CLI process starts included")]  # fmt: skip
    provider = DockerProvider(config, client=client, pool_size=2, sweep_interval=None, sweep_on_start=False)
    provider.start()
    try:

        def acquire() -> Callable[[], None]:
            sandbox = provider.acquire()
            _checked(sandbox.execute("true"))
            return sandbox.destroy

        warm: list[float] = []
        for _ in range(n):  # the refill wait untimed, the acquire + execute timed
            if not provider.wait_filled(timeout=120):
                raise RuntimeError("the warm pool did not refill within 120 s")
            warm += _sequential(1, acquire, warmup=0)
    finally:
        provider.close()
    row = _row("sequential", "library docker: pool acquire + execute (warm)", warm, "pool_size=2, refilled untimed")
    row.target = f"p50 <= {WARM_P50_MS:g} ms, p99 <= {WARM_P99_MS:g} ms"
    row.met = row.p50 is not None and row.p99 is not None and row.p50 <= WARM_P50_MS and row.p99 <= WARM_P99_MS
    rows.append(row)
    running = raw_run()
    try:
        rows.append(_row("sequential", "raw docker: exec_run on a running container (warm, SDK)",
                         _sequential(n, lambda: _checked_raw(running.exec_run("true")))))  # fmt: skip
        rows.append(_row("sequential", "raw docker: docker exec on a running container (warm, CLI)",
                         _sequential(n, lambda: subprocess.run(["docker", "exec", running.id, "true"], check=True)
                                     and None)))  # fmt: skip
    finally:
        running.remove(force=True, v=True)
    if crowds:
        rows += _docker_bursts(client, config, raw_run, burst)
    return rows


def _docker_bursts(client: Any, config: Any, raw_run: Callable[[], Any], burst: int) -> list[Row]:
    from sandboxes.docker.provider import DockerProvider

    def raw_one() -> Any:
        container = raw_run()
        _checked_raw(container.exec_run("true"))
        return container

    crowd = _crowd(burst, 0, raw_one)
    _in_parallel([lambda c=c: c.remove(force=True, v=True) for c in crowd.held])
    rows = [_crowd_row(f"raw docker: burst of {burst} run + exec (cold, SDK)", burst, crowd)]
    provider = DockerProvider(config, client=client, pool_size=burst, sweep_interval=None, sweep_on_start=False,
                              refill_interval=3600)  # fmt: skip
    provider.start()
    try:
        if not provider.wait_filled(timeout=900):
            raise RuntimeError(f"the warm pool did not fill to {burst} within 900 s")

        def acquire() -> Any:
            sandbox = provider.acquire()
            _checked(sandbox.execute("true"))
            return sandbox

        crowd = _crowd(burst, 0, acquire)
    finally:
        provider.close()
    _in_parallel([sandbox.destroy for sandbox in crowd.held])
    row = _crowd_row(f"library docker: burst of {burst} acquires from a warm pool of {burst}", burst, crowd)
    row.target = f"100% ok, p99 <= {POOL_BURST_P99_MS:g} ms"
    row.met = row.ok == burst and row.p99 is not None and row.p99 <= POOL_BURST_P99_MS
    return [*rows, row]


def _checked_raw(result: Any) -> None:
    if result.exit_code != 0:
        raise RuntimeError(f"raw exec failed: {result}")


def _local_rows(n: int, workdir: Path) -> list[Row]:
    from sandboxes.local import LocalSandbox

    counter = iter(range(10**9))

    def ours() -> Callable[[], None]:
        root = workdir / f"local-{next(counter)}"
        sandbox = LocalSandbox(root)
        _checked(sandbox.execute("true"))

        def cleanup() -> None:
            sandbox.close()
            shutil.rmtree(root, ignore_errors=True)

        return cleanup

    rows = [_row("sequential", "library local: LocalSandbox + execute", _sequential(n, ours))]
    if shutil.which("bwrap"):
        # The system's directories, not "/" recursively: a container's overlay mount that comes or
        # goes while "/" is bound makes bwrap fail.
        system = [arg for d in ("/usr", "/bin", "/lib", "/lib64", "/sbin") for arg in ("--ro-bind-try", d, d)]
        argv = ["bwrap", *system, "--dev", "/dev", "--proc", "/proc", "--unshare-all", "true"]
        rows.append(_row("sequential", "raw local: bwrap --unshare-all true", _sequential(
            n, lambda: subprocess.run(argv, check=True) and None)))  # fmt: skip
    return rows


def _ssh_rows(n: int, owner: str, workdir: Path) -> list[Row]:
    from bench_ssh import _ssh_vm

    from sandboxes.ssh import SSHSandbox, SSHSandboxConfig
    from sandboxes.ssh._connection import connections

    with _ssh_vm({"io.sandboxes.owner": owner}, workdir) as host:

        def ours() -> Callable[[], None]:
            sandbox = SSHSandbox.create(SSHSandboxConfig(host=host))
            _checked(sandbox.execute("true"))
            return sandbox.destroy

        samples = _sequential(n, ours)
        connection = connections.acquire(host)
        try:
            transport = connection.transport()

            def raw() -> None:
                channel = transport.open_session()
                try:
                    channel.exec_command("true")
                    if channel.recv_exit_status() != 0:
                        raise RuntimeError("raw exec_command failed")
                finally:
                    channel.close()

            base = _sequential(n, raw)
        finally:
            connections.release(connection)
    return [_row("sequential", "library ssh: SSHSandbox.create + execute", samples,
                 "user lease + workspace + helper start, on a shared transport"),
            _row("sequential", "raw ssh: exec_command('true') on a fresh channel", base,
                 "reference: the same transport, no sandbox")]  # fmt: skip


def _kubernetes_rows(n: int, owner: str) -> list[Row]:
    from sandboxes.kubernetes import KubernetesSandbox, KubernetesSandboxConfig

    config = KubernetesSandboxConfig(namespace=os.environ.get("SANDBOXES_BENCH_NAMESPACE", "sandboxes"), image=IMAGE,
                                     owner=owner)  # fmt: skip

    def ours() -> Callable[[], None]:
        sandbox = KubernetesSandbox.create(config)
        _checked(sandbox.execute("true"))
        return sandbox.destroy

    return [_row("sequential", "library kubernetes: KubernetesSandbox.create + execute", _sequential(n, ours),
                 f"cluster of {os.environ['KUBECONFIG']}")]  # fmt: skip


# --------------------------------------------------------------------------- running


@contextlib.contextmanager
def _service(workdir: Path, backend: str, owner: str, capacity: int, pool_size: int = POOL_SIZE) -> Iterator[_Service]:
    limits = {"max_sandboxes": capacity, "max_cpus": 4 * capacity, "max_memory": f"{capacity}g"}
    pooled = {"backend": "docker", "default_timeout": 30, "image": IMAGE, "cpus": 1.0, "memory": "512m",
              "pool_size": pool_size}  # fmt: skip
    templates = {POOLED: pooled} if backend == "docker" else None
    service = _Service(workdir / backend, backend, IMAGE, owner, capacity, False, limits=limits, templates=templates)
    try:
        yield service
        if backend == "docker":  # what the service still destroys finishes before it stops
            import docker

            with SandboxClient(service.url, service.key) as client:
                _delete_all(client, docker.from_env(), owner)
    finally:
        service.stop()


def run(n: int, burst: int, stagger_ms: float, extra: int, backends: list[str], crowds: bool,
        cli_n: int, library: bool = True, pool_burst: int = 100, cli_only: bool = False) -> dict[str, Any]:  # fmt: skip
    import docker

    owner = f"bench-tti-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    rows: list[Row] = []
    skipped: dict[str, str] = {}
    client = docker.from_env() if "docker" in backends or "ssh" in backends else None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-tti-") as tmp:
            workdir = Path(tmp)
            for backend in [b for b in backends if b in ("docker", "local")]:
                (workdir / backend).mkdir()
                if cli_only:
                    if backend == "docker":
                        with _service(workdir, backend, owner, burst) as service:
                            rows += _cli_rows(service, cli_n)
                    continue
                with _service(workdir, backend, owner, burst) as service:
                    raw = raw_docker(client, owner) if backend == "docker" else None
                    rows += _service_rows(service, backend, n, raw)
                    if backend == "docker":
                        rows += _service_warm_rows(service, n)
                    if backend == "docker":
                        rows += _cli_rows(service, cli_n)
                        if crowds:
                            rows += _service_crowds(service, client, owner, burst, stagger_ms, extra)
                if backend == "docker" and crowds and pool_burst:
                    rows += _service_pool_burst(workdir / "pool-burst", owner, pool_burst)
            if not library or cli_only:
                backends = []
            if "docker" in backends:
                rows += _docker_rows(client, owner, n, burst, crowds)
            if "local" in backends:
                rows += _local_rows(n, workdir)
            if "ssh" in backends:
                rows += _ssh_rows(n, owner, workdir)
            if "kubernetes" in backends:
                if os.environ.get("KUBECONFIG"):
                    rows += _kubernetes_rows(n, owner)
                else:
                    skipped["kubernetes"] = "KUBECONFIG is not set: no cluster to measure"
    finally:
        leftovers = _sweep(owner) if client is not None else 0
    by_op = {r.op: r for r in rows}
    _cold_targets(by_op, burst)
    return {"n": n, "burst": burst, "stagger_ms": stagger_ms, "extra": extra, "image": IMAGE, "owner": owner,
            "skipped": skipped, "leftovers_swept": leftovers, "seconds": round(time.monotonic() - started, 1),
            "rows": [asdict(r) for r in rows]}  # fmt: skip


def _cold_targets(by_op: dict[str, Row], burst: int) -> None:
    """The service's cold burst held to the raw burst of the same run (its sequential cold row
    is held to the raw side of its own loop, in `_service_rows`)."""
    raw_burst = by_op.get(f"raw docker: burst of {burst} run + exec (cold, SDK)")
    burst_row = by_op.get(f"service docker: burst of {burst} (cold)")
    if raw_burst and burst_row and raw_burst.p99 and burst_row.p99:
        burst_row.target = f"100% ok, p99 <= {COLD_BURST_RATIO:g}x raw burst"
        burst_row.met = burst_row.ok == burst and burst_row.p99 <= COLD_BURST_RATIO * raw_burst.p99
        burst_row.note += f"; p99 {burst_row.p99 / raw_burst.p99:.2f}x raw burst's"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=100, help="sequential creates per row (default 100)")
    parser.add_argument("--burst", type=int, default=100, help="creates at once; also the tenant's cap (default 100)")
    parser.add_argument("--stagger", type=float, default=200.0, help="ms between staggered creates (default 200)")
    parser.add_argument("--extra", type=int, default=10, help="creates past capacity (default 10)")
    parser.add_argument(
        "--pool-burst",
        type=int,
        default=100,
        help="creates at once from a warm pool of as many, through the service (default 100; 0: none)",
    )
    parser.add_argument("--cli-n", type=int, default=20, help="CLI process starts timed (default 20)")
    parser.add_argument("--backends", default="docker,local,ssh,kubernetes")
    parser.add_argument("--no-crowds", action="store_true", help="skip the staggered and burst rows")
    parser.add_argument("--service-only", action="store_true", help="only the rows through the service (and CLI)")
    parser.add_argument("--cli-only", action="store_true", help="only the CLI start rows (beside python -c pass)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--save", metavar="PATH", help="also write the JSON report to PATH")
    args = parser.parse_args(argv)
    if min(args.n, args.burst, args.extra, args.cli_n) < 1 or args.stagger < 0 or args.pool_burst < 0:
        parser.error("--n, --burst, --extra, --cli-n must be >= 1, --stagger and --pool-burst >= 0")
    host = machine()  # before the run loads the machine
    print(host, flush=True)
    report = run(args.n, args.burst, args.stagger, args.extra, args.backends.split(","), not args.no_crowds,
                 args.cli_n, not args.service_only, args.pool_burst, args.cli_only)  # fmt: skip
    report["machine"] = host
    save_report(report, args.save)
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
