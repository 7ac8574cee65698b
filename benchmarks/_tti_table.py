"""`bench_tti`'s report as the table it prints: one row per measurement, targets beside."""

from __future__ import annotations

from typing import Any

__all__ = ["format_table"]


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_table(report: dict[str, Any]) -> str:
    out = [f"time to interactive (create -> first command answered), ms; {report['image']}, n={report['n']}, "
           f"{report['seconds']} s"]  # fmt: skip
    lines = [("op", "n", "ok", "p50", "p95", "p99", "failures", "target", "met", "note")]
    for r in report["rows"]:
        failures = ", ".join(f"{k}: {v}" for k, v in r["failures"].items()) or "-"
        met = "-" if r["met"] is None else ("yes" if r["met"] else "NO")
        ok = "-" if r["ok"] is None or not r["n"] else f"{100 * r['ok'] / r['n']:.0f}%"
        lines.append((r["op"], str(r["n"]), ok, _num(r["p50"]), _num(r["p95"]), _num(r["p99"]), failures,
                      r["target"] or "-", met, r["note"]))  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]) - 1)]
    for line in lines:
        cells = zip(line, widths, strict=False)
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(cells)) + "  " + line[-1])
    out += [f"skipped {name}: {why}" for name, why in report["skipped"].items()]
    return "\n".join(out)
