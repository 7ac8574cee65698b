"""KubernetesSandbox latency beside what the same work costs with the official client alone.

Runs against the cluster ``$KUBECONFIG`` names (namespace ``--namespace``, image ``--image``,
which the cluster must be able to run), or, without one, against the test suite's fake API
server (``tests/kubernetes/fake_apiserver``: pods are local Docker containers; its figures
say what our client side costs, not what a cluster does). Rows, each beside raw baselines
measured in the same run on the same pod (`_kube_raw`):

* execute ``true``: through `KubernetesSandbox` (the exec helper on one persistent exec
  stream) beside a raw persistent exec stream (``sh`` reading commands from stdin, a marker
  after each) and beside a raw fresh exec (``stream()`` of ``sh -c true``) per command.
* file operations on a 200-file tree (ls, read, write, edit, delete, grep, glob): ours beside
  the shell command someone would otherwise run for it (``ls -la``, ``cat``, ``printf >``,
  ``sed -i``, ``rm``, ``grep -rnF``, ``find -name``), on the raw persistent stream and in a
  raw fresh exec. ls, grep and glob are first checked to find what ours finds. ``ls
  (scripts)`` and ``delete (scripts)`` time the same calls with the exec helper's native ops
  off (`_common.scripted`: the shell scripts of `BaseSandbox`, one ``execute`` each), beside
  the same baselines, so the native ops' gain is measured in the same run. Each row also
  shows our ``execute`` round trips per call and its p50 over our execute p50.
* 64 MiB ``upload_files`` / ``download_files`` beside a raw fresh exec of ``head -c N >`` fed
  on stdin and of ``cat`` read from stdout (there is no persistent-stream form of a copy).
* cold start: `KubernetesSandbox.create` + ``destroy`` beside a raw ``create_namespaced_pod``
  of a bare pod, a watch until Running, and a delete.
* warm acquisition: `KubernetesProvider.acquire` from a pool of 2.

Every ``(N.NNx)`` beside a baseline is baseline / ours (above 1x we are faster). Targets, on a
real cluster: execute p50 <= 1.5x the raw persistent stream and >= 20x faster than a fresh
exec; cold start <= 1.2x raw; warm acquisition p99 <= 100 ms (issue #12); every file
operation p50 <= 2x our execute p50, grep <= 3x, edit <= 2 round trips (issue #14). Reported,
never asserted.

    python benchmarks/bench_kubernetes.py [--iterations N] [--namespace NS] [--image IMAGE]
"""

from __future__ import annotations

import argparse
import hashlib
import shlex
import statistics
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from _common import CountingCalls, machine, ok, percentile, scripted, timed
from _kube_raw import RawShell, cluster, fresh_exec, raw_cold_start, raw_download, raw_upload

from sandboxes import protocol as p
from sandboxes.base import Call
from sandboxes.kubernetes import KubernetesProvider, KubernetesSandbox, KubernetesSandboxConfig

TREE_DIRS = 10
FILES_PER_DIR = 20  # 200 files in all, as the other backends' benchmarks
NEEDLE = "needle"
EXECUTE_VS_PERSISTENT = 1.5
"""Issue #12: execute p50 may cost at most this many times the raw persistent stream's."""
EXECUTE_VS_FRESH = 20.0
"""Issue #12: execute p50 at least this many times faster than a raw fresh exec."""
FILE_OP_TARGET = 2.0
"""Issue #14: a file operation's p50 at most this many times our execute p50 ..."""
GREP_TARGET = 3.0
"""... and grep over the 200-file tree at most this many."""
EDIT_TRIPS = 2
"""Issue #14: an edit takes at most this many round trips."""
TRANSFER_TARGET = 0.8
"""Transfers should reach this fraction of the raw copy's throughput (the Docker and SSH benches' target)."""

T = TypeVar("T")


class CountingKubernetesSandbox(CountingCalls, KubernetesSandbox):
    """Counts its round trips (`_common.CountingCalls`), and apart those the exec helper's
    native ops answered, so a row meant to time the scripts can prove it did."""

    native_answers = 0

    def _run_native(self, call: Call) -> p.ExecuteResponse | None:
        answer = super()._run_native(call)
        self.native_answers += answer is not None
        return answer


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def row(
    name: str,
    ours: list[float],
    baselines: dict[str, list[float]],
    *,
    trips: float | None = None,
    target: str = "",
    note: str = "",
) -> float:
    """Print one row; return our p50."""
    ours_p50 = statistics.median(ours)
    line = f"{name:<24} ours p50 {ours_p50:8.2f} ms  p99 {percentile(ours, 0.99):8.2f} ms"
    for label, samples in baselines.items():
        base = statistics.median(samples)
        line += f" | {label} p50 {base:8.2f} ms ({base / ours_p50:5.2f}x)"
    if trips is not None:
        line += f" | round trips {trips:g}"
    if target:
        line += f" | target {target}"
    if note:
        line += f" | {note}"
    print(line)
    return ours_p50


def alternate(
    n: int,
    ours: Callable[[], object],
    *others: Callable[[], object],
    warmup: int = 0,
    setup: Callable[[], object] | None = None,
) -> list[list[float]]:
    """Sides alternate within one loop (which goes first alternates too), so noise hits all;
    ``setup`` runs untimed before every call of every side, the ``warmup`` rounds untimed."""
    sides = [ours, *others]
    samples: list[list[float]] = [[] for _ in sides]
    for i in range(warmup + n):
        order = range(len(sides)) if i % 2 == 0 else reversed(range(len(sides)))
        for index in order:
            if setup is not None:
                setup()
            elapsed = timed(sides[index])
            if i >= warmup:
                samples[index].append(elapsed)
    return samples


def toggle(edit: Callable[[str, str], T]) -> Callable[[], T]:
    """An edit that flips a word back and forth, so every call has exactly one match to replace."""
    state = {"flipped": False}

    def run() -> T:
        old, new = ("omega", "alpha") if state["flipped"] else ("alpha", "omega")
        state["flipped"] = not state["flipped"]
        return edit(old, new)

    return run


def scripts_only(sandbox: CountingKubernetesSandbox, fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` with the native ops off (`_common.scripted`), failing loudly if the helper answered
    anyway: a ``(scripts)`` row that timed the native op would report nothing."""
    run = scripted(sandbox, fn)

    def checked() -> object:
        before = sandbox.native_answers
        result = run()
        if sandbox.native_answers != before:
            raise RuntimeError("a (scripts) row's call was answered by the exec helper's native op")
        return result

    return checked


def counted(sandbox: CountingKubernetesSandbox, trips: list[int], fn: Callable[[], object]) -> Callable[[], object]:
    """``fn``, recording the round trips of each call into ``trips``."""

    def run() -> object:
        before = sandbox.calls
        result = fn()
        trips.append(sandbox.calls - before)
        return result

    return run


# --------------------------------------------------------------------------- file operations


def build_tree(sandbox: KubernetesSandbox, tree: str, work: str) -> None:
    files: list[tuple[str, bytes]] = []
    for d in range(TREE_DIRS):
        for f in range(FILES_PER_DIR):
            lines = [f"line {i} of file {d}/{f}\n" for i in range(40)]
            if f % 5 == 0:
                lines[7] = f"a {NEEDLE} in file {d}/{f}\n"
            files.append((f"{tree}/d{d:02}/f{f:02}{'.py' if f % 2 == 0 else '.txt'}", "".join(lines).encode()))
    edit = ("".join(f"line {i}\n" for i in range(100)) + "the alpha word\n").encode()
    files += [(f"{work}/edit-{side}.txt", edit) for side in ("ours", "persistent", "fresh")]
    files.append((f"{work}/read.txt", "".join(f"line {i} with some text\n" for i in range(200)).encode()))
    ok(sandbox.upload_files(files))


def check_equivalent(sandbox: KubernetesSandbox, shell: RawShell, tree: str) -> None:
    """The raw commands must find what ours finds, or the comparison means nothing."""
    pairs = [
        ("ls", _count(sandbox.ls(f"{tree}/d00"), "entries"), _lines(shell.run(f"ls -A {tree}/d00"))),
        ("grep", _count(sandbox.grep(NEEDLE, tree), "matches"), _lines(shell.run(f"grep -rnF {NEEDLE} {tree}"))),
        ("glob", _count(sandbox.glob("*.py", tree), "matches"), _lines(shell.run(f"find {tree} -name '*.py'"))),
    ]
    for op, ours, raw in pairs:
        if ours != raw or ours == 0:
            raise RuntimeError(f"{op}: KubernetesSandbox found {ours}, the raw command {raw}")


def _count(result: object, field: str) -> int:
    ok(result)
    return len(getattr(result, field) or [])


def _lines(output: bytes) -> int:
    return len(output.splitlines())


def bench_file_ops(
    sandbox: CountingKubernetesSandbox,
    shell: RawShell,
    fresh: Callable[[str], object],
    args: argparse.Namespace,
    execute_p50: float,
) -> None:
    work = sandbox.workdir
    tree = f"{work}/tree"
    build_tree(sandbox, tree, work)
    check_equivalent(sandbox, shell, tree)
    text = "x" * 1000 + "\n"
    doomed = f"{work}/doomed.txt"

    def recreate() -> None:
        shell.run(f"echo bye > {doomed}")

    def raw_edit(side: str) -> Callable[[str, str], str]:
        return lambda old, new: f"sed -i s/{old}/{new}/ {work}/edit-{side}.txt"

    # (op, ours, the raw command (or, for edit, a toggle making it), setup before every call)
    cases: list[tuple[str, Callable[[], object], Callable[[str], Callable[[], str]], Callable[[], object] | None]] = [
        ("ls", lambda: ok(sandbox.ls(f"{tree}/d00")), lambda _: _fixed(f"ls -la {tree}/d00"), None),
        ("ls (scripts)", scripts_only(sandbox, lambda: ok(sandbox.ls(f"{tree}/d00"))),
         lambda _: _fixed(f"ls -la {tree}/d00"), None),
        ("read", lambda: ok(sandbox.read(f"{work}/read.txt")), lambda _: _fixed(f"cat {work}/read.txt"), None),
        ("write", lambda: ok(sandbox.write(f"{work}/written.txt", text)),
         lambda side: _fixed(f"printf %s {shlex.quote(text)} > {work}/written-{side}.txt"), None),
        ("edit", toggle(lambda old, new: ok(sandbox.edit(f"{work}/edit-ours.txt", old, new))),
         lambda side: toggle(raw_edit(side)), None),
        ("delete", lambda: ok(sandbox.delete(doomed)), lambda _: _fixed(f"rm {doomed}"), recreate),
        ("delete (scripts)", scripts_only(sandbox, lambda: ok(sandbox.delete(doomed))),
         lambda _: _fixed(f"rm {doomed}"), recreate),
        ("grep", lambda: ok(sandbox.grep(NEEDLE, tree)), lambda _: _fixed(f"grep -rnF {NEEDLE} {tree}"), None),
        ("glob", lambda: ok(sandbox.glob("*.py", tree)), lambda _: _fixed(f"find {tree} -name '*.py'"), None),
    ]  # fmt: skip
    for op, ours, raw, setup in cases:
        trips: list[int] = []
        samples = alternate(
            args.iterations,
            counted(sandbox, trips, ours),
            _running(shell.run, raw("persistent")),
            _running(fresh, raw("fresh")),
            warmup=args.warmup,
            setup=setup,
        )
        ours_p50 = statistics.median(samples[0])
        limit = GREP_TARGET if op == "grep" else FILE_OP_TARGET
        target = f"p50 <= {limit:g}x execute: {ours_p50 / execute_p50:.2f}x {verdict(ours_p50 <= limit * execute_p50)}"
        if op == "edit":
            target += f", <= {EDIT_TRIPS} round trips: {verdict(max(trips) <= EDIT_TRIPS)}"
        row(op, samples[0], {"raw persistent": samples[1], "raw fresh exec": samples[2]},
            trips=statistics.mean(trips), target=target)  # fmt: skip


def _fixed(command: str) -> Callable[[], str]:
    return lambda: command


def _running(run: Callable[[str], object], command: Callable[[], str]) -> Callable[[], object]:
    """Each call runs the command ``command`` gives now (a toggling edit's changes)."""
    return lambda: run(command())


# --------------------------------------------------------------------------- transfers


def bench_transfers(sandbox: CountingKubernetesSandbox, api: Any, namespace: str, args: argparse.Namespace) -> None:
    size = args.transfer_mib << 20
    data = (uuid.uuid4().bytes * (size // 16 + 1))[:size]
    ours_path, raw_path = f"{sandbox.workdir}/xfer-ours.bin", f"{sandbox.workdir}/xfer-raw.bin"

    def ours_download() -> None:
        got = sandbox.download_files([ours_path])
        ok(got)
        if got[0].content != data:
            raise RuntimeError("download_files returned other bytes")

    def raw_fetch() -> None:
        got = raw_download(api, namespace, sandbox.id, raw_path)
        if got != data:
            there = fresh_exec(api, namespace, sandbox.id, f"wc -c < {raw_path}; sha256sum {raw_path}")
            raise RuntimeError(
                f"the raw cat returned other bytes: {len(got)} of {size} (sha256 {hashlib.sha256(got).hexdigest()}, "
                f"sent {hashlib.sha256(data).hexdigest()}); in the pod: {there.decode(errors='replace')!r}"
            )

    for op, ours, raw, baseline in [
        ("upload_files", lambda: ok(sandbox.upload_files([(ours_path, data)])),
         lambda: raw_upload(api, namespace, sandbox.id, raw_path, data), "raw fresh exec head -c"),
        ("download_files", ours_download, raw_fetch, "raw fresh exec cat"),
    ]:  # fmt: skip
        trips: list[int] = []
        samples = alternate(args.transfer_iterations, counted(sandbox, trips, ours), raw, warmup=min(args.warmup, 1))
        ours_rate, raw_rate = (args.transfer_mib / (statistics.median(side) / 1000) for side in samples)
        ratio = ours_rate / raw_rate
        row(f"{op} {args.transfer_mib}MiB", samples[0], {baseline: samples[1]}, trips=statistics.mean(trips),
            target=f"throughput >= {TRANSFER_TARGET:g}x raw: {ours_rate:.1f} vs {raw_rate:.1f} MiB/s, {ratio:.2f}x "
                   f"{verdict(ratio >= TRANSFER_TARGET)}",
            note="round trips count execute calls; the bytes move in an exec of their own")  # fmt: skip


# --------------------------------------------------------------------------- running


def bench_pod(api: Any, api_client: Any, template: KubernetesSandboxConfig, args: argparse.Namespace) -> None:
    """Every row that runs on one pod: execute, file operations, transfers."""
    namespace = args.namespace
    with CountingKubernetesSandbox.create(template, api_client=api_client) as sandbox:
        assert isinstance(sandbox, CountingKubernetesSandbox)
        sandbox.execute("true")
        shell = RawShell(api, namespace, sandbox.id)
        try:
            ours, persistent, fresh = alternate(
                args.iterations,
                lambda: ok(sandbox.execute("true")),
                lambda: shell.run("/bin/sh -c true"),  # a process, as the helper spawns one
                lambda: fresh_exec(api, namespace, sandbox.id, "true"),
                warmup=args.warmup,
            )
            execute_p50 = statistics.median(ours)
            vs_persistent, vs_fresh = (
                execute_p50 / statistics.median(persistent),
                statistics.median(fresh) / execute_p50,
            )
            row("execute true", ours, {"raw persistent": persistent, "raw fresh exec": fresh},
                target=f"p50 <= {EXECUTE_VS_PERSISTENT:g}x raw persistent: {vs_persistent:.2f}x "
                       f"{verdict(vs_persistent <= EXECUTE_VS_PERSISTENT)}, >= {EXECUTE_VS_FRESH:g}x faster than "
                       f"a fresh exec: {vs_fresh:.1f}x {verdict(vs_fresh >= EXECUTE_VS_FRESH)}")  # fmt: skip
            bench_file_ops(sandbox, shell, lambda command: fresh_exec(api, namespace, sandbox.id, command), args,
                           execute_p50)  # fmt: skip
            bench_transfers(sandbox, api, namespace, args)
        finally:
            shell.close()


def bench_cold(api: Any, api_client: Any, template: KubernetesSandboxConfig, args: argparse.Namespace) -> None:
    ours, raw = [], []
    made: list[KubernetesSandbox] = []
    for _ in range(args.cold_iterations):  # the deletes after each are not counted
        ours.append(timed(lambda: made.append(KubernetesSandbox.create(template, api_client=api_client))))
        made.pop().destroy()
        raw.append(raw_cold_start(api, args.namespace, args.image))
    ratio = statistics.median(ours) / statistics.median(raw)
    row("cold start (to Ready)", ours, {"raw create->Running": raw},
        target=f"p50 <= 1.2x raw: {ratio:.2f}x {verdict(ratio <= 1.2)}")  # fmt: skip
    with KubernetesProvider(template, api_client=api_client, pool_size=2, sweep_interval=None) as pool:
        acquired: list[float] = []
        holder: list[KubernetesSandbox] = []
        for _ in range(args.cold_iterations):
            pool.wait_filled(300)
            acquired.append(timed(lambda: holder.append(pool.acquire())))
            holder.pop().destroy()
        p99 = percentile(acquired, 0.99)
        row("warm acquisition", acquired, {}, target=f"p99 <= 100 ms: {verdict(p99 <= 100)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=50, help="timed calls per latency row and side")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds before each latency row")
    parser.add_argument("--cold-iterations", type=int, default=5, help="cold starts and warm acquisitions")
    parser.add_argument("--transfer-iterations", type=int, default=5, help="timed transfers per side")
    parser.add_argument("--transfer-mib", type=int, default=64, help="transfer size in MiB (above 1: the bulk path)")
    parser.add_argument("--namespace", default="sandboxes")
    parser.add_argument("--image", default="sandboxes/runtime:latest")
    parser.add_argument("--owner", default=f"bench-{uuid.uuid4().hex[:8]}", help="owner label of every pod made")
    args = parser.parse_args()
    if min(args.iterations, args.cold_iterations, args.transfer_iterations) < 1 or args.warmup < 0:
        parser.error("iterations must be >= 1, --warmup >= 0")
    if args.transfer_mib < 2:
        parser.error("--transfer-mib must be >= 2 (files up to 1 MiB do not take the bulk path)")
    print(machine())
    from kubernetes import client

    with cluster(args.owner) as (api_client, where):
        print(f"bench_kubernetes against {where}; medians beside raw baselines of the same run")
        api = client.CoreV1Api(api_client)
        template = KubernetesSandboxConfig(namespace=args.namespace, image=args.image, owner=args.owner)
        bench_pod(api, api_client, template, args)
        bench_cold(api, api_client, template, args)
    print("(N.NNx) = baseline p50 / ours p50: above 1x we are faster. Targets are reported, never asserted.")


if __name__ == "__main__":
    main()
