"""The measuring half of bench_service.py: load windows (C threads calling until a deadline,
each call timed) with the CPU they cost per process group, read from /proc (the service, this
process, the Docker side of this run's containers, the whole machine), and the profile of the
service's event loop, switched on by signal for the load windows only."""

from __future__ import annotations

import contextlib
import os
import pstats
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")

PROFILED_SERVER = """
import cProfile, signal, sys
from sandboxes.server.__main__ import serve
profile = cProfile.Profile()
def _start(*_): profile.enable()
def _stop(*_):
    profile.disable()
    profile.dump_stats(sys.argv[1])
signal.signal(signal.SIGUSR2, _start)
signal.signal(signal.SIGUSR1, _stop)
sys.exit(serve(sys.argv[2:]))
"""
"""The service with a profiler of its main (event-loop) thread, switched on and off by signals
so that only the load windows are measured; each stop dumps the stats so far."""


def stat(pid: int | str) -> tuple[str, int, float, float]:
    """(name, parent pid, own CPU seconds, CPU seconds of its reaped children) from /proc."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
        head, _, tail = fh.read().rpartition(")")
    fields = tail.split()
    own = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return head.partition("(")[2], int(fields[1]), own, (int(fields[13]) + int(fields[14])) / CLK_TCK


def _process_table() -> tuple[dict[int, tuple[str, int, float, float]], dict[int, list[int]]]:
    table: dict[int, tuple[str, int, float, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                table[int(entry)] = stat(entry)
    children: dict[int, list[int]] = {}
    for pid, (_name, ppid, _own, _reaped) in table.items():
        children.setdefault(ppid, []).append(pid)
    return table, children


def _tree_cpu(
    table: dict[int, tuple[str, int, float, float]], children: dict[int, list[int]], roots: Sequence[int]
) -> float:
    """Own plus reaped-children CPU seconds of every live process under ``roots`` (inclusive)."""
    seen: set[int] = set()
    todo = [pid for pid in roots if pid in table]
    while todo:
        pid = todo.pop()
        if pid not in seen and pid in table:
            seen.add(pid)
            todo += children.get(pid, [])
    return sum(table[pid][2] + table[pid][3] for pid in seen)


def docker_side_cpu(containers: Sequence[int]) -> float:
    """CPU seconds of dockerd and containerd (shared: every exec stream passes through them),
    plus, for each container of this run (given by its init pid), its shim and everything
    under it, with reaped children: the container's processes and its exec helper (started by
    ``docker exec``, so a child of the shim, not of the init). Other people's containers on the
    same engine are left out."""
    if not containers:
        return 0.0
    table, children = _process_table()
    daemons = sum(own for name, _ppid, own, _reaped in table.values() if name in ("dockerd", "containerd"))
    shims = [table[pid][1] for pid in containers if pid in table]
    return daemons + _tree_cpu(table, children, shims)


def live_children_cpu(parents: Sequence[int], exclude: Sequence[int] = ()) -> float:
    """CPU seconds of the live processes under ``parents`` (not the parents themselves): a
    LocalSandbox's long-lived jail and exec helper, which no reaped-children count sees until
    the sandbox closes. The subtrees of ``exclude`` are left out, except what is under a parent
    among them."""
    table, children = _process_table()
    skipped = set(exclude)
    roots = [child for parent in parents for child in children.get(parent, []) if child not in skipped]
    return _tree_cpu(table, children, roots)


def cpu_snapshot(
    server_pid: int | None, containers: Sequence[int], service_pid: int | None = None
) -> tuple[float, float, float, float]:
    """(service process, this process, sandbox side, whole machine busy) CPU seconds so far.

    The service (``service_pid``, ``server_pid`` in its own windows) is a child of this process
    but none of the sandbox side: its live children are, itself never. (Counting it there, as
    this did, added the service's own CPU to the sandbox side of its windows, ~0.45 ms a
    request, and its idle CPU to the direct windows'.)"""
    server, server_children = stat(server_pid)[2:] if server_pid else (0.0, 0.0)
    times = os.times()
    parents = [os.getpid(), *([server_pid] if server_pid else [])]
    service = service_pid or server_pid
    live = live_children_cpu(parents, exclude=[service] if service else [])
    backend = server_children + times.children_user + times.children_system + live + docker_side_cpu(containers)
    return server, times.user + times.system, backend, machine_busy()


def container_pids(owner: str) -> list[int]:
    """Init pids of this run's running containers (none for the local backend)."""
    import docker

    client = docker.from_env()
    found = client.containers.list(filters={"label": f"io.sandboxes.owner={owner}"})  # fresh attrs
    return [int(container.attrs["State"]["Pid"]) for container in found if container.attrs["State"].get("Pid")]


def machine_busy() -> float:
    """CPU seconds the whole machine spent not idle, since boot (all cores)."""
    with open("/proc/stat", encoding="ascii") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / CLK_TCK


def package_of(filename: str) -> str:
    """Who a profiled function belongs to: a site-packages distribution, ``sandboxes``, a
    stdlib module, or ``builtins`` (C functions, where waiting in epoll shows up)."""
    if filename == "~" or filename.startswith("<"):
        return "builtins (C calls)"
    parts = Path(filename).parts
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1]
    if "sandboxes" in parts:
        return "sandboxes." + Path(filename).stem
    return "stdlib " + Path(filename).stem


def profile_report(path: Path, requests: int, top: int = 20) -> dict[str, Any]:
    stats = pstats.Stats(str(path))
    entries: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    by_package: dict[str, float] = {}
    functions = []
    for (filename, line, name), (_cc, calls, tottime, cumtime, _callers) in entries.items():
        label = name if filename == "~" else f"{package_of(filename)}:{name}:{line}"
        functions.append({"function": label, "calls": calls, "tottime_s": tottime, "cumtime_s": cumtime})
        by_package[package_of(filename)] = by_package.get(package_of(filename), 0.0) + tottime
    functions.sort(key=lambda f: -f["tottime_s"])
    total = sum(by_package.values())
    return {
        "requests": requests,
        "total_s": total,
        "by_package": [
            {"package": k, "tottime_s": v, "ms_per_request": v * 1000 / max(1, requests)}
            for k, v in sorted(by_package.items(), key=lambda kv: -kv[1])
        ],
        "functions": functions[:top],
    }


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - started) / 1e6


@dataclass
class Window:
    """What one load window did: requests, their latencies, and the CPU spent."""

    requests: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    server_cpu: float = 0.0
    own_cpu: float = 0.0
    backend_cpu: float = 0.0
    machine_busy: float = 0.0
    failures: list[str] = field(default_factory=list)


def load(
    clients: int,
    seconds: float,
    call: Callable[[int], None],
    server_pid: int | None,
    containers: Sequence[int],
    service_pid: int | None = None,
) -> Window:
    """``clients`` threads calling ``call(client_index)`` until the time is up. ``server_pid``:
    the service whose CPU this window charges as the server's (its own windows); ``service_pid``:
    a service that runs beside a direct window, whose CPU is charged to nobody."""
    window = Window()
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)
    deadline = [0.0]

    def worker(index: int) -> None:
        samples: list[float] = []
        start.wait()
        try:
            while time.monotonic() < deadline[0]:
                samples.append(timed(lambda: call(index)))
        except Exception as exc:  # reported after the window; the benchmark then fails loudly
            with lock:
                window.failures.append(f"client {index}: {type(exc).__name__}: {exc}")
        with lock:
            window.latencies_ms += samples
            window.requests += len(samples)

    threads = [threading.Thread(target=worker, args=(i,), name=f"bench-client-{i}") for i in range(clients)]
    for thread in threads:
        thread.start()
    before = cpu_snapshot(server_pid, containers, service_pid)
    started = time.monotonic()
    deadline[0] = started + seconds
    start.wait()
    for thread in threads:
        thread.join(seconds + 120)
    window.seconds = time.monotonic() - started
    after = cpu_snapshot(server_pid, containers, service_pid)
    window.server_cpu, window.own_cpu, window.backend_cpu, window.machine_busy = (
        a - b for a, b in zip(after, before, strict=True)
    )
    if any(thread.is_alive() for thread in threads):
        window.failures.append("a client thread did not finish within 120 s of the deadline")
    return window
