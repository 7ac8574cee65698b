"""The E2B SDK against the service's E2B-compatible API, beside the service's own client.

One run, one service (a subprocess, as deployed: ``python -m sandboxes.server``, the Docker
backend when an engine answers, else local) and one sandbox per side of the same template,
times the same operations, one client, calls in sequence, the two sides alternating call by
call so that drift in the machine's load hits both alike:

* ``run true``: ``commands.run("true")`` (envd's ``process.Process/Start``, a Connect stream)
  beside ``RemoteSandbox.execute("true")`` (``POST /v1/.../execute``);
* ``write 1 KiB``: ``files.write`` (``POST /files``, multipart) beside ``upload_files``;
* ``read 1 KiB``: ``files.read(format="bytes")`` (``GET /files``) beside ``download_files``;
* ``list a dir``: ``files.list`` (``filesystem.Filesystem/ListDir``) beside ``ls``;
* a reference row, ``run true, as E2B runs it``: the SDK's ``commands.run("true")`` beside the
  service's client running the command that starts, ``/bin/bash -l -c true`` (a login shell),
  in the same sandbox: the two routes' own cost, the login shell's apart.

Each row gives p50 and p99 per call on both sides (ms) and the ratio of the p50s (E2B over
ours); the target, reported and never asserted, is a ratio <= 1.5. On Docker the E2B side's
sandbox is E2B's ``base`` as deployed (``scripts/demo.sh``): the ``sandboxes/e2b`` image in
``/home/user``; ours is the service's default template (``sandboxes/runtime``). ``--profile`` then runs
``commands.run("true")`` under cProfile in this process (the SDK's side) and prints where its
time goes, so the cost of the E2B path can be told apart from the service's.

    python benchmarks/bench_e2b.py [--iterations N] [--warmup N] [--backend docker|local]
        [--image IMAGE] [--e2b-image IMAGE] [--owner LABEL] [--json] [--save report.json] [--profile]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import cProfile
import io
import json
import platform
import pstats
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import machine, percentile, save_report
from bench_service import IMAGE, _docker_available, _Service, _sweep

from sandboxes import protocol as p
from sandboxes.client import RemoteSandbox, SandboxClient

E2B_IMAGE = "sandboxes/e2b:latest"
RATIO_TARGET = 1.5
PAYLOAD = bytes(range(256)) * 4
"""The 1 KiB both sides write and read."""
OPS = ["run true", "write 1 KiB", "read 1 KiB", "list a dir"]
SAME = "run true, as E2B runs it"
"""A reference row: ``bash -l -c true`` (what the SDK's ``run true`` starts) in the E2B side's
own sandbox through the service's client, so that the two routes run the very same command."""


def _succeeded(result: p.ExecuteResponse) -> None:
    if result.exit_code != 0:
        raise RuntimeError(f"benchmark command failed: {result}")


def _ours(remote: RemoteSandbox, directory: str) -> dict[str, Callable[[], object]]:
    path = f"{directory}/ours.bin"

    def run_true() -> None:
        _succeeded(remote.execute("true"))

    def write() -> None:
        (answer,) = remote.upload_files([(path, PAYLOAD)])
        if answer.error is not None:
            raise RuntimeError(f"write failed: {answer}")

    def read() -> None:
        (answer,) = remote.download_files([path])
        if answer.content != PAYLOAD:
            raise RuntimeError(f"read failed: {answer}")

    def listing() -> None:
        if remote.ls(directory).error is not None:
            raise RuntimeError(f"ls {directory} failed")

    return dict(zip(OPS, (run_true, write, read, listing), strict=True))


def _theirs(sandbox: Any, directory: str) -> dict[str, Callable[[], object]]:
    path = f"{directory}/theirs.bin"

    def read() -> None:
        if bytes(sandbox.files.read(path, format="bytes")) != PAYLOAD:
            raise RuntimeError("read returned other bytes")

    return dict(
        zip(
            OPS,
            (
                lambda: sandbox.commands.run("true"),
                lambda: sandbox.files.write(path, PAYLOAD),
                read,
                lambda: sandbox.files.list(directory),
            ),
            strict=True,
        )
    )


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter_ns()
    call()
    return (time.perf_counter_ns() - started) / 1e6


def _row(op: str, theirs: list[float], ours: list[float]) -> dict[str, Any]:
    e2b_p50, ours_p50 = percentile(theirs, 0.5), percentile(ours, 0.5)
    ratio = e2b_p50 / ours_p50
    return {
        "op": op,
        "e2b_p50": e2b_p50,
        "e2b_p99": percentile(theirs, 0.99),
        "ours_p50": ours_p50,
        "ours_p99": percentile(ours, 0.99),
        "ratio": ratio,
        "met": ratio <= RATIO_TARGET,
    }


def _measure(
    theirs: dict[str, Callable[[], object]], ours: dict[str, Callable[[], object]], iterations: int, warmup: int
) -> list[dict[str, Any]]:
    rows = []
    for op in ours:
        for _ in range(warmup):
            theirs[op]()
            ours[op]()
        e2b_ms: list[float] = []
        ours_ms: list[float] = []
        for i in range(iterations):  # alternating which side goes first
            pair = [(theirs[op], e2b_ms), (ours[op], ours_ms)]
            for call, samples in pair if i % 2 == 0 else reversed(pair):
                samples.append(_timed(call))
        rows.append(_row(op, e2b_ms, ours_ms))
    return rows


def _profiled(call: Callable[[], object], count: int) -> str:
    """Where ``count`` calls of ``call`` spend their time in this process, top functions."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(count):
        call()
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(25)
    return text.getvalue()


def run(
    iterations: int,
    warmup: int = 5,
    backend: str | None = None,
    image: str = IMAGE,
    owner: str | None = None,
    profile: bool = False,
    e2b_image: str | None = E2B_IMAGE,
) -> dict[str, Any]:
    from e2b import Sandbox

    backend = backend or ("docker" if _docker_available() else "local")
    if backend == "local" and shutil.which("bwrap") is None:
        raise RuntimeError("the local backend isolates with bubblewrap, which is not installed")
    owner = owner or f"bench-{base64.b32encode(uuid.uuid4().bytes[:5]).decode().lower()}"
    started = time.monotonic()
    report: dict[str, Any] = {
        "backend": backend,
        "image": image if backend == "docker" else None,
        "e2b_image": e2b_image if backend == "docker" else None,
    }
    try:
        with tempfile.TemporaryDirectory(prefix="bench-e2b-") as tmp:
            templates, env = {}, {}
            if backend == "docker" and e2b_image:  # E2B's base as deployed (scripts/demo.sh): docs/e2b.md
                templates = {"e2b": {"backend": "docker", "image": e2b_image, "workdir": "/home/user"}}
                env = {"SANDBOXES_E2B_TEMPLATES": json.dumps({"base": "e2b"})}
            service = _Service(Path(tmp), backend, image, owner, 2, False, templates=templates, env=env)
            try:
                options = {"api_key": service.key, "api_url": f"{service.url}/e2b"}
                theirs = Sandbox.create(sandbox_url=f"{service.url}/e2b/envd", **options)
                with SandboxClient(service.url, service.key) as client, client.create("default") as remote:
                    home = theirs.commands.run("pwd").stdout.strip()
                    ours = _ours(remote, remote.workdir or home)
                    same = client.attach(theirs.sandbox_id)
                    ours[SAME] = lambda: _succeeded(same.execute("/bin/bash -l -c true"))
                    their_calls = _theirs(theirs, home)
                    their_calls[SAME] = their_calls["run true"]
                    rows = _measure(their_calls, ours, iterations, warmup)
                    if profile:
                        report["profile"] = _profiled(lambda: theirs.commands.run("true"), iterations)
                theirs.kill()
            finally:
                service.stop()
    finally:
        leftovers = _sweep(owner) if backend == "docker" else 0
    report.update(
        iterations=iterations,
        warmup=warmup,
        owner=owner,
        leftovers_swept=leftovers,
        seconds=round(time.monotonic() - started, 1),
        python=platform.python_version(),
        rows=rows,
    )
    return report


def format_table(report: dict[str, Any]) -> str:
    image = f" ({report['image']}; E2B's base: {report['e2b_image'] or report['image']})" if report["image"] else ""
    head = ("op", "e2b p50", "p99", "ours p50", "p99", "ratio", "target", "met")
    lines: list[tuple[str, ...]] = [head]
    for r in report["rows"]:
        numbers = (f"{r['e2b_p50']:.2f}", f"{r['e2b_p99']:.2f}", f"{r['ours_p50']:.2f}", f"{r['ours_p99']:.2f}")
        target, met = (f"<= {RATIO_TARGET}x", "yes" if r["met"] else "NO") if r["op"] in OPS else ("-", "-")
        lines.append((r["op"], *numbers, f"{r['ratio']:.2f}x", target, met))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
            for line in lines]  # fmt: skip
    title = (
        f"E2B SDK vs the service's own client, {report['backend']} backend{image}, "
        f"{report['iterations']} calls per op and side (ms), {report['seconds']} s"
    )
    out = [title, text[0], "-" * len(text[0]), *text[1:]]
    if "profile" in report:
        out += ["", "commands.run('true') in the SDK's process, by cumulative time:", report["profile"]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=200, help="timed calls per op and side (default 200)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls first (default 5)")
    parser.add_argument("--backend", choices=["docker", "local"], default=None,
                        help="default: docker when an engine answers, else local")  # fmt: skip
    parser.add_argument("--image", default=IMAGE, help=f"Docker sandbox image (default {IMAGE})")
    parser.add_argument(
        "--e2b-image", default=E2B_IMAGE, help=f"the E2B side's image on Docker (default {E2B_IMAGE}); '': --image"
    )
    parser.add_argument("--owner", default=None, help="owner label of every container made (default: unique)")
    parser.add_argument("--profile", action="store_true", help="profile commands.run('true') on the SDK's side")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--save", metavar="PATH", help="also write the JSON report to PATH")
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.warmup < 0:
        parser.error("--iterations must be >= 1, --warmup >= 0")
    host = machine()  # before the run loads the machine
    e2b_image = args.e2b_image or None
    report = run(args.iterations, args.warmup, args.backend, args.image, args.owner, args.profile, e2b_image)
    report["machine"] = host
    save_report(report, args.save)
    with contextlib.suppress(BrokenPipeError):
        print(json.dumps(report, indent=2) if args.json else f"{host}\n{format_table(report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
