"""`bench_service`'s report as the table it prints: latency, throughput, CPU per request and,
when profiled, where the service's event-loop thread spent its time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["format_table"]


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _aligned(lines: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    text = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
            for line in lines]  # fmt: skip
    return [text[0], "-" * len(text[0]), *text[1:]]


def _met(row: Mapping[str, Any]) -> str:
    return "-" if row["met"] is None else ("yes" if row["met"] else "NO")


def format_table(report: Mapping[str, Any]) -> str:
    image = f" ({report['image']})" if report["image"] else ""
    out = [
        f"sandbox service vs direct, {report['backend']} backend{image}, server: {report['server']}, "
        f"{report['cpus']} cpus, Python {report['python']}, {report['seconds']} s"
    ]
    latency = [r for r in report["rows"] if r["section"] == "latency"]
    lines: list[tuple[str, ...]] = [
        ("op", "service p50", "p99", "direct p50", "p99", "overhead", "ratio", "target", "met")
    ]
    for r in latency:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        lines.append((r["op"], _num(r["service_p50"]), _num(r["service_p99"]), _num(r["direct_p50"]),
                      _num(r["direct_p99"]), _num(r["overhead_ms"]), ratio, r["target"] or "-", _met(r)))  # fmt: skip
    out += ["", f"1. latency, one client, {report['iterations']} calls per side (ms)", *_aligned(lines)]
    out += [f"  note: {r['op']}: {r['note']}" for r in latency if r["note"]]
    throughput = [r for r in report["rows"] if r["section"] == "throughput"]
    lines = [("op", "service/s", "direct/s", "ratio", "p50 ms", "p99 ms", "direct p50", "p99", "target", "met")]
    cpu: list[tuple[str, ...]] = [
        ("op", "server", "load generator", "sandbox side", "direct: caller", "direct: sandbox side", "unrelated")
    ]
    for r in throughput:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        rates = (_num(r["service_rate"], 1), _num(r["direct_rate"], 1), ratio)
        latencies = (_num(r["service_p50"]), _num(r["service_p99"]), _num(r["direct_p50"]), _num(r["direct_p99"]))
        lines.append((r["op"], *rates, *latencies, r["target"], _met(r)))
        unrelated = "-" if r["unrelated_cpu_share"] is None else f"{r['unrelated_cpu_share'] * 100:.0f}%"
        cpu.append((r["op"], _num(r["server_cpu_ms"], 3), _num(r["client_cpu_ms"], 3), _num(r["backend_cpu_ms"], 3),
                    _num(r["direct_cpu_ms"], 3), _num(r["direct_backend_cpu_ms"], 3), unrelated))  # fmt: skip
    out += ["", f"2. throughput, {report['clients']} concurrent clients, {report['duration_s']:g} s per side",
            *_aligned(lines)]  # fmt: skip
    out += [f"  note: {r['op']}: {r['note']}" for r in throughput if r["note"]]
    out += ["", "2b. CPU per request (ms) in those windows, and the machine's busy CPU used by unrelated programs",
            *_aligned(cpu)]  # fmt: skip
    out += ["  server: the service process (not the commands it ran); sandbox side: the commands, and for Docker "
            "dockerd, containerd and the containers (exec helper); unrelated: neither side's, e.g. another test "
            "suite on a shared machine"]  # fmt: skip
    if "profile" in report:
        prof = report["profile"]
        out += ["", f"3. profile of the service's event-loop thread under load ({prof['requests']} requests, "
                f"{prof['total_s']:.2f} s, the profiler's own cost included)"]  # fmt: skip
        lines = [("package", "seconds", "ms/request")]
        lines += [
            (e["package"], f"{e['tottime_s']:.3f}", f"{e['ms_per_request']:.3f}") for e in prof["by_package"][:12]
        ]
        out += _aligned(lines)
        lines = [("function", "calls", "tottime s", "cumtime s")]
        lines += [(f["function"], str(f["calls"]), f"{f['tottime_s']:.3f}", f"{f['cumtime_s']:.3f}")
                  for f in prof["functions"]]  # fmt: skip
        out += ["", *_aligned(lines)]
    out += ["", "overhead = service p50 - direct p50; ratio = service / direct (latency: slowdown; throughput: "
            "rate kept). Targets are reported, never asserted."]  # fmt: skip
    return "\n".join(out)
