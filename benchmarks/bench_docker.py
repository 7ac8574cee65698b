"""DockerSandbox latency and throughput beside what the same work costs without it.

Everything runs against ONE runtime-image container, so both sides of a row share the machine,
the daemon and the files. The baselines are what someone would otherwise write:

* execute: a raw ``docker exec`` through the SDK (``container.exec_run``), the floor that the
  exec helper exists to beat.
* file operations: deepagents' own ``BaseSandbox`` over the same container, with ``execute``
  built on ``container.exec_run(["sh", "-c", cmd])`` and files moved as tars, the way
  deepagents' Docker integrations do it; same paths, same patterns, and ls/read/grep/glob are
  checked to find the same things before anything is timed.
* transfers: ``put_archive``/``get_archive`` of the same 64 MiB (tar built/unpacked here).
* create: ``client.containers.run(image, ["sleep", "infinity"])`` without our secure defaults.
* warm pool: ``DockerProvider(pool_size=2).acquire()`` once the pool has refilled, beside our
  own cold create from the row above (the cost the pool exists to hide).
* images without python3 (no exec helper can start: one ``docker exec`` per command), Debian's
  coreutils and busybox alone: each file op beside our own ``execute('true')`` in the same image
  and loop, the ratio the promise "a file op costs at most 2x an execute" is about where the
  sandbox has no helper (rows 2's ``(scripts)`` time the scripts through a running helper).

Every ratio is a speedup, baseline time / our time: above 1x we are faster. Targets are
reported, never asserted. Sides alternate within one loop (and which goes first alternates)
so machine noise hits both alike. Every container made carries an owner label unique to the
run and is swept by that label at the end, whatever happens.

    python benchmarks/bench_docker.py [--iterations N] [--json] [--save report.json]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import io
import json
import platform
import posixpath
import statistics
import sys
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _common import CountingCalls, machine, save_report, scripted
from _common import percentile as _percentile
from _common import timed as _timed
from deepagents.backends import protocol as da
from deepagents.backends.sandbox import BaseSandbox as DeepagentsBaseSandbox

from sandboxes.docker import LABEL_OWNER, DockerSandbox, DockerSandboxConfig
from sandboxes.docker.provider import DockerProvider

IMAGE = "sandboxes/runtime:latest"
TREE = "/workspace/tree"
WORK = "/workspace/bench"
TREE_DIRS = 10
FILES_PER_DIR = 10  # in each tree/dNN and again in tree/dNN/sub: 200 files in all
NEEDLE = "needle"
TRANSFER_BYTES = 64 << 20
MIB = float(1 << 20)


class CountingDockerSandbox(CountingCalls, DockerSandbox):
    """Counts its round trips (`_common.CountingCalls`)."""


class ExecRunSandbox(DeepagentsBaseSandbox):
    """deepagents' BaseSandbox as its Docker integrations drive it: each command one fresh
    ``docker exec`` of ``sh -c``, each uploaded file one tar through ``put_archive``."""

    def __init__(self, container: Any, uid: int, gid: int) -> None:
        self.container = container
        self.uid, self.gid = uid, gid
        self.calls = 0
        """Docker API round trips: exec_run and put_archive calls."""

    @property
    def id(self) -> str:
        return str(self.container.id)

    def execute(self, command: str, *, timeout: int | None = None) -> da.ExecuteResponse:
        self.calls += 1
        result = self.container.exec_run(["sh", "-c", command])
        return da.ExecuteResponse(output=bytes(result.output or b"").decode("utf-8", "replace"),
                                  exit_code=result.exit_code)  # fmt: skip

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[da.FileUploadResponse]:
        responses = []
        for path, data in files:
            self.calls += 1
            archive = _tar_of(posixpath.basename(path), data, self.uid, self.gid)
            try:
                ok = self.container.put_archive(posixpath.dirname(path), archive)
            except Exception as exc:  # the daemon's refusal, per file, as the protocol asks
                responses.append(da.FileUploadResponse(path=path, error=f"put_archive failed: {exc}"))
                continue
            responses.append(da.FileUploadResponse(path=path, error=None if ok else "permission_denied"))
        return responses

    def download_files(self, paths: list[str]) -> list[da.FileDownloadResponse]:
        responses = []
        for path in paths:
            self.calls += 1
            try:
                content = _untar_one(self.container.get_archive(path)[0])
            except Exception as exc:
                responses.append(da.FileDownloadResponse(path=path, error=f"get_archive failed: {exc}"))
                continue
            responses.append(da.FileDownloadResponse(path=path, content=content))
        return responses


@dataclass(frozen=True, slots=True)
class Row:
    section: str
    op: str
    baseline: str
    unit: str
    """``ms`` (lower is better) or ``MiB/s`` (higher is better; p90 is then the slow end)."""
    ours_p50: float | None
    ours_p90: float | None
    base_p50: float | None
    base_p90: float | None
    ours_trips: float | None
    """Our ``execute`` calls per operation (transfers add one archive API call)."""
    base_trips: float | None
    speedup: float | None
    """Baseline p50 time / our p50 time: above 1 we are faster."""
    target: str
    met: bool | None
    note: str = ""


def _ok(result: object) -> object:
    """Fail loudly rather than time an operation that errored (works for both protocols)."""
    items = result if isinstance(result, list) else [result]
    for item in items:
        if getattr(item, "error", None) is not None:
            raise RuntimeError(f"benchmark operation failed: {item}")
        if getattr(item, "exit_code", 0) not in (0, None):
            raise RuntimeError(f"benchmark command failed: {item}")
    return result


def _tar_of(name: str, data: bytes, uid: int, gid: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.size, info.uid, info.gid, info.mode, info.mtime = len(data), uid, gid, 0o644, int(time.time())
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _untar_one(chunks: Iterator[bytes]) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r") as archive:
        member = archive.next()
        handle = archive.extractfile(member) if member is not None else None
        if handle is None:
            raise RuntimeError("archive holds no regular file")
        return handle.read()


def _paired(
    ours: Callable[[], object],
    base: Callable[[], object],
    iterations: int,
    warmup: int,
    setup: Callable[[], None] | None = None,
) -> tuple[list[float], list[float]]:
    ours_ms: list[float] = []
    base_ms: list[float] = []
    for i in range(warmup + iterations):
        sides = [(ours, ours_ms), (base, base_ms)]
        for fn, samples in sides if i % 2 == 0 else sides[::-1]:
            if setup:
                setup()
            elapsed = _timed(fn)
            if i >= warmup:
                samples.append(elapsed)
    return ours_ms, base_ms


def _row(section: str, op: str, baseline: str, ours_ms: list[float], base_ms: list[float], *,
         ours_trips: float | None = None, base_trips: float | None = None, target: str = "",
         met: Callable[[float, float], bool] | None = None, note: str = "") -> Row:  # fmt: skip
    """A latency row; ``met`` judges (our p50 ms, speedup)."""
    o50, b50 = statistics.median(ours_ms), statistics.median(base_ms)
    speedup = b50 / o50 if o50 else float("inf")
    return Row(section, op, baseline, "ms", o50, _percentile(ours_ms, 0.9), b50, _percentile(base_ms, 0.9),
               ours_trips, base_trips, speedup, target, None if met is None else met(o50, speedup), note)  # fmt: skip


# --------------------------------------------------------------------------- 1. execute


def _bench_execute(sb: CountingDockerSandbox, iterations: int, warmup: int) -> list[Row]:
    ours, raw = _paired(lambda: _ok(sb.execute("true")), lambda: _ok(sb.container.exec_run("true")),
                        iterations, warmup)  # fmt: skip
    return [_row("execute", "execute('true')", "raw docker exec: container.exec_run('true')", ours, raw,
                 ours_trips=1, base_trips=1)]  # fmt: skip


# --------------------------------------------------------------------------- 2. file operations


def _build_tree(sb: DockerSandbox) -> None:
    files: list[tuple[str, bytes]] = []
    for d in range(TREE_DIRS):
        for directory in (f"{TREE}/d{d:02}", f"{TREE}/d{d:02}/sub"):
            for f in range(FILES_PER_DIR):
                lines = [f"line {i} of {directory}/{f}\n" for i in range(40)]
                if f % 5 == 0:
                    lines[7] = f"a {NEEDLE} in {directory}/{f}\n"
                files.append((f"{directory}/f{f:02}{'.py' if f % 2 == 0 else '.txt'}", "".join(lines).encode()))
    files.append((f"{WORK}/edit.txt", ("".join(f"line {i}\n" for i in range(100)) + "the alpha word\n").encode()))
    files.append((f"{WORK}/read.txt", "".join(f"line {i} with some text\n" for i in range(200)).encode()))
    _ok(sb.upload_files(files))


def _check_equivalent(sb: DockerSandbox, da_sb: ExecRunSandbox) -> None:
    """Both sides must find the same things, or the comparison means nothing."""
    pairs = [
        ("ls", len(_field(sb.ls(f"{TREE}/d00"), "entries")), len(_field(da_sb.ls(f"{TREE}/d00"), "entries"))),
        ("grep", len(_field(sb.grep(NEEDLE, TREE), "matches")), len(_field(da_sb.grep(NEEDLE, TREE), "matches"))),
        ("glob", len(_field(sb.glob("*.py", TREE), "matches")), len(_field(da_sb.glob("*.py", TREE), "matches"))),
        ("read lines", _lines(sb.read(f"{WORK}/read.txt")), _lines(da_sb.read(f"{WORK}/read.txt"))),
    ]
    for op, ours, theirs in pairs:
        if ours != theirs or ours == 0:
            raise RuntimeError(f"{op}: DockerSandbox found {ours}, deepagents BaseSandbox {theirs}")


def _field(result: object, name: str) -> list[Any]:
    _ok(result)
    return list(getattr(result, name) or [])


def _lines(result: object) -> int:
    """Lines read (deepagents drops the final newline, so characters would differ by one)."""
    _ok(result)
    data = getattr(result, "file_data", None)
    return len(str(data["content"] if isinstance(data, Mapping) else getattr(data, "content", "")).splitlines())


def _bench_file_ops(sb: CountingDockerSandbox, da_sb: ExecRunSandbox, iterations: int, warmup: int) -> list[Row]:
    _build_tree(sb)
    _check_equivalent(sb, da_sb)
    text = "x" * 1000 + "\n"
    flipped = [False]  # both sides edit the same file: each call flips whatever is there now

    def edit(backend: Any) -> Callable[[], object]:
        def run() -> object:
            old, new = ("omega", "alpha") if flipped[0] else ("alpha", "omega")
            flipped[0] = not flipped[0]
            return _ok(backend.edit(f"{WORK}/edit.txt", old, new))

        return run

    def recreate() -> None:
        _ok(sb.container.exec_run(["sh", "-c", f"echo bye > {WORK}/doomed.txt"]))

    cases: list[tuple[str, Callable[[Any], object], Callable[[], None] | None]] = [
        ("ls", lambda b: _ok(b.ls(f"{TREE}/d00")), None),
        ("ls (scripts)", lambda b: scripted(b, lambda: _ok(b.ls(f"{TREE}/d00")))(), None),
        ("read", lambda b: _ok(b.read(f"{WORK}/read.txt")), None),
        ("write", lambda b: _ok(b.write(f"{WORK}/written.txt", text)), None),
        ("edit", lambda b: edit(b)(), None),
        ("write (scripts)", lambda b: scripted(b, lambda: _ok(b.write(f"{WORK}/written.txt", text)))(), None),
        ("edit (scripts)", lambda b: scripted(b, edit(b))(), None),
        ("delete", lambda b: _ok(b.delete(f"{WORK}/doomed.txt")), recreate),
        ("delete (scripts)", lambda b: scripted(b, lambda: _ok(b.delete(f"{WORK}/doomed.txt")))(), recreate),
        ("grep", lambda b: _ok(b.grep(NEEDLE, TREE)), None),
        ("glob", lambda b: _ok(b.glob("*.py", TREE)), None),
    ]
    rows = []
    for op, call, setup in cases:
        for _ in range(warmup):
            for backend in (sb, da_sb):
                if setup:
                    setup()
                call(backend)
        ours_before, base_before = sb.calls, da_sb.calls
        ours, base = _paired(functools.partial(call, sb), functools.partial(call, da_sb), iterations, 0, setup)
        rows.append(_row("file ops", op, "deepagents BaseSandbox over exec_run", ours, base,
                         ours_trips=(sb.calls - ours_before) / iterations,
                         base_trips=(da_sb.calls - base_before) / iterations,
                         target="p50 <= 10 ms and >= 15x", met=lambda o50, s: o50 <= 10 and s >= 15))  # fmt: skip
    return rows


# --------------------------------------------------------------------------- 3. transfers


def _bench_transfer(sb: CountingDockerSandbox, iterations: int, warmup: int) -> list[Row]:
    data = bytes(range(256)) * (TRANSFER_BYTES // 256)
    uid, gid = sb.config.uid_gid
    ours_path, raw_name = "/workspace/xfer-ours.bin", "xfer-raw.bin"

    def raw_upload() -> None:
        if not sb.container.put_archive("/workspace", _tar_of(raw_name, data, uid, gid)):
            raise RuntimeError("put_archive refused")

    def raw_download() -> None:
        if len(_untar_one(sb.container.get_archive(ours_path)[0])) != TRANSFER_BYTES:
            raise RuntimeError("get_archive returned the wrong size")

    def ours_download() -> None:
        content = _ok(sb.download_files([ours_path]))[0].content  # type: ignore[index]
        if len(content) != TRANSFER_BYTES:
            raise RuntimeError("download_files returned the wrong size")

    rows = []
    for op, ours_fn, raw_fn, baseline in [
        ("upload_files 64MiB", lambda: _ok(sb.upload_files([(ours_path, data)])), raw_upload,
         "tar + container.put_archive"),
        ("download_files 64MiB", ours_download, raw_download, "container.get_archive + untar"),
    ]:  # fmt: skip
        before = sb.calls
        ours, raw = _paired(ours_fn, raw_fn, iterations, warmup)
        trips = (sb.calls - before) / (iterations + warmup)
        o_rate = [TRANSFER_BYTES / MIB / (ms / 1000) for ms in (statistics.median(ours), _percentile(ours, 0.9))]
        r_rate = [TRANSFER_BYTES / MIB / (ms / 1000) for ms in (statistics.median(raw), _percentile(raw, 0.9))]
        speedup = o_rate[0] / r_rate[0]
        rows.append(Row("transfer", op, baseline, "MiB/s", o_rate[0], o_rate[1], r_rate[0], r_rate[1], trips, 1,
                        speedup, ">= 0.8x", speedup >= 0.8))  # fmt: skip
    return rows


# --------------------------------------------------------------------------- 4. cold create


def _bench_create(client: Any, config: DockerSandboxConfig, iterations: int) -> list[Row]:
    samples: dict[str, list[float]] = {k: [] for k in ("create", "first", "destroy", "run", "exec", "remove")}

    def ours() -> None:
        holder: list[DockerSandbox] = []
        samples["create"].append(_timed(lambda: holder.append(DockerSandbox.create(config, client=client))))
        try:
            samples["first"].append(_timed(lambda: _ok(holder[0].execute("true"))))
        finally:
            samples["destroy"].append(_timed(holder[0].destroy))

    def raw() -> None:
        holder: list[Any] = []
        samples["run"].append(_timed(lambda: holder.append(client.containers.run(
            config.image, ["sleep", "infinity"], detach=True, network_mode="none",
            labels={LABEL_OWNER: config.owner}))))  # fmt: skip
        try:
            samples["exec"].append(_timed(lambda: _ok(holder[0].exec_run("true"))))
        finally:
            samples["remove"].append(_timed(lambda: holder[0].remove(force=True, v=True)))

    for i in range(iterations):
        for fn in (ours, raw) if i % 2 == 0 else (raw, ours):
            fn()
    plus = [c + f for c, f in zip(samples["create"], samples["first"], strict=True)]
    raw_plus = [r + e for r, e in zip(samples["run"], samples["exec"], strict=True)]
    raw_run = "containers.run(sleep infinity, network none)"
    within = ">= 0.83x (ours <= 1.2x raw)"
    return [
        _row("create", "DockerSandbox.create", raw_run, samples["create"], samples["run"], target=within,
             met=lambda _, s: s >= 1 / 1.2, note="ours adds a volume, limits, init, tmpfs, read-only root"),
        _row("create", "create + first execute", raw_run + " + exec_run('true')", plus, raw_plus, target=within,
             met=lambda _, s: s >= 1 / 1.2, note="first execute starts the exec helper"),
        _row("create", "destroy", "container.remove(force=True, v=True)", samples["destroy"], samples["remove"],
             note="ours also removes the workspace volume"),
    ]  # fmt: skip


# --------------------------------------------------------------------------- 5. warm pool


def _bench_pool(client: Any, config: DockerSandboxConfig, iterations: int, cold: list[Row]) -> list[Row]:
    """Each acquire is timed once the pool has refilled (untimed), so it measures a warm hit."""
    acquired: list[float] = []
    first: list[float] = []
    provider = DockerProvider(config, client=client, pool_size=2, sweep_interval=None, sweep_on_start=False)
    provider.start()
    try:
        for _ in range(iterations):
            if not provider.wait_filled(timeout=120):
                raise RuntimeError("the warm pool did not refill within 120 s")
            holder: list[DockerSandbox] = []
            acquired.append(_timed(functools.partial(_acquire_into, provider, holder)))
            try:
                first.append(_timed(lambda s=holder[0]: _ok(s.execute("true"))))  # type: ignore[misc]
            finally:
                holder[0].destroy()
    finally:
        provider.close()
    by_op = {r.op: r for r in cold}
    plus = [a + f for a, f in zip(acquired, first, strict=True)]
    rows = []
    for op, samples, base in (("acquire (warm pool)", acquired, by_op["DockerSandbox.create"]),
                              ("acquire + first execute", plus, by_op["create + first execute"])):  # fmt: skip
        o50 = statistics.median(samples)
        speedup = base.ours_p50 / o50 if base.ours_p50 and o50 else None
        rows.append(Row("pool", op, f"cold {base.op}", "ms", o50, _percentile(samples, 0.9), base.ours_p50,
                        base.ours_p90, None, None, speedup, "p50 <= 20 ms", o50 <= 20,
                        "pool_size=2; baseline = our cold row of section 4"))  # fmt: skip
    return rows


def _acquire_into(provider: DockerProvider, holder: list[DockerSandbox]) -> None:
    holder.append(provider.acquire())


# --------------------------------------------------------------------------- 6. images without python3

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
FALLBACK_IMAGES = (("no python3", "no-python"), ("busybox", "busybox"))
"""(label, fixture directory): images the tests build too, under the same tags."""


def _bench_fallback(client: Any, owner: str, iterations: int, warmup: int) -> list[Row]:
    rows: list[Row] = []
    for label, fixture in FALLBACK_IMAGES:
        tag = f"sandboxes-test/{fixture}:latest"
        client.images.build(path=str(FIXTURES / fixture), tag=tag, rm=True)
        config = DockerSandboxConfig(image=tag, owner=owner)
        created = DockerSandbox.create(config, client=client)
        sb = CountingDockerSandbox(created.container, client, config)
        try:
            rows += _fallback_rows(sb, label, iterations, warmup)
        finally:
            sb.destroy()
    return rows


def _fallback_rows(sb: CountingDockerSandbox, label: str, iterations: int, warmup: int) -> list[Row]:
    _ok(sb.execute(f"mkdir -p {TREE}/d00/sub {WORK} && cd {TREE}/d00 && for i in 0 1 2 3 4 5 6 7 8 9; do "
                   f"echo a {NEEDLE} $i > f$i.py; echo x > sub/g$i.txt; done && echo alpha > {WORK}/edit.txt && "
                   f"echo some text > {WORK}/read.txt"))  # fmt: skip
    if sb.helper_alive:
        raise RuntimeError(f"{label}: an exec helper runs, so this section would time the wrong path")
    flipped = [False]

    def edit() -> object:
        old, new = ("omega", "alpha") if flipped[0] else ("alpha", "omega")
        flipped[0] = not flipped[0]
        return _ok(sb.edit(f"{WORK}/edit.txt", old, new))

    execute = functools.partial(sb.execute, "true")
    ours, raw = _paired(lambda: _ok(execute()), lambda: _ok(sb.container.exec_run("true")), iterations, warmup)
    rows = [_row("fallback", f"{label}: execute('true')", "raw docker exec: container.exec_run('true')", ours, raw,
                 ours_trips=1, base_trips=1)]  # fmt: skip
    cases: list[tuple[str, Callable[[], object], Callable[[], None] | None, float]] = [
        ("ls", lambda: _ok(sb.ls(f"{TREE}/d00")), None, 2),
        ("read", lambda: _ok(sb.read(f"{WORK}/read.txt")), None, 2),
        ("write", lambda: _ok(sb.write(f"{WORK}/written.txt", "x" * 1000)), None, 2),
        ("edit", edit, None, 2),
        ("delete", lambda: _ok(sb.delete(f"{WORK}/doomed.txt")),
         lambda: _ok(sb.container.exec_run(["sh", "-c", f"echo bye > {WORK}/doomed.txt"])), 2),
        ("grep", lambda: _ok(sb.grep(NEEDLE, TREE)), None, 3),
        ("glob", lambda: _ok(sb.glob("*.py", TREE)), None, 2),
    ]  # fmt: skip
    for op, call, setup, bound in cases:
        before = sb.calls
        ours, base = _paired(call, lambda: _ok(execute()), iterations, warmup, setup)
        trips = (sb.calls - before) / (warmup + iterations) - 1  # less the execute beside it
        target, met = (f"p50 <= {bound:g}x execute", lambda _, s, b=bound: s >= 1 / b)
        if op == "edit":  # read, then compare-and-swap: two round trips, each a docker exec
            target, met = "<= 2 round trips", lambda _, s, t=trips: t <= 2
        rows.append(_row("fallback", f"{label}: {op}", "our execute('true'), same image", ours, base,
                         ours_trips=trips, base_trips=1, target=target, met=met))  # fmt: skip
    return rows


# --------------------------------------------------------------------------- running


def _sweep(client: Any, owner: str) -> int:
    selector = f"{LABEL_OWNER}={owner}"
    removed = 0
    for container in client.containers.list(all=True, filters={"label": selector}):
        with contextlib.suppress(Exception):
            container.remove(force=True, v=True)
            removed += 1
    for volume in client.volumes.list(filters={"label": selector}):
        with contextlib.suppress(Exception):
            volume.remove(force=True)
    return removed


def run(iterations: int, warmup: int = 2, heavy_iterations: int | None = None, owner: str | None = None,
        image: str = IMAGE) -> dict[str, Any]:  # fmt: skip
    import docker

    heavy = heavy_iterations or min(iterations, 5)
    owner = owner or f"bench-{base64.b32encode(uuid.uuid4().bytes[:5]).decode().lower()}"
    client = docker.from_env()
    config = DockerSandboxConfig(image=image, owner=owner)
    rows: list[Row] = []
    started = time.monotonic()
    try:
        created = DockerSandbox.create(config, client=client)
        sb = CountingDockerSandbox(created.container, client, config)
        try:
            uid, gid = config.uid_gid
            da_sb = ExecRunSandbox(sb.container, uid, gid)
            rows += _bench_execute(sb, iterations, warmup)
            rows += _bench_file_ops(sb, da_sb, iterations, warmup)
            rows += _bench_transfer(sb, heavy, min(warmup, 1))
            rows += _bench_create(client, config, heavy)
            rows += _bench_pool(client, config, min(iterations, 10), [r for r in rows if r.section == "create"])
            rows += _bench_fallback(client, owner, min(iterations, 20), min(warmup, 1))
        finally:
            sb.destroy()
    finally:
        leftovers = _sweep(client, owner)
    return {
        "iterations": iterations,
        "heavy_iterations": heavy,
        "image": image,
        "owner": owner,
        "leftovers_swept": leftovers,
        "seconds": round(time.monotonic() - started, 1),
        "docker": client.version().get("Version"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": config.cpus,
        "tree_files": TREE_DIRS * FILES_PER_DIR * 2,
        "rows": [asdict(r) for r in rows],
    }


def _num(value: float | None, unit: str = "ms") -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if unit == "MiB/s" or value >= 100 else f"{value:.2f}"


_TITLES = {
    "execute": "1. execute: exec helper vs a fresh docker exec (ms)",
    "file ops": "2. file operations (ms), speedup = deepagents p50 / ours p50",
    "transfer": "3. transfers (MiB/s; p90 = throughput at the p90 time, the slow end)",
    "create": "4. cold create (ms)",
    "pool": "5. warm pool acquisition (ms)",
    "fallback": "6. images without python3: one docker exec per command (ms), speedup = our execute p50 / the op's",
}


def _aligned(lines: Sequence[tuple[str, ...]]) -> list[str]:
    """Text columns left-aligned, numbers right-aligned, a rule under the header."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    text = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
            for line in lines]  # fmt: skip
    return [text[0], "-" * len(text[0]), *text[1:]]


def format_table(report: Mapping[str, Any]) -> str:
    header = ("op", "baseline", "ours p50", "p90", "base p50", "p90", "speedup", "trips ours/base", "target", "met")
    out = [f"DockerSandbox on {report['image']} (docker {report['docker']}, {report['cpus']:g} cpu per sandbox), "
           f"{report['iterations']} iterations per latency op, {report['heavy_iterations']} per transfer/create, "
           f"{report['tree_files']}-file tree, Python {report['python']}, {report['seconds']} s"]  # fmt: skip
    for section, title in _TITLES.items():
        rows = [r for r in report["rows"] if r["section"] == section]
        lines = [header]
        for r in rows:
            trips = "/".join("-" if t is None else f"{t:g}" for t in (r["ours_trips"], r["base_trips"]))
            speedup = "-" if r["speedup"] is None else f"{r['speedup']:.{0 if r['speedup'] >= 100 else 2}f}x"
            met = "-" if r["met"] is None else ("yes" if r["met"] else "NO")
            lines.append((r["op"], r["baseline"], _num(r["ours_p50"], r["unit"]), _num(r["ours_p90"], r["unit"]),
                          _num(r["base_p50"], r["unit"]), _num(r["base_p90"], r["unit"]), speedup, trips,
                          r["target"] or "-", met))  # fmt: skip
        notes = [f"  note: {r['op']}: {r['note']}" for r in rows if r["note"]]
        out += ["", title, *_aligned(lines), *notes]
    out += ["", "speedup = baseline p50 time / our p50 time: above 1x we are faster. trips: our execute() calls "
            "(transfers add one archive call) / the baseline's Docker API calls, per operation"]  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=30, help="timed calls per latency op and side (default 30)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls first (default 2)")
    parser.add_argument(
        "--heavy-iterations",
        type=int,
        default=None,
        help="timed 64 MiB transfers and cold creates per side (default: iterations, at most 5)",
    )
    parser.add_argument("--owner", default=None, help="owner label of every container made (default: unique)")
    parser.add_argument("--image", default=IMAGE, help=f"sandbox image (default {IMAGE})")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--save", metavar="PATH", help="also write the JSON report to PATH")
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.warmup < 0 or (args.heavy_iterations is not None and args.heavy_iterations < 1):
        parser.error("--iterations and --heavy-iterations must be >= 1, --warmup >= 0")
    host = machine()  # before the run loads the machine
    report = run(args.iterations, args.warmup, args.heavy_iterations, args.owner, args.image)
    report["machine"] = host
    save_report(report, args.save)
    print(json.dumps(report, indent=2) if args.json else f"{host}\n{format_table(report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
