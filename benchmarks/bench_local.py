"""Latency of every LocalSandbox operation beside the same work done directly in Python.

The point is to see where the time goes: each sandbox operation is one (edit: two) ``execute``
round trips. By default a round trip goes to the exec helper in the sandbox's long-lived jail
(a ``posix_spawn`` inside it); the fallback spawns one isolated shell per round trip. So besides
the plain-Python baseline every row shows the measured round-trip count and the *isolation
floor*: that many raw ``bwrap ... sh -c true`` spawns with exactly the flags LocalSandbox uses,
i.e. what the operation would cost with one jail per round trip. The ``(one jail per command)``
rows measure that fallback itself. The target for the exec helper: ``execute`` within 2x of a
plain ``sh -c true`` spawn (its row's ratio), and every operation well under its floor.

Sandbox and direct calls alternate within one loop so machine noise hits both alike. Nothing is
cached between iterations: files that an operation consumes (delete) are recreated, untimed.

    python benchmarks/bench_local.py [--iterations N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _common import CountingCalls, machine
from _common import ok as _ok
from _common import percentile as _percentile
from _common import scripted as _scripted
from _common import timed as _timed

from sandboxes.local.sandbox import _DEFAULT_PATH, LocalSandbox

TREE_DIRS = 10
TREE_FILES_PER_DIR = 20  # 200 files in all
BLOB_BYTES = 1 << 20
BIG_BYTES = 16 << 20
"""Past the 8 MiB that once sent a download to the script: the helper sends it a step at a time."""
NEEDLE = "needle"


class CountingSandbox(CountingCalls, LocalSandbox):
    """Counts its round trips (`_common.CountingCalls`)."""


@dataclass(frozen=True, slots=True)
class Case:
    op: str
    baseline: str
    sandbox: Callable[[], object]
    direct: Callable[[], object]
    setup: Callable[[], None] | None = None
    """Run untimed before every call of either side (e.g. recreate the file delete removes)."""
    counted: CountingSandbox | None = None
    """The sandbox whose round trips this row counts, when not the main one."""


@dataclass(frozen=True, slots=True)
class Row:
    op: str
    baseline: str
    round_trips: float
    sandbox_p50_ms: float
    sandbox_p90_ms: float
    direct_p50_ms: float
    direct_p90_ms: float
    ratio: float
    floor_ms: float | None
    """``round_trips`` x the raw bwrap spawn p50: the least this operation can cost isolated."""


# --------------------------------------------------------------------------- direct baselines


def _direct_ls(directory: str) -> list[tuple[str, bool, int, float]]:
    entries = []
    for name in os.listdir(directory):
        st = os.stat(os.path.join(directory, name))
        entries.append((name, stat.S_ISDIR(st.st_mode), st.st_size, st.st_mtime))
    return sorted(entries)


def _direct_grep(root: str, needle: str) -> list[tuple[str, int, str]]:
    matches = []
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            with open(path, encoding="utf-8", errors="replace") as fh:
                matches += [(path, n, line.rstrip("\n")) for n, line in enumerate(fh, 1) if needle in line]
    return sorted(matches)


def _direct_edit(path: str, old: str, new: str) -> None:
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    if text.count(old) != 1:
        raise RuntimeError(f"direct edit: {old!r} not found exactly once in {path}")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text.replace(old, new))


def _write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _toggle(edit: Callable[[str, str], object]) -> Callable[[], object]:
    """An edit that flips a word back and forth, so every call has exactly one match to replace."""
    state = {"flipped": False}

    def run() -> object:
        old, new = ("omega", "alpha") if state["flipped"] else ("alpha", "omega")
        state["flipped"] = not state["flipped"]
        return edit(old, new)

    return run


# --------------------------------------------------------------------------- fixture


def _build_tree(root: Path) -> Path:
    tree = root / "tree"
    for d in range(TREE_DIRS):
        directory = tree / f"d{d:02}"
        directory.mkdir(parents=True)
        for f in range(TREE_FILES_PER_DIR):
            suffix = ".py" if f % 2 == 0 else ".txt"
            lines = [f"line {i} of file {d}/{f}\n" for i in range(40)]
            if f % 5 == 0:
                lines[7] = f"a {NEEDLE} in file {d}/{f}\n"
            (directory / f"f{f:02}{suffix}").write_text("".join(lines))
    return tree


def _cases(
    sandbox: CountingSandbox,
    root: Path,
    tree: Path,
    bwrap: Callable[[], object] | None,
    spawning: CountingSandbox | None,
) -> list[Case]:
    sb, direct = root / "sb", root / "direct"
    for side in (sb, direct):
        side.mkdir()
        for name in ("edit.txt", "edit-scripted.txt"):
            (side / name).write_text("".join(f"line {i}\n" for i in range(100)) + "the alpha word\n")
        (side / "read.txt").write_text("".join(f"line {i} with some text\n" for i in range(200)))
        (side / "blob.bin").write_bytes(os.urandom(BLOB_BYTES))
        (side / "big.bin").write_bytes(os.urandom(BIG_BYTES))
    sandbox.claim(sb)  # made here by the caller; started by root, the jail runs as another uid
    blob = os.urandom(BLOB_BYTES)
    text = "x" * 1000 + "\n"
    listed = str(tree / "d00")

    def recreate() -> None:
        for side in (sb, direct):
            (side / "doomed.txt").write_text("bye\n")

    cases = [
        Case("execute", "subprocess sh -c true", lambda: _ok(sandbox.execute("true")),
             lambda: subprocess.run(["sh", "-c", "true"], check=True)),
        Case("ls", "os.listdir + os.stat", lambda: _ok(sandbox.ls(listed)), lambda: _direct_ls(listed)),
        Case("ls (scripts)", "os.listdir + os.stat", _scripted(sandbox, lambda: _ok(sandbox.ls(listed))),
             lambda: _direct_ls(listed)),
        Case("read", "open().read()", lambda: _ok(sandbox.read(str(sb / "read.txt"))),
             lambda: (direct / "read.txt").read_text(encoding="utf-8")),
        Case("write", "open().write()", lambda: _ok(sandbox.write(str(sb / "written.txt"), text)),
             lambda: (direct / "written.txt").write_text(text, encoding="utf-8")),
        Case("edit", "read + str.replace + write",
             _toggle(lambda old, new: _ok(sandbox.edit(str(sb / "edit.txt"), old, new))),
             _toggle(lambda old, new: _direct_edit(str(direct / "edit.txt"), old, new))),
        Case("write (scripts)", "open().write()",
             _scripted(sandbox, lambda: _ok(sandbox.write(str(sb / "written.txt"), text))),
             lambda: (direct / "written.txt").write_text(text, encoding="utf-8")),
        Case("edit (scripts)", "read + str.replace + write",
             _scripted(sandbox, _toggle(lambda old, new: _ok(sandbox.edit(str(sb / "edit-scripted.txt"), old, new)))),
             _toggle(lambda old, new: _direct_edit(str(direct / "edit-scripted.txt"), old, new))),
        Case("delete", "os.remove", lambda: _ok(sandbox.delete(str(sb / "doomed.txt"))),
             lambda: os.remove(direct / "doomed.txt"), setup=recreate),
        Case("delete (scripts)", "os.remove", _scripted(sandbox, lambda: _ok(sandbox.delete(str(sb / "doomed.txt")))),
             lambda: os.remove(direct / "doomed.txt"), setup=recreate),
        Case("grep", "os.walk + substring", lambda: _ok(sandbox.grep(NEEDLE, str(tree))),
             lambda: _direct_grep(str(tree), NEEDLE)),
        Case("glob", "pathlib rglob", lambda: _ok(sandbox.glob("*.py", str(tree))),
             lambda: sorted(tree.rglob("*.py"))),
        Case("grep (scripts)", "os.walk + substring", _scripted(sandbox, lambda: _ok(sandbox.grep(NEEDLE, str(tree)))),
             lambda: _direct_grep(str(tree), NEEDLE)),
        Case("glob (scripts)", "pathlib rglob", _scripted(sandbox, lambda: _ok(sandbox.glob("*.py", str(tree)))),
             lambda: sorted(tree.rglob("*.py"))),
        Case("upload_files 1MiB", "open(wb).write()",
             lambda: _ok(sandbox.upload_files([(str(sb / "up.bin"), blob)])),
             lambda: _write_bytes(str(direct / "up.bin"), blob)),
        Case("download_files 1MiB", "open(rb).read()",
             lambda: _ok(sandbox.download_files([str(sb / "blob.bin")])),
             lambda: _read_bytes(str(direct / "blob.bin"))),
        Case("download_files 16MiB", "open(rb).read()",
             lambda: _ok(sandbox.download_files([str(sb / "big.bin")])),
             lambda: _read_bytes(str(direct / "big.bin"))),
    ]  # fmt: skip
    if bwrap is not None:
        cases.insert(1, Case("execute", "raw bwrap sh -c true (floor)", cases[0].sandbox, bwrap))  # fmt: skip
    if spawning is not None:
        cases += [
            Case("execute (one jail per command)", "subprocess sh -c true", lambda: _ok(spawning.execute("true")),
                 lambda: subprocess.run(["sh", "-c", "true"], check=True), counted=spawning),
            Case("write (one jail per command)", "open().write()",
                 lambda: _ok(spawning.write(str(sb / "written-spawned.txt"), text)),
                 lambda: _write_bytes(str(direct / "written-spawned.txt"), text.encode()), counted=spawning),
        ]  # fmt: skip
    return cases


def _raw_jail_spawn(sandbox: LocalSandbox) -> Callable[[], object]:
    """One ``bwrap ... sh -c true`` with exactly what execute() would start for a command in
    the root (the same flags, seccomp pipe and, started by root, the same drop to the jail uid)."""
    jail = sandbox._jail
    assert jail is not None
    environment = {"PATH": _DEFAULT_PATH, "HOME": str(sandbox.root), "LANG": "C.UTF-8"}

    def spawn() -> None:
        spec = jail.spawn(["/bin/sh", "-c", "true"], environment, str(sandbox.root))
        try:
            subprocess.run(spec.argv, env={"PATH": _DEFAULT_PATH}, stdin=subprocess.DEVNULL, pass_fds=spec.pass_fds,
                           check=True)  # fmt: skip
        finally:
            for fd in spec.close_after_spawn:
                os.close(fd)

    return spawn


# --------------------------------------------------------------------------- measuring


def _measure(
    case: Case, sandbox: CountingSandbox, iterations: int, warmup: int
) -> tuple[list[float], list[float], float]:
    sandbox_ms: list[float] = []
    direct_ms: list[float] = []
    calls_before = 0
    sandbox = case.counted or sandbox
    for i in range(warmup + iterations):
        if case.setup:
            case.setup()
        if i == warmup:
            calls_before = sandbox.calls
        elapsed_sandbox = _timed(case.sandbox)
        elapsed_direct = _timed(case.direct)
        if i >= warmup:
            sandbox_ms.append(elapsed_sandbox)
            direct_ms.append(elapsed_direct)
    return sandbox_ms, direct_ms, (sandbox.calls - calls_before) / iterations


def run(iterations: int, warmup: int = 2) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-local-") as tmp:
        root = Path(tmp).resolve()
        tree = _build_tree(root)
        sandbox = CountingSandbox(root)
        spawning = None
        try:
            bwrap = None
            if sandbox.isolated:
                bwrap = _raw_jail_spawn(sandbox)
                spawning = CountingSandbox(config=sandbox.config.model_copy(update={"use_exec_helper": False}))
            cases = _cases(sandbox, root, tree, bwrap, spawning)
            measured = [(case, *_measure(case, sandbox, iterations, warmup)) for case in cases]
            helper = sandbox.helper_alive
        finally:
            sandbox.close()
            if spawning is not None:
                spawning.close()
    floor = next((statistics.median(d) for case, _, d, _ in measured if case.baseline.startswith("raw bwrap")), None)
    rows = []
    for case, sandbox_ms, direct_ms, trips in measured:
        s50, d50 = statistics.median(sandbox_ms), statistics.median(direct_ms)
        rows.append(Row(case.op, case.baseline, trips, s50, _percentile(sandbox_ms, 0.9), d50,
                        _percentile(direct_ms, 0.9), s50 / d50 if d50 else float("inf"),
                        None if floor is None else trips * floor))  # fmt: skip
    return {
        "iterations": iterations,
        "isolated": bwrap is not None,
        "exec_helper": helper,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "tree_files": TREE_DIRS * TREE_FILES_PER_DIR,
        "rows": [asdict(r) for r in rows],
    }


def format_table(report: Mapping[str, Any]) -> str:
    header = ("op", "direct baseline", "round trips", "sandbox p50 ms", "p90", "direct p50 ms", "p90", "ratio",
              "floor ms")  # fmt: skip
    lines = [header]
    for r in report["rows"]:
        floor = "-" if r["floor_ms"] is None else f"{r['floor_ms']:.2f}"
        lines.append((r["op"], r["baseline"], f"{r['round_trips']:g}", f"{r['sandbox_p50_ms']:.2f}",
                      f"{r['sandbox_p90_ms']:.2f}", f"{r['direct_p50_ms']:.3f}", f"{r['direct_p90_ms']:.3f}",
                      f"{r['ratio']:.1f}x", floor))  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
            for line in lines]  # fmt: skip
    text.insert(1, "-" * len(text[0]))
    isolation = "bwrap" if report["isolated"] else "NONE (bwrap not installed; no floor)"
    if report["isolated"]:
        isolation += ", exec helper" if report["exec_helper"] else ", NO exec helper (fell back)"
    summary = (f"LocalSandbox, {report['iterations']} iterations per op, isolation: {isolation}, "
               f"{report['tree_files']}-file tree, Python {report['python']}")  # fmt: skip
    return "\n".join([summary, *text, "floor = round trips x raw bwrap spawn p50: the least an isolated op can cost"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=50, help="timed calls per op and side (default 50)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls first (default 2)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.warmup < 0:
        parser.error("--iterations must be >= 1 and --warmup >= 0")
    if shutil.which("bwrap") is None:
        print("warning: bwrap not installed; the sandbox runs unisolated and there is no floor", file=sys.stderr)
    host = machine()  # before the run loads the machine
    report = run(args.iterations, args.warmup)
    report["machine"] = host
    print(json.dumps(report, indent=2) if args.json else f"{host}\n{format_table(report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
