"""SSHSandbox latency and throughput beside raw paramiko on the same SSH transport.

Everything runs against ONE ``sandboxes/ssh-vm`` container started here (port 22 bound on
loopback only, removed at the end whatever happens). The sandbox and the raw baselines share
one paramiko transport (the connection registry hands the sandbox's to the baselines), so the
rows differ only in what each side does over it:

* execute: ``SSHSandbox.execute("true")`` (exec helper; again with ``timeout=0``, which shows
  what arming a timeout costs; and without the helper, ``exec_command`` per command) beside
  (a) raw ``exec_command("true")`` on a fresh channel, (b) the BASELINE, the same command run
  by a long-lived ``sh`` on one channel (it forks ``sh -c true``, then echoes a sentinel that is
  read back): what running a command over a persistent channel costs without any helper, and
  the target's yardstick, and (c) the floor, a 1-byte echo through a long-lived ``cat``
  channel: what any request/response costs on this transport. A reference row times, ON the
  host, the spawn of ``sh -c true`` the way the exec helper spawns it: the part of execute that
  no transport can remove.
* file operations through SSHSandbox on a 200-file tree, with their ``execute`` round trips.
* 64 MiB upload/download through SSHSandbox beside raw SFTP ``putfo``/``getfo``.

Sides alternate within one loop, in a fresh random order each time (seeded: reproducible),
so machine noise hits all alike and no side always follows the same other side (with a fixed
rotation each side always came after the same neighbour: one after a channel close, say).
Targets are reported, never asserted. ``--profile N`` appends a cProfile of N execute calls
(the calling thread only: time spent in the helper shows up as waiting).

    python benchmarks/bench_ssh.py [--iterations N] [--json] [--save report.json] [--profile N]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import logging
import platform
import pstats
import random
import shlex
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import paramiko
from _common import CountingCalls, machine
from _common import ok as _ok
from _common import percentile as _percentile
from _common import scripted as _scripted
from _common import timed as _timed
from pydantic import SecretStr

from sandboxes import protocol as p
from sandboxes.ssh import SSHHostConfig, SSHSandbox, SSHSandboxConfig
from sandboxes.ssh._connection import connections

IMAGE = "sandboxes/ssh-vm:latest"
LOOPBACK = "127.0.0.1"
TREE_DIRS = 10
TREE_FILES_PER_DIR = 20  # 200 files in all
NEEDLE = "needle"
MIB = float(1 << 20)
EXECUTE_TARGET = 1.2
"""execute p50 may cost at most this many times the same command run by a raw persistent shell."""
SENTINEL = b"__sandboxes_bench_done__"
FRESH_TARGET = 0.5
"""What "well below a fresh exec_command" is taken to mean: at most half its p50."""
TRANSFER_TARGET = 0.8
"""SSHSandbox transfers should reach this fraction of raw SFTP's throughput."""

_BUILD_TREE = f"""
import os, sys
root, needle = sys.argv[1], sys.argv[2]
for d in range({TREE_DIRS}):
    directory = os.path.join(root, "d%02d" % d)
    os.makedirs(directory)
    for f in range({TREE_FILES_PER_DIR}):
        lines = ["line %d of file %d/%d\\n" % (i, d, f) for i in range(40)]
        if f % 5 == 0:
            lines[7] = "a %s in file %d/%d\\n" % (needle, d, f)
        with open(os.path.join(directory, "f%02d%s" % (f, ".py" if f % 2 == 0 else ".txt")), "w") as fh:
            fh.write("".join(lines))
"""

_HOST_SPAWN = """
import os, sys, time
env = dict(os.environ, SANDBOXES_EXEC_ID="bench")
for _ in range(int(sys.argv[1])):
    started = time.perf_counter()
    out_r, out_w = os.pipe()
    actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
               (os.POSIX_SPAWN_DUP2, out_w, 2)]
    pid = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", "true"], env, file_actions=actions, setsid=True)
    os.close(out_w)
    while os.read(out_r, 65536):
        pass
    os.close(out_r)
    os.waitpid(pid, 0)
    print((time.perf_counter() - started) * 1000)
"""
"""The exec helper's spawn of one command (`sandboxes._helper._spawn.spawn`), timed on the host."""


class CountingSSHSandbox(CountingCalls, SSHSandbox):
    """Counts its round trips (`_common.CountingCalls`)."""


@dataclass(frozen=True, slots=True)
class LatencyRow:
    op: str
    how: str
    p50_ms: float
    p90_ms: float
    round_trips: float | None = None


@dataclass(frozen=True, slots=True)
class TransferRow:
    op: str
    sandbox_mib_s: float
    raw_mib_s: float
    ratio: float
    """SSHSandbox throughput / raw SFTP throughput (p50 of each)."""
    met: bool


def _interleaved(
    sides: list[Callable[[], object]], iterations: int, warmup: int, *, settle: bool = False
) -> list[list[float]]:
    """Run the sides in turn, each round in a fresh (seeded) random order, and keep each one's samples.

    ``settle``: each turn runs its side once untimed before the timed call. What a call leaves
    behind (the exec helper sweeps /proc after its answer is out) then lands on its own side's
    next call, as in a program running commands one after another, not on whichever side
    happens to come next: measured without it, the raw shell's p50 rose 0.03-0.08 ms when it
    followed the exec helper, which flattered the ratio."""
    samples: list[list[float]] = [[] for _ in sides]
    order = random.Random(len(sides) * 1000 + iterations)
    for i in range(warmup + iterations):
        for index in order.sample(range(len(sides)), len(sides)):
            if settle:
                sides[index]()
            elapsed = _timed(sides[index])
            if i >= warmup:
                samples[index].append(elapsed)
    return samples


# --------------------------------------------------------------------------- the VM


@contextlib.contextmanager
def _ssh_vm(labels: Mapping[str, str], workdir: Path) -> Iterator[SSHHostConfig]:
    """One ssh-vm container on a loopback port, with a fresh key; removed on exit."""
    import docker

    key = paramiko.RSAKey.generate(2048)
    private = io.StringIO()
    key.write_private_key(private)
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        port = int(probe.getsockname()[1])
    client = docker.from_env()
    container = client.containers.run(
        IMAGE,
        detach=True,
        environment={"SSH_AUTHORIZED_KEYS": f"{key.get_name()} {key.get_base64()}"},
        ports={"22/tcp": (LOOPBACK, port)},
        labels={"io.sandboxes.bench": "ssh", **labels},
        cap_add=["NET_ADMIN"],  # the image firewalls its sandbox users at start
    )
    try:
        host_key = _host_key(port)
        known_hosts = workdir / "known_hosts"
        hosts = paramiko.HostKeys()
        hosts.add(f"[{LOOPBACK}]:{port}", host_key.get_name(), host_key)
        hosts.save(str(known_hosts))
        yield SSHHostConfig(host=LOOPBACK, port=port, username="sandbox", private_key=SecretStr(private.getvalue()),
                            known_hosts=known_hosts, use_agent=False, keepalive=0)  # fmt: skip
    finally:
        container.remove(force=True, v=True)


def _host_key(port: int, wait: float = 30.0) -> paramiko.PKey:
    """The server's host key, once sshd answers (it starts after the container)."""
    quiet = logging.getLogger("paramiko")
    level, quiet.level = quiet.level, logging.CRITICAL  # banner errors while sshd starts are expected
    deadline = time.monotonic() + wait
    try:
        while True:
            transport = paramiko.Transport((LOOPBACK, port))
            try:
                transport.start_client(timeout=5)
                return transport.get_remote_server_key()
            except (paramiko.SSHException, OSError, EOFError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
            finally:
                transport.close()
    finally:
        quiet.setLevel(level)


# --------------------------------------------------------------------------- execute


class _Raw:
    """Raw paramiko on the sandbox's own transport."""

    def __init__(self, transport: paramiko.Transport) -> None:
        self.transport = transport
        self.cat = transport.open_session()
        self.cat.exec_command("cat")
        self.shell = transport.open_session()
        self.shell.exec_command("sh")

    def fresh_exec(self) -> None:
        channel = self.transport.open_session()
        try:
            channel.exec_command("true")
            if channel.recv_exit_status() != 0:
                raise RuntimeError("raw exec_command('true') failed")
        finally:
            channel.close()

    def echo(self) -> None:
        self.cat.sendall(b"x")
        if self.cat.recv(1) != b"x":
            raise RuntimeError("the cat channel did not echo")

    def shell_command(self) -> None:
        """``sh -c true`` forked by the long-lived shell, then the sentinel it echoes, read back."""
        self.shell.sendall(b"sh -c true; echo " + SENTINEL + b"\n")
        got = b""
        while not got.endswith(SENTINEL + b"\n"):
            chunk = self.shell.recv(4096)
            if not chunk:
                raise RuntimeError(f"the persistent shell ended: {got!r}")
            got += chunk
        if got != SENTINEL + b"\n":
            raise RuntimeError(f"the persistent shell said more than the sentinel: {got!r}")

    def close(self) -> None:
        self.cat.close()
        self.shell.close()


def _execute_rows(sandbox: SSHSandbox, plain: SSHSandbox, raw: _Raw, iterations: int, warmup: int) -> list[LatencyRow]:
    sides: list[tuple[str, str, Callable[[], object]]] = [
        ("execute", "SSHSandbox.execute('true'), exec helper", lambda: _ok(sandbox.execute("true"))),
        ("execute (timeout=0)", "the same without a timeout: what arming the timeout costs",
         lambda: _ok(sandbox.execute("true", timeout=0))),
        ("execute (no helper)", "SSHSandbox.execute('true'), exec_command per call",
         lambda: _ok(plain.execute("true"))),
        ("raw fresh channel", "paramiko open_session + exec_command('true') + recv_exit_status",
         raw.fresh_exec),
        ("raw persistent shell", "a long-lived `sh` on one channel runs `sh -c true; echo SENTINEL` (baseline)",
         raw.shell_command),
        ("raw persistent channel", "paramiko 1-byte echo on a long-lived `cat` channel (floor)", raw.echo),
    ]  # fmt: skip
    samples = _interleaved([fn for _, _, fn in sides], iterations, warmup, settle=True)
    rows = [LatencyRow(op, how, statistics.median(times), _percentile(times, 0.9))
            for (op, how, _), times in zip(sides, samples, strict=True)]  # fmt: skip
    spawned = _ok(sandbox.execute(f"python3 -c {shlex.quote(_HOST_SPAWN)} {warmup + iterations}"))
    assert isinstance(spawned, p.ExecuteResponse)
    host = [float(line) for line in spawned.output.split()][warmup:]
    rows.append(LatencyRow("host spawn", "on the host: posix_spawn('sh -c true') + wait, as the exec helper does",
                           statistics.median(host), _percentile(host, 0.9)))  # fmt: skip
    return rows


# --------------------------------------------------------------------------- file operations


def _toggle(edit: Callable[[str, str], object]) -> Callable[[], object]:
    """An edit that flips a word back and forth, so every call has exactly one match."""
    state = {"flipped": False}

    def run() -> object:
        old, new = ("omega", "alpha") if state["flipped"] else ("alpha", "omega")
        state["flipped"] = not state["flipped"]
        return edit(old, new)

    return run


def _file_rows(sandbox: CountingSSHSandbox, iterations: int, warmup: int) -> list[LatencyRow]:
    work, tree = sandbox.workspace, f"{sandbox.workspace}/tree"
    _ok(sandbox.execute(f"python3 -c {shlex.quote(_BUILD_TREE)} {tree} {NEEDLE}"))
    _ok(sandbox.write(f"{work}/edit.txt", "".join(f"line {i}\n" for i in range(100)) + "the alpha word\n"))
    _ok(sandbox.write(f"{work}/read.txt", "".join(f"line {i} with some text\n" for i in range(200))))
    text = "x" * 1000 + "\n"
    cases: list[tuple[str, Callable[[], object], Callable[[], object] | None]] = [
        ("ls", lambda: _ok(sandbox.ls(f"{tree}/d00")), None),
        ("ls (scripts)", _scripted(sandbox, lambda: _ok(sandbox.ls(f"{tree}/d00"))), None),
        ("read", lambda: _ok(sandbox.read(f"{work}/read.txt")), None),
        ("write", lambda: _ok(sandbox.write(f"{work}/written.txt", text)), None),
        ("edit", _toggle(lambda old, new: _ok(sandbox.edit(f"{work}/edit.txt", old, new))), None),
        ("delete", lambda: _ok(sandbox.delete(f"{work}/doomed.txt")),
         lambda: _ok(sandbox.write(f"{work}/doomed.txt", "bye\n"))),
        ("delete (scripts)", _scripted(sandbox, lambda: _ok(sandbox.delete(f"{work}/doomed.txt"))),
         lambda: _ok(sandbox.write(f"{work}/doomed.txt", "bye\n"))),
        ("grep", lambda: _ok(sandbox.grep(NEEDLE, tree)), None),
        ("glob", lambda: _ok(sandbox.glob("*.py", tree)), None),
    ]  # fmt: skip
    rows = []
    for op, fn, setup in cases:
        samples, calls = [], 0
        for i in range(warmup + iterations):
            if setup:
                setup()
            before = sandbox.calls
            elapsed = _timed(fn)
            if i >= warmup:
                samples.append(elapsed)
                calls += sandbox.calls - before
        rows.append(LatencyRow(op, "SSHSandbox", statistics.median(samples), _percentile(samples, 0.9),
                               calls / iterations))  # fmt: skip
    return rows


# --------------------------------------------------------------------------- transfers


def _transfer_rows(sandbox: SSHSandbox, transport: paramiko.Transport, size: int, iterations: int) -> list[TransferRow]:
    blob = (uuid.uuid4().bytes * (size // 16 + 1))[:size]
    # Raw SFTP runs as the login user, who may not enter an isolated sandbox's workspace.
    ours_path, raw_path = f"{sandbox.workspace}/up-ours.bin", f"/tmp/up-raw-{uuid.uuid4().hex}.bin"
    sftp = paramiko.SFTPClient.from_transport(transport)
    if sftp is None:
        raise RuntimeError("the server refused an SFTP session")

    def download_ours() -> None:
        got = _ok(sandbox.download_files([ours_path]))
        assert isinstance(got, list)
        if got[0].content != blob:
            raise RuntimeError("SSHSandbox download returned other bytes")

    def download_raw() -> None:
        sink = io.BytesIO()
        sftp.getfo(raw_path, sink)
        if sink.getvalue() != blob:
            raise RuntimeError("SFTP getfo returned other bytes")

    try:
        up = _interleaved([lambda: _ok(sandbox.upload_files([(ours_path, blob)])),
                           lambda: sftp.putfo(io.BytesIO(blob), raw_path, file_size=size)], iterations, 0)  # fmt: skip
        down = _interleaved([download_ours, download_raw], iterations, 0)
    finally:
        with contextlib.suppress(OSError):
            sftp.remove(raw_path)
        sftp.close()
    rows = []
    for op, (ours, raw) in (("upload_files", up), ("download_files", down)):
        ours_rate, raw_rate = (size / MIB / (statistics.median(side) / 1000) for side in (ours, raw))
        ratio = ours_rate / raw_rate
        rows.append(TransferRow(f"{op} {size >> 20}MiB", ours_rate, raw_rate, ratio, ratio >= TRANSFER_TARGET))
    return rows


# --------------------------------------------------------------------------- profile


def _profile(sandbox: SSHSandbox, calls: int, top: int) -> str:
    """cProfile of ``execute('true')``: where the client's time goes (threads other than the
    caller are not profiled; their work shows up as the caller's wait)."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        sandbox.execute("true")
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


# --------------------------------------------------------------------------- run and report


def run(
    iterations: int,
    warmup: int = 3,
    transfer_iterations: int = 5,
    transfer_bytes: int = 64 << 20,
    labels: Mapping[str, str] | None = None,
    profile: int = 0,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-ssh-") as tmp, _ssh_vm(labels or {}, Path(tmp)) as host:
        sandbox = CountingSSHSandbox.create(SSHSandboxConfig(host=host))
        plain = SSHSandbox.attach(SSHSandboxConfig(host=host, use_exec_helper=False), sandbox.workspace)
        connection = connections.acquire(host)  # the registry's shared one: the sandboxes' transport
        raw = _Raw(connection.transport())
        try:
            assert isinstance(sandbox, CountingSSHSandbox)
            execute = _execute_rows(sandbox, plain, raw, iterations, warmup)
            files = _file_rows(sandbox, iterations, warmup)
            transfers = _transfer_rows(sandbox, connection.transport(), transfer_bytes, transfer_iterations)
            profiled = _profile(sandbox, profile, 25) if profile else None
        finally:
            raw.close()
            connections.release(connection)
            plain.close()
            sandbox.destroy()
    by_op = {row.op: row for row in execute}
    floor, fresh = by_op["raw persistent channel"].p50_ms, by_op["raw fresh channel"].p50_ms
    shell, ours = by_op["raw persistent shell"].p50_ms, by_op["execute"].p50_ms
    return {
        "iterations": iterations,
        "transfer_iterations": transfer_iterations,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "tree_files": TREE_DIRS * TREE_FILES_PER_DIR,
        "execute": [asdict(r) for r in execute],
        "targets": {
            "execute_vs_shell": ours / shell,
            "execute_vs_shell_met": ours / shell <= EXECUTE_TARGET,
            "execute_vs_persistent": ours / floor,
            "execute_vs_fresh": ours / fresh,
            "execute_vs_fresh_met": ours / fresh <= FRESH_TARGET,
            "execute_vs_round_trip_plus_spawn": ours / (floor + by_op["host spawn"].p50_ms),
        },
        "file_ops": [asdict(r) for r in files],
        "transfers": [asdict(r) for r in transfers],
        "profile": profiled,
    }


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = [header, *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
            for line in lines]  # fmt: skip
    text.insert(1, "-" * len(text[0]))
    return text


def format_table(report: Mapping[str, Any]) -> str:
    execute = {r["op"]: r for r in report["execute"]}
    ours = execute["execute"]["p50_ms"]
    targets = report["targets"]
    out = [f"SSHSandbox over paramiko, one ssh-vm container on loopback, {report['iterations']} iterations, "
           f"Python {report['python']}",
           "", "1. execute"]  # fmt: skip
    out += _table(("op", "how", "p50 ms", "p90 ms", "execute / this"),
                  [(r["op"], r["how"], f"{r['p50_ms']:.3f}", f"{r['p90_ms']:.3f}", f"{ours / r['p50_ms']:.2f}x")
                   for r in report["execute"]])  # fmt: skip
    out.append(f"target: execute p50 <= {EXECUTE_TARGET}x the same command on a raw persistent shell: "
               f"{targets['execute_vs_shell']:.2f}x {_verdict(targets['execute_vs_shell_met'])}")  # fmt: skip
    out.append(f"target: execute p50 <= {FRESH_TARGET}x a fresh exec_command: {targets['execute_vs_fresh']:.2f}x "
               f"{_verdict(targets['execute_vs_fresh_met'])}")  # fmt: skip
    out.append(f"context: execute p50 / persistent-channel 1-byte echo = {targets['execute_vs_persistent']:.2f}x "
               "(no command can get near this floor)")  # fmt: skip
    out.append(f"context: execute p50 / (persistent round trip + host spawn p50) = "
               f"{targets['execute_vs_round_trip_plus_spawn']:.2f}x (what a command cannot avoid)")  # fmt: skip
    out += ["", f"2. file operations ({report['tree_files']}-file tree)"]
    out += _table(("op", "how", "round trips", "p50 ms", "p90 ms", "floor ms"),
                  [(r["op"], r["how"], f"{r['round_trips']:g}", f"{r['p50_ms']:.2f}", f"{r['p90_ms']:.2f}",
                    f"{r['round_trips'] * ours:.2f}") for r in report["file_ops"]])  # fmt: skip
    out.append("floor = round trips x execute p50")
    out += ["", f"3. transfers (p50 of {report['transfer_iterations']})"]
    out += _table(("op", "vs", "SSHSandbox MiB/s", "raw MiB/s", "ratio", "target"),
                  [(r["op"], "SFTP putfo/getfo", f"{r['sandbox_mib_s']:.1f}", f"{r['raw_mib_s']:.1f}",
                    f"{r['ratio']:.2f}x", f">= {TRANSFER_TARGET}x {_verdict(r['met'])}")
                   for r in report["transfers"]])  # fmt: skip
    if report.get("profile"):
        out += ["", "4. cProfile of execute('true') (calling thread)", report["profile"]]
    return "\n".join(out)


def _verdict(met: bool) -> str:
    return "MET" if met else "MISSED"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=200, help="timed calls per latency row (default 200)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    parser.add_argument("--transfer-iterations", type=int, default=5, help="timed transfers per side (default 5)")
    parser.add_argument("--transfer-mib", type=int, default=64, help="transfer size in MiB, > 1 (default 64)")
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                        help="extra label on the container (tests add their session label)")  # fmt: skip
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="also cProfile N execute calls")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--save", type=Path, metavar="PATH", help="also write the JSON report to PATH")
    args = parser.parse_args(argv)
    if min(args.iterations, args.transfer_iterations) < 1 or args.warmup < 0 or args.transfer_mib < 2:
        parser.error("iterations must be >= 1, --warmup >= 0, --transfer-mib >= 2 (SFTP starts above 1 MiB)")
    if any("=" not in label for label in args.label):
        parser.error("--label takes KEY=VALUE")
    labels = dict(label.split("=", 1) for label in args.label)
    host = machine()  # before the run loads the machine
    report = run(args.iterations, args.warmup, args.transfer_iterations, args.transfer_mib << 20, labels,
                 args.profile)  # fmt: skip
    if args.save is not None:
        args.save.write_text(json.dumps(report, indent=2), encoding="utf-8")
    report["machine"] = host
    print(json.dumps(report, indent=2) if args.json else f"{host}\n{format_table(report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
