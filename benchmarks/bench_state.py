"""A sandbox's state, timed beside what the same work costs without us, on one machine:

* freeze + resume: `DockerSandbox.freeze`/`thaw` beside a raw ``docker pause``/``unpause`` of
  the same container through the SDK (tried again, as `freeze` is, when the runtime gave up
  freezing on a loaded host), sides alternating; `LocalSandbox` (the jail's cgroup
  freezer, or SIGSTOP of its tree) alone, which has no engine to compare with.
* snapshot + restore of a tree of ``--mib`` MiB (64 files of random bytes) in a local sandbox,
  through the service in this process (``POST .../snapshots``, then a create from it, verified)
  beside ``tar -cf`` of the same tree to a file and ``tar -xf`` of it into a new directory.
* fork of ``--forks`` sandboxes (one snapshot, restored at once) beside as many creates from a
  snapshot one after another.
* hibernate + resume of a Docker sandbox whose workspace holds a tree of ``--mib`` MiB, through
  the service in this process (``POST .../pause`` with ``mode: hibernate``: snapshot, container
  released; ``POST .../resume``: a new container, the snapshot restored, verified) beside
  ``docker exec tar -c`` of the same tree to a file on the host and ``docker exec -i tar -x`` of
  it back into the same container, in the same run.
* restore of the same tree into a container: a create from a Docker sandbox's snapshot, less a
  plain create, beside ``tar -xf`` of that snapshot's tar in the container through ``docker
  exec -i``.

Targets (issue 33) are reported, never asserted: freeze + resume p50 <= 50 ms; snapshot +
restore and hibernate + resume within 1.5x of tar + untar; a fork within 2x of the sequential
restores.

    python benchmarks/bench_state.py [--iterations N] [--mib N] [--forks N] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from _common import machine, percentile, timed

from sandboxes.docker import DockerSandbox, DockerSandboxConfig, DockerTemplate
from sandboxes.docker.sandbox import pause_container
from sandboxes.local import LocalSandbox, LocalTemplate
from sandboxes.server.app import create_app
from sandboxes.server.auth import hash_key
from sandboxes.server.settings import ServiceSettings, TenantPolicy

IMAGE = "sandboxes/runtime:latest"
KEY = "bench-state-key-0123456789"
Row = dict[str, Any]


def _freeze_rows(iterations: int, owner: str) -> list[Row]:
    rows = []
    config = DockerSandboxConfig(image=IMAGE, owner=owner)
    with DockerSandbox.create(config) as sandbox:
        sandbox.execute("true")
        ours, raw = [], []
        for index in range(iterations):
            sides: list[tuple[list[float], Callable[[], object]]] = [
                (ours, lambda: (sandbox.freeze(), sandbox.thaw())),
                (raw, lambda: (pause_container(sandbox.container), sandbox.container.unpause())),
            ]
            for samples, work in sides if index % 2 == 0 else reversed(sides):
                samples.append(timed(work))
        rows.append(_row("docker freeze + resume", ours, raw, "docker pause + unpause"))
    with LocalSandbox.create() as local:
        local.execute("true")
        alone = [timed(lambda: (local.freeze(), local.thaw())) for _ in range(iterations)]
        rows.append(_row("local freeze + resume", alone, None, ""))
    return rows


def _row(name: str, ours: list[float], base: list[float] | None, baseline: str) -> Row:
    row: Row = {"name": name, "p50_ms": percentile(ours, 0.5), "p95_ms": percentile(ours, 0.95), "n": len(ours)}
    if base is not None:
        row.update(baseline=baseline, baseline_p50_ms=percentile(base, 0.5))
        row["ratio"] = row["p50_ms"] / row["baseline_p50_ms"]
    return row


@contextlib.contextmanager
def _service(data_dir: Path, template: Any = None, owner: str = "sandboxes-service") -> Iterator[httpx.Client]:
    policy = TenantPolicy(max_sandboxes=64, max_cpus=1024, max_memory="1t", rate=1e6, burst=10**6)
    settings = ServiceSettings(
        data_dir=data_dir,
        api_keys={hash_key(KEY): "bench"},
        tenants={"bench": policy},
        templates={"default": template or LocalTemplate(default_timeout=600)},
        owner=owner,
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the service did not start")
        time.sleep(0.02)
    try:
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=600) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(60)


def _ok(response: httpx.Response) -> Any:
    if response.status_code >= 300:
        raise RuntimeError(f"{response.request.method} {response.request.url.path}: {response.text}")
    return response.json()


def _made_tree(client: httpx.Client, mib: int) -> dict[str, Any]:
    """A new sandbox holding ``tree``: 64 files of random bytes, ``mib`` MiB in all."""
    source: dict[str, Any] = _ok(client.post("/v1/sandboxes", json={}))
    _ok(client.post(f"/v1/sandboxes/{source['id']}/execute", json={"command": _tree_command(mib), "timeout": 600}))
    return source


def _docker_rows(mib: int, scratch: Path, owner: str) -> list[Row]:
    """A restore into a container (a create from a snapshot, less a plain create) beside ``tar
    -xf`` of the snapshot's tar in the source container, through ``docker exec -i``."""
    template = DockerTemplate(backend="docker", image=IMAGE, default_timeout=600)
    with _service(scratch / "docker-service", template, owner) as client:
        source = _made_tree(client, mib)
        snapshot = _ok(client.post(f"/v1/sandboxes/{source['id']}/snapshots", json={}))
        plain = timed(lambda: _ok(client.post("/v1/sandboxes", json={})))
        restored = timed(lambda: _ok(client.post("/v1/sandboxes", json={"snapshot": snapshot["id"]})))
        tar = next((scratch / "docker-service").glob(f"snapshots/*/{snapshot['id']}/0.tar"))
        found = ["docker", "ps", "-q", "--filter", f"label=io.sandboxes.service-id={source['id']}"]
        container = subprocess.run(found, check=True, capture_output=True, text=True).stdout.split()[0]
        untar = ["docker", "exec", "-i", container, "sh", "-c", "mkdir -p untarred && tar -C untarred -xf -"]

        def raw() -> None:
            with open(tar, "rb") as stdin:
                subprocess.run(untar, stdin=stdin, check=True)

        base = timed(raw)
        row = _row(f"docker restore {mib} MiB", [restored - plain], [base], "tar -xf in it, via docker exec -i")
        row.update(create_from_snapshot_ms=restored, plain_create_ms=plain)
        for sandbox in _ok(client.get("/v1/sandboxes"))["sandboxes"]:
            client.delete(f"/v1/sandboxes/{sandbox['id']}")
    return [row]


def _state_rows(mib: int, forks: int, scratch: Path) -> list[Row]:
    with _service(scratch / "service") as client:
        source = _made_tree(client, mib)
        snapshot: dict[str, Any] = {}
        took = timed(lambda: snapshot.update(_ok(client.post(f"/v1/sandboxes/{source['id']}/snapshots", json={}))))
        restored = timed(lambda: _ok(client.post("/v1/sandboxes", json={"snapshot": snapshot["id"]})))
        base = _tar_untar(Path(source["workdir"]), scratch)
        rows = [_row(f"snapshot + restore {mib} MiB", [took + restored], [base], "tar -cf + tar -xf")]
        rows[-1].update(snapshot_ms=took, restore_ms=restored)
        one_by_one = timed(
            lambda: [_ok(client.post("/v1/sandboxes", json={"snapshot": snapshot["id"]})) for _ in range(forks)]
        )
        fork = timed(lambda: _ok(client.post(f"/v1/sandboxes/{source['id']}/fork", json={"count": forks})))
        rows.append(_row(f"fork of {forks}", [fork], [one_by_one], f"{forks} restores one after another"))
        for sandbox in _ok(client.get("/v1/sandboxes"))["sandboxes"]:
            client.delete(f"/v1/sandboxes/{sandbox['id']}")
    return rows


def _tree_command(mib: int) -> str:
    """Makes ``tree/``: 64 files of random bytes, ``mib`` MiB in all."""
    per_file = max(1, (mib << 20) // 64)
    return f"mkdir -p tree && for i in $(seq 64); do head -c {per_file} /dev/urandom > tree/f$i; done"


def _hibernate_rows(mib: int, owner: str, scratch: Path) -> list[Row]:
    template = DockerTemplate(backend="docker", image=IMAGE, default_timeout=600)
    with _service(scratch / "docker-service", template, owner) as client:
        sandbox = _ok(client.post("/v1/sandboxes", json={}))
        sid, workdir = sandbox["id"], sandbox["workdir"]
        try:
            _ok(client.post(f"/v1/sandboxes/{sid}/execute", json={"command": _tree_command(mib), "timeout": 600}))
            size = _ok(client.post(f"/v1/sandboxes/{sid}/execute", json={"command": "du -sb tree"}))["output"]
            base = _docker_tar_untar(owner, workdir, scratch)
            hibernated = timed(lambda: _ok(client.post(f"/v1/sandboxes/{sid}/pause", json={"mode": "hibernate"})))
            resumed = timed(lambda: _ok(client.post(f"/v1/sandboxes/{sid}/resume")))
            again = _ok(client.post(f"/v1/sandboxes/{sid}/execute", json={"command": "du -sb tree"}))["output"]
            if again != size:
                raise RuntimeError(f"the tree came back as {again!r}, not {size!r}")
        finally:
            client.delete(f"/v1/sandboxes/{sid}")
    row = _row(f"docker hibernate + resume {mib} MiB", [hibernated + resumed], [base], "docker exec tar -c + -x")
    row.update(hibernate_ms=hibernated, resume_ms=resumed)
    return [row]


def _docker_tar_untar(owner: str, workdir: str, scratch: Path) -> float:
    """Milliseconds of ``docker exec tar -c`` of the sandbox's ``tree`` to a file here, then
    ``docker exec -i tar -x`` of it into a new directory of the same container (removed after)."""
    listed = subprocess.run(
        ["docker", "ps", "-q", "--filter", f"label=io.sandboxes.owner={owner}"], check=True, capture_output=True
    )
    (container,) = listed.stdout.decode().split()
    archive = scratch / "docker-baseline.tar"

    def work() -> None:
        with archive.open("wb") as out:
            subprocess.run(
                ["docker", "exec", container, "tar", "-C", workdir, "-cf", "-", "tree"], check=True, stdout=out
            )
        with archive.open("rb") as source:
            untar = f"mkdir -p {workdir}/untarred && tar -C {workdir}/untarred -xf -"
            subprocess.run(["docker", "exec", "-i", container, "sh", "-c", untar], check=True, stdin=source)

    try:
        return timed(work)
    finally:
        subprocess.run(["docker", "exec", container, "rm", "-rf", f"{workdir}/untarred"], check=False)
        archive.unlink(missing_ok=True)


def _tar_untar(tree: Path, scratch: Path) -> float:
    """Milliseconds of ``tar -cf`` of ``tree`` to a file, then ``tar -xf`` of it elsewhere."""
    archive, target = scratch / "baseline.tar", scratch / "untarred"
    target.mkdir()

    def work() -> None:
        subprocess.run(["tar", "-C", str(tree), "-cf", str(archive), "."], check=True)
        subprocess.run(["tar", "-C", str(target), "-xf", str(archive)], check=True)

    try:
        return timed(work)
    finally:
        shutil.rmtree(target, ignore_errors=True)
        archive.unlink(missing_ok=True)


def format_table(rows: list[Row]) -> str:
    lines = [f"{'measure':<34} {'ours p50 ms':>12} {'baseline p50 ms':>16} {'ours/base':>10}  baseline"]
    for row in rows:
        base = row.get("baseline_p50_ms")
        ratio = f"{row['ratio']:.2f}x" if "ratio" in row else "-"
        base_text = f"{base:.1f}" if base is not None else "-"
        lines.append(f"{row['name']:<34} {row['p50_ms']:>12.1f} {base_text:>16} {ratio:>10}  {row.get('baseline', '')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=50, help="freeze + resume rounds (default 50)")
    parser.add_argument("--mib", type=int, default=100, help="size of the snapshot's tree (default 100)")
    parser.add_argument("--forks", type=int, default=10, help="sandboxes of the fork (default 10)")
    parser.add_argument("--owner", default=f"bench-state-{uuid.uuid4().hex[:6]}", help="label of what it makes")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-state-"))
    try:
        rows = _freeze_rows(args.iterations, args.owner) + _state_rows(args.mib, args.forks, scratch)
        rows += _hibernate_rows(args.mib, args.owner, scratch)
        rows += _docker_rows(args.mib, scratch, args.owner)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report = {"machine": machine(), "rows": rows}
    print(json.dumps(report, indent=2) if args.json else f"{report['machine']}\n{format_table(rows)}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
