"""Throughput and per-request latency of a port relayed by the exec helper (`sandboxes.ports`)
beside a direct loopback connection to the same server code, in the same run; and 20 sandboxes
relaying at once.

The server (`SERVER`, stdlib Python) runs INSIDE a LocalSandbox's bubblewrap jail, whose only
network is its own loopback, and is reached through the relay; the same server runs on the
host's loopback for the direct baseline. Targets (issue #34): throughput >= 0.5x direct, and
<= 1 ms added per request.

    python benchmarks/bench_ports.py [--size-mib N] [--iterations N] [--sandboxes N] [--json]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from _common import machine, percentile

from sandboxes.jobs import JobRunner
from sandboxes.local import LocalSandbox, LocalSandboxConfig
from sandboxes.ports import PortRefused, connect_port

PORT = 8765
SERVER = r"""
import socket, socketserver, struct, sys
BLOCK = b"x" * (1 << 20)
class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        conn = self.request
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = b""
        while len(head) < 9:
            part = conn.recv(9 - len(head))
            if not part:
                return
            head += part
        kind, size = head[:1], struct.unpack(">Q", head[1:])[0]
        if kind == b"G":  # send size bytes, then close
            while size:
                sent = conn.send(BLOCK[: min(size, len(BLOCK))])
                size -= sent
        elif kind == b"P":  # take size bytes, then answer one
            while size:
                part = conn.recv(min(size, 1 << 16))
                if not part:
                    return
                size -= len(part)
            conn.sendall(b"k")
        elif kind == b"E":  # echo until the end
            while True:
                part = conn.recv(1 << 16)
                if not part:
                    return
                conn.sendall(part)
class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 128
Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


class Conn(Protocol):
    def sendall(self, data: bytes) -> None: ...

    def recv(self, size: int) -> bytes: ...

    def close(self) -> None: ...


Connect = Callable[[], Conn]


def _direct(port: int) -> Connect:
    def connect() -> Conn:
        conn = socket.create_connection(("127.0.0.1", port))
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    return connect


def _relayed(sandbox: LocalSandbox) -> Connect:
    return lambda: connect_port(sandbox, PORT, timeout=60)


def _exactly(conn: Conn, size: int) -> None:
    while size:
        part = conn.recv(min(size, 1 << 16))
        if not part:
            raise RuntimeError("the connection ended early")
        size -= len(part)


def _download(connect: Connect, size: int) -> float:
    """Seconds to receive ``size`` bytes on a fresh connection."""
    conn = connect()
    try:
        started = time.perf_counter()
        conn.sendall(b"G" + struct.pack(">Q", size))
        total = 0
        while part := conn.recv(1 << 16):
            total += len(part)
        if total != size:
            raise RuntimeError(f"received {total} of {size} bytes")
        return time.perf_counter() - started
    finally:
        conn.close()


def _upload(connect: Connect, size: int) -> float:
    conn = connect()
    block = b"y" * (1 << 16)
    try:
        started = time.perf_counter()
        conn.sendall(b"P" + struct.pack(">Q", size))
        left = size
        while left:
            conn.sendall(block[: min(left, len(block))])
            left -= min(left, len(block))
        _exactly(conn, 1)
        return time.perf_counter() - started
    finally:
        conn.close()


def _round_trips(connect: Connect, iterations: int, size: int = 1024) -> list[float]:
    """Milliseconds per request/response of ``size`` bytes each way on one kept-alive connection."""
    conn = connect()
    payload = b"r" * size
    try:
        conn.sendall(b"E" + struct.pack(">Q", 0))
        samples = []
        for _ in range(iterations):
            started = time.perf_counter_ns()
            conn.sendall(payload)
            _exactly(conn, size)
            samples.append((time.perf_counter_ns() - started) / 1e6)
        return samples
    finally:
        conn.close()


def _fresh_requests(connect: Connect, iterations: int) -> list[float]:
    """Milliseconds per connection opened, one 1 KiB request answered, and closed."""
    samples = []
    for _ in range(iterations):
        started = time.perf_counter_ns()
        conn = connect()
        conn.sendall(b"E" + struct.pack(">Q", 0) + b"q" * 1024)
        _exactly(conn, 1024)
        conn.close()
        samples.append((time.perf_counter_ns() - started) / 1e6)
    return samples


def _at_once(connects: list[Connect], size: int) -> float:
    """Aggregate MB/s of one ``size`` download per connect, all at once."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(connects) + 1)

    def one(connect: Connect) -> None:
        try:
            barrier.wait()
            _download(connect, size)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(connect,)) for connect in connects]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return len(connects) * size / (time.perf_counter() - started) / 1e6


def _serve_inside(sandbox: LocalSandbox) -> str:
    sandbox.upload_files([(f"{sandbox.root}/bench_server.py", SERVER.encode())])
    job = JobRunner(sandbox).start(f"exec python3 bench_server.py {PORT}", cwd=str(sandbox.root))
    deadline = time.monotonic() + 30
    while True:
        try:
            connect_port(sandbox, PORT, timeout=10).close()
            return job.id
        except PortRefused:
            if time.monotonic() > deadline:
                raise RuntimeError("the server in the sandbox never listened") from None
            time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _rates(connect: Connect, measure: Callable[[Connect, int], float], size: int, iterations: int) -> float:
    """Median MB/s over ``iterations`` transfers of ``size`` bytes."""
    return statistics.median(size / measure(connect, size) / 1e6 for _ in range(iterations))


def run(size: int, iterations: int, sandboxes: int, root: Path) -> dict[str, Any]:
    host_port = _free_port()
    host_server = subprocess.Popen([sys.executable, "-c", SERVER, str(host_port)])
    made: list[LocalSandbox] = []
    try:
        _wait_listening(host_port)
        for index in range(max(1, sandboxes)):
            sandbox = LocalSandbox.create(LocalSandboxConfig(root_dir=root / f"s{index}", isolation="bwrap"))
            made.append(sandbox)
            _serve_inside(sandbox)
        direct, relay = _direct(host_port), _relayed(made[0])
        rows = []
        for name, measure in (("download", _download), ("upload", _upload)):
            _rates(relay, measure, size, 1)  # warm
            r, d = _rates(relay, measure, size, iterations), _rates(direct, measure, size, iterations)
            rows.append({"measure": f"{name} {size >> 20} MiB", "unit": "MB/s", "relay": r, "direct": d,
                         "ratio": r / d, "added_ms": None})  # fmt: skip
        requests = max(iterations * 20, 50)
        for name, measure in (
            ("1 KiB round trip, kept alive", _round_trips),
            ("new connection + 1 KiB", _fresh_requests),
        ):
            relay_ms, direct_ms = measure(relay, requests), measure(direct, requests)
            r50, d50 = statistics.median(relay_ms), statistics.median(direct_ms)
            rows.append({"measure": name, "unit": "ms p50", "relay": r50, "direct": d50, "ratio": r50 / d50,
                         "added_ms": r50 - d50, "relay_p90": percentile(relay_ms, 0.9),
                         "direct_p90": percentile(direct_ms, 0.9)})  # fmt: skip
        each = max(1 << 20, size // 4)
        r = _at_once([_relayed(sandbox) for sandbox in made], each)
        d = _at_once([direct] * len(made), each)
        rows.append({"measure": f"{len(made)} sandboxes at once, {each >> 20} MiB each", "unit": "MB/s total",
                     "relay": r, "direct": d, "ratio": r / d, "added_ms": None})  # fmt: skip
        return {"size": size, "iterations": iterations, "sandboxes": len(made), "rows": rows}
    finally:
        for sandbox in made:
            sandbox.destroy()
        host_server.kill()
        host_server.wait()


def format_table(report: Mapping[str, Any]) -> str:
    header = ("measure", "unit", "relay", "direct", "relay/direct", "added ms")
    lines = [header]
    for r in report["rows"]:
        added = "-" if r["added_ms"] is None else f"{r['added_ms']:.3f}"
        lines.append((r["measure"], r["unit"], f"{r['relay']:.2f}", f"{r['direct']:.2f}", f"{r['ratio']:.2f}x", added))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
            for line in lines]  # fmt: skip
    text.insert(1, "-" * len(text[0]))
    summary = (f"port relay through the exec helper (LocalSandbox, bwrap) beside direct loopback, "
               f"{report['iterations']} iterations, {report['sandboxes']} sandboxes")  # fmt: skip
    return "\n".join([summary, *text])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size-mib", type=int, default=64, help="bytes per transfer, MiB (default 64)")
    parser.add_argument("--iterations", type=int, default=5, help="transfers per measure and side (default 5)")
    parser.add_argument("--sandboxes", type=int, default=20, help="sandboxes relaying at once (default 20)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if args.size_mib < 1 or args.iterations < 1 or args.sandboxes < 1:
        parser.error("--size-mib, --iterations and --sandboxes must be >= 1")
    host = machine()
    with tempfile.TemporaryDirectory(prefix="bench-ports-") as root:
        report = run(args.size_mib << 20, args.iterations, args.sandboxes, Path(root))
    report["machine"] = host
    print(json.dumps(report, indent=2) if args.json else f"{host}\n{format_table(report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
