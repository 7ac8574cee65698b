"""Density: idle Docker sandboxes started through the service until a memory budget, what each
costs at rest, and whether many idle sandboxes slow a command down.

One run, against ``python -m sandboxes.server`` started here on 127.0.0.1 (Docker template):

1. creates sandboxes one after another (each answers one ``execute("true")``, so its exec
   helper is up, as after an agent's first command) until their containers' memory adds up to
   ``--budget`` or ``--count`` exist, then lets them rest ``--settle`` seconds;
2. per idle sandbox: its container's cgroup memory (``memory.current`` on cgroup v2,
   ``memory.usage_in_bytes`` on v1: everything charged to the container, the helper, init and
   page cache included) with its anonymous part, and the exec helper's own RSS and PSS
   (``/proc/<pid>/smaps_rollup``; RSS counts shared library pages every helper maps, PSS
   divides them among their users);
3. the service's memory per sandbox it tracks: its RSS after, minus before (after one
   create/delete to warm it up), divided by the count;
4. ``execute("true")`` through the client on every idle sandbox in turn (round-robin,
   ``--rounds`` times) interleaved with the same call on ONE sandbox (the single-sandbox
   baseline, in the same loop so machine drift hits both): p50/p99 of each and their ratio;
5. the raw baseline of that ratio, without any of our code: one byte sent to a ``cat`` in a
   ``docker exec`` of each container and read back (the path every command takes: the engine,
   the container's shim, a pipe, a process woken from idle), round-robin against one, as in 4.

Targets (issue #36; reported, never asserted): <= 12 MiB per idle sandbox including its helper;
the service <= 200 KiB per tracked sandbox; execute p50 across the idle sandboxes <= 1.2x the
single sandbox's. Every container made carries an owner label unique to the run and is swept
by it at the end, whatever happens.

    python benchmarks/bench_density.py [--count 200] [--budget 2g] [--rounds 2] [--json] [--save PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import machine, percentile, save_report
from bench_service import _Service, _sweep

from sandboxes.client import SandboxClient
from sandboxes.docker._io import ExecSocket
from sandboxes.server.backends import LABEL_SERVICE_ID
from sandboxes.server.settings import parse_memory

IMAGE = "sandboxes/runtime:latest"
MIB = 1 << 20
SANDBOX_TARGET_MIB = 12.0
SERVICE_TARGET_KIB = 200.0
EXECUTE_RATIO_TARGET = 1.2


def _cgroup_dir(pid: int) -> tuple[Path, bool]:
    """The memory cgroup directory of process ``pid``, and whether it is cgroup v2."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/"), False
    unified = next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))
    return Path("/sys/fs/cgroup") / unified.lstrip("/"), True


def _stat(path: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in path.read_text().splitlines())}


def container_memory(pid: int) -> dict[str, float]:
    """MiB charged to the cgroup of ``pid`` (a container's init): all of it, and its anonymous part."""
    directory, v2 = _cgroup_dir(pid)
    if v2:
        stat = _stat(directory / "memory.stat")
        return {"charged": int((directory / "memory.current").read_text()) / MIB, "anon": stat["anon"] / MIB}
    stat = _stat(directory / "memory.stat")
    return {"charged": int((directory / "memory.usage_in_bytes").read_text()) / MIB, "anon": stat["total_rss"] / MIB}


def helper_memory(init_pid: int) -> dict[str, float]:
    """MiB of RSS and PSS of the python processes in the container of ``init_pid`` (its exec helper)."""
    directory, _ = _cgroup_dir(init_pid)
    rss = pss = 0
    for pid in (directory / "cgroup.procs").read_text().split():
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip().startswith("python"):
                rollup = {line.split(":")[0]: int(line.split()[1]) for line in Path(
                    f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]}  # fmt: skip
                rss, pss = rss + rollup["Rss"], pss + rollup["Pss"]
        except OSError:
            continue
    return {"rss": rss / 1024, "pss": pss / 1024}


def process_rss(pid: int) -> int:
    """Bytes of RSS of ``pid``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _checked(response: Any) -> None:
    if response.exit_code != 0 or response.error is not None:
        raise RuntimeError(f"command failed: {response}")


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "max": max(values), "min": min(values)}


def _round_robin(targets: list[Any], rounds: int, call: Any) -> tuple[list[float], list[float]]:
    """Milliseconds of ``call(target)`` on every target in turn, each interleaved with the same
    call on the first target (alternating which goes first): (across all, on one)."""
    many: list[float] = []
    single: list[float] = []
    for _ in range(rounds):
        for i, target in enumerate(targets):
            pair = [(target, many), (targets[0], single)]
            for one, samples in pair if i % 2 == 0 else pair[::-1]:
                began = time.perf_counter()
                call(one)
                samples.append((time.perf_counter() - began) * 1000)
    return many, single


def _raw_echo(engine: Any, container_ids: list[str], rounds: int) -> tuple[list[float], list[float]]:
    """`_round_robin` of one byte through a ``cat`` in a ``docker exec`` of each container."""
    streams = []
    try:
        for container_id in container_ids:
            exec_id = engine.api.exec_create(container_id, ["cat"], stdin=True, stdout=True, stderr=True)["Id"]
            streams.append(ExecSocket(engine.api.exec_start(exec_id, socket=True)))

        def echo(stream: ExecSocket) -> None:
            stream.send(b"x")
            if stream.recv(16) != b"x":
                raise RuntimeError("cat did not echo the byte")

        for stream in streams:
            echo(stream)  # each cat is up before the timing
        return _round_robin(streams, rounds, echo)
    finally:
        for stream in streams:
            stream.close()


def run(count: int, budget: int, rounds: int, settle: float) -> dict[str, Any]:
    import docker

    engine = docker.from_env()
    owner = f"bench-density-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    limits = {"max_sandboxes": count + 1, "max_cpus": 4 * count, "max_memory": f"{count}g", "max_commands": 10_000}
    report: dict[str, Any] = {"image": IMAGE, "owner": owner, "count_asked": count, "budget_mib": budget / MIB}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-density-") as tmp:
            service = _Service(Path(tmp), "docker", IMAGE, owner, count, False, limits=limits)
            try:
                report.update(_measure(service, engine, count, budget, rounds, settle))
            finally:
                service.stop()
    finally:
        report["leftovers_swept"] = _sweep(owner)
    report["seconds"] = round(time.monotonic() - started, 1)
    return report


def _measure(service: _Service, engine: Any, count: int, budget: int, rounds: int, settle: float) -> dict[str, Any]:
    with SandboxClient(service.url, service.key, retries=2) as client:
        warm = client.create()
        _checked(warm.execute("true"))
        client.delete(warm.id)
        time.sleep(1)  # the service's state of the deleted sandbox is dropped; not a wait for an event
        rss_before = process_rss(service.process.pid)
        sandboxes, pids, containers, charged = [], [], [], 0.0
        while len(sandboxes) < count and charged * MIB < budget:
            sandbox = client.create()
            _checked(sandbox.execute("true"))
            sandboxes.append(sandbox)
            found = engine.containers.list(filters={"label": f"{LABEL_SERVICE_ID}={sandbox.id}"})
            pid = int(found[0].attrs["State"]["Pid"])
            pids.append(pid)
            containers.append(found[0].id)
            charged += container_memory(pid)["charged"]
        time.sleep(settle)  # at rest: the helpers' idle work (compiling the native ops) is done
        rss_after = process_rss(service.process.pid)
        memory = [container_memory(pid) for pid in pids]
        helpers = [helper_memory(pid) for pid in pids]
        many, single = _round_robin(sandboxes, rounds, lambda sandbox: _checked(sandbox.execute("true")))
        raw_many, raw_single = _raw_echo(engine, containers, rounds)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda s: client.delete(s.id), sandboxes))
    n = len(sandboxes)
    per_sandbox = statistics.median(m["charged"] for m in memory)
    per_tracked = (rss_after - rss_before) / n / 1024
    ratio = statistics.median(many) / statistics.median(single)
    return {
        "sandboxes": n,
        "sandbox_mib": {k: _summary([m[k] for m in memory]) for k in ("charged", "anon")},
        "helper_mib": {k: _summary([h[k] for h in helpers]) for k in ("rss", "pss")},
        "service_rss_mib": {"before": rss_before / MIB, "after": rss_after / MIB},
        "service_kib_per_sandbox": per_tracked,
        "execute_ms": {
            f"across {n} idle": {"p50": statistics.median(many), "p99": percentile(many, 0.99), "n": len(many)},
            "one sandbox": {"p50": statistics.median(single), "p99": percentile(single, 0.99), "n": len(single)},
        },
        "execute_ratio": ratio,
        "raw_echo_ms": {
            f"across {n} idle": {"p50": statistics.median(raw_many), "p99": percentile(raw_many, 0.99)},
            "one container": {"p50": statistics.median(raw_single), "p99": percentile(raw_single, 0.99)},
        },
        "raw_echo_ratio": statistics.median(raw_many) / statistics.median(raw_single),
        "targets": {
            f"<= {SANDBOX_TARGET_MIB:g} MiB per idle sandbox": per_sandbox <= SANDBOX_TARGET_MIB,
            f"service <= {SERVICE_TARGET_KIB:g} KiB per tracked sandbox": per_tracked <= SERVICE_TARGET_KIB,
            f"execute p50 across idle <= {EXECUTE_RATIO_TARGET:g}x one": ratio <= EXECUTE_RATIO_TARGET,
        },
    }


def format_table(report: dict[str, Any]) -> str:
    def trio(values: dict[str, float]) -> str:
        return f"median {values['median']:.2f}, min {values['min']:.2f}, max {values['max']:.2f}"

    out = [f"density: {report['sandboxes']} idle Docker sandboxes of {report['image']} through the service "
           f"(asked {report['count_asked']}, budget {report['budget_mib']:.0f} MiB), {report['seconds']} s",
           f"per sandbox, container cgroup, MiB: {trio(report['sandbox_mib']['charged'])}",
           f"  of which anonymous, MiB:         {trio(report['sandbox_mib']['anon'])}",
           f"exec helper RSS, MiB:              {trio(report['helper_mib']['rss'])}",
           f"exec helper PSS, MiB:              {trio(report['helper_mib']['pss'])}",
           f"service RSS {report['service_rss_mib']['before']:.1f} -> {report['service_rss_mib']['after']:.1f} MiB: "
           f"{report['service_kib_per_sandbox']:.1f} KiB per tracked sandbox"]  # fmt: skip
    for name, row in report["execute_ms"].items():
        out.append(f"execute('true') {name}: p50 {row['p50']:.2f} ms, p99 {row['p99']:.2f} ms (n={row['n']})")
    out.append(f"ratio of p50s: {report['execute_ratio']:.2f}x")
    for name, row in report["raw_echo_ms"].items():
        out.append(f"raw: 1 byte via cat in a docker exec, {name}: p50 {row['p50']:.3f} ms, p99 {row['p99']:.3f} ms")
    out.append(f"raw ratio of p50s (the engine and kernel alone): {report['raw_echo_ratio']:.2f}x")
    out += [f"target {name}: {'yes' if met else 'NO'}" for name, met in report["targets"].items()]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=200, help="idle sandboxes at most (default 200)")
    parser.add_argument("--budget", default="2g", help="stop once the containers hold this much (default 2g)")
    parser.add_argument("--rounds", type=int, default=2, help="round-robin passes of execute (default 2)")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds at rest before measuring (default 2)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--save", metavar="PATH", help="also write the JSON report to PATH")
    args = parser.parse_args(argv)
    if args.count < 1 or args.rounds < 1 or args.settle < 0:
        parser.error("--count and --rounds must be >= 1, --settle >= 0")
    host = machine()  # before the run loads the machine
    print(host, flush=True)
    report = run(args.count, parse_memory(args.budget), args.rounds, args.settle)
    report["machine"] = host
    save_report(report, args.save)
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
