"""The egress proxy over real sockets on loopback: forwarded requests get the tenant's
credentials, tunnels pass any bytes, a refused destination fails fast with the reason and is
never connected to, and a change of the allow-list applies to the next connection. Targets are
servers this test starts on 127.0.0.2 and 127.0.0.3."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from sandboxes.server.egress import ByteRate, Credential, EgressContext, EgressPolicy, EgressProxy
from sandboxes.server.egress.rate import RelayLimits


@dataclass
class Target:
    """An HTTP server on a loopback address that records what reached it."""

    host: str
    server: ThreadingHTTPServer
    seen: list[dict[str, str]] = field(default_factory=list)
    connections: int = 0

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])


def _target(host: str) -> Iterator[Target]:
    record: list[Target] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            record[0].seen.append({k.lower(): v for k, v in self.headers.items()} | {"path": self.path})
            body = (
                b"x" * int(self.path.rsplit("/", 1)[-1])
                if self.path.startswith("/bytes/")
                else b"hello from " + host.encode()
            )
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

    class Counting(ThreadingHTTPServer):
        def verify_request(self, request: Any, client_address: Any) -> bool:
            record[0].connections += 1
            return True

    server = Counting((host, 0), Handler)
    server.daemon_threads = True
    record.append(Target(host, server))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield record[0]
    server.shutdown()
    server.server_close()


@pytest.fixture
def allowed() -> Iterator[Target]:
    yield from _target("127.0.0.2")


@pytest.fixture
def refused() -> Iterator[Target]:
    yield from _target("127.0.0.3")


@dataclass
class Proxy:
    url: str
    policy: list[EgressPolicy]


@contextlib.contextmanager
def _serving(*contexts: Callable[[], EgressContext]) -> Iterator[list[str]]:
    """One proxy server per context (each made on the proxies' event loop), their URLs."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        egress = EgressProxy(connect_timeout=5)
        servers = []
        for make in contexts:
            context = make()
            servers.append(await asyncio.start_server(functools.partial(egress.serve, context=context), "127.0.0.1", 0))
        box["urls"] = [f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}" for server in servers]
        box["stop"] = asyncio.Event()
        ready.set()
        await box["stop"].wait()
        for server in servers:
            server.close()
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:  # connections still being served
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield box["urls"]
    loop.call_soon_threadsafe(box["stop"].set)
    thread.join(10)
    loop.close()


@pytest.fixture
def proxy(allowed: Target) -> Iterator[Proxy]:
    policy = [EgressPolicy(allow=[f"127.0.0.2:{allowed.port}"], open_ranges=["127.0.0.0/8"])]

    def context() -> EgressContext:
        return EgressContext(
            sandbox="sbx-1",
            tenant="alice",
            policy=lambda: policy[0],
            credentials=[Credential(host="127.0.0.2", headers={"Authorization": "Bearer secret-token"})],
        )

    with _serving(context) as urls:
        yield Proxy(urls[0], policy)


def test_a_forwarded_request_carries_the_tenants_credentials(proxy: Proxy, allowed: Target) -> None:
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        answer = client.get(f"http://127.0.0.2:{allowed.port}/hello", headers={"Authorization": "Bearer forged"})
        big = client.get(f"http://127.0.0.2:{allowed.port}/bytes/{5 << 20}")
    assert answer.status_code == 200
    assert answer.text == "hello from 127.0.0.2"
    assert allowed.seen[0]["authorization"] == "Bearer secret-token"  # the sandbox's own is replaced
    assert allowed.seen[0]["path"] == "/hello"
    assert "proxy-authorization" not in allowed.seen[0]
    assert len(big.content) == 5 << 20


def test_a_tunnel_passes_bytes_both_ways(proxy: Proxy, allowed: Target) -> None:
    port = int(proxy.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"CONNECT 127.0.0.2:{allowed.port} HTTP/1.1\r\nHost: 127.0.0.2\r\n\r\n".encode())
        head = sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /through HTTP/1.1\r\nHost: 127.0.0.2\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.endswith(b"hello from 127.0.0.2")
    assert "authorization" not in allowed.seen[0]  # a tunnel is passed through untouched


def test_refused_destinations_fail_fast_with_a_reason_and_are_never_reached(
    proxy: Proxy, allowed: Target, refused: Target
) -> None:
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        other_host = client.get(f"http://127.0.0.3:{allowed.port}/")
        other_port = client.get(f"http://127.0.0.2:{refused.port}/")
        metadata = client.get("http://169.254.169.254/latest/meta-data/")
    assert other_host.status_code == 403
    assert "not in the sandbox's allow-list" in other_host.text
    assert other_port.status_code == 403
    assert f"no rule allows port {refused.port}" in other_port.text
    assert metadata.status_code == 403
    assert refused.connections == 0
    port = int(proxy.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"CONNECT 127.0.0.3:{refused.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert sock.recv(4096).startswith(b"HTTP/1.1 403")
    assert refused.connections == 0


def test_a_change_of_the_allow_list_applies_to_the_next_connection(
    proxy: Proxy, allowed: Target, refused: Target
) -> None:
    with httpx.Client(proxy=proxy.url, timeout=10) as client:
        assert client.get(f"http://127.0.0.3:{refused.port}/").status_code == 403
        proxy.policy[0] = EgressPolicy(allow=[f"127.0.0.3:{refused.port}"], open_ranges=["127.0.0.0/8"])
        assert client.get(f"http://127.0.0.3:{refused.port}/").text == "hello from 127.0.0.3"
        assert client.get(f"http://127.0.0.2:{allowed.port}/").status_code == 403


def test_what_is_not_a_proxy_request_is_refused(proxy: Proxy) -> None:
    direct = httpx.get(f"{proxy.url}/not-absolute", timeout=10)
    assert direct.status_code == 400


def _tunnel_open(port: int, target: Target) -> socket.socket:
    """A CONNECT tunnel through the proxy on ``port`` to ``target``, once established."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"CONNECT {target.host}:{target.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    return sock


def test_a_connection_past_the_sandboxs_cap_is_refused_503_and_one_is_taken_again_once_another_closed(
    allowed: Target,
) -> None:
    policy = EgressPolicy(allow=[f"127.0.0.2:{allowed.port}"], open_ranges=["127.0.0.0/8"])

    def capped() -> EgressContext:
        return EgressContext(sandbox="capped", tenant="alice", policy=lambda: policy, limits=RelayLimits(2))

    url = f"http://127.0.0.2:{allowed.port}/hello"
    with _serving(capped) as (proxy_url,):
        port = int(proxy_url.rsplit(":", 1)[1])
        first, second = _tunnel_open(port, allowed), _tunnel_open(port, allowed)
        with httpx.Client(proxy=proxy_url, timeout=10) as client:
            refused = client.get(url)
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            assert "2 relayed connections open" in refused.text
            with socket.create_connection(("127.0.0.1", port), timeout=10) as third:
                third.sendall(f"CONNECT 127.0.0.2:{allowed.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                assert third.recv(4096).startswith(b"HTTP/1.1 503")
            assert allowed.connections == 2  # the refused ones never reached the destination
            first.close()
            deadline = time.monotonic() + 10
            while (answer := client.get(url)).status_code == 503:  # until the proxy saw the close
                assert time.monotonic() < deadline, "the closed tunnel's slot was never freed"
                time.sleep(0.02)
            assert answer.text == "hello from 127.0.0.2"
        second.close()


RATE = 512 << 10
"""The throttled sandbox's bytes a second (and its burst)."""


@pytest.mark.parametrize("rated", ["egress rate", "relay limits"])
def test_a_sandboxs_rate_bounds_all_its_connections_together_and_no_other_sandbox(allowed: Target, rated: str) -> None:
    policy = EgressPolicy(allow=[f"127.0.0.2:{allowed.port}"], open_ranges=["127.0.0.0/8"])

    def throttled() -> EgressContext:
        if rated == "relay limits":  # the sandbox's relay bandwidth, shared with its previews
            limits = RelayLimits(64, ByteRate(RATE))
            return EgressContext(sandbox="slow", tenant="alice", policy=lambda: policy, limits=limits)
        return EgressContext(sandbox="slow", tenant="alice", policy=lambda: policy, rate=ByteRate(RATE))

    def free() -> EgressContext:
        return EgressContext(sandbox="free", tenant="alice", policy=lambda: policy)

    size = 3 * RATE // 2  # two of them: three seconds of the rate, less its one-second burst
    url = f"http://127.0.0.2:{allowed.port}/bytes/{size}"
    results: dict[str, Any] = {}

    def fetch(name: str, proxy_url: str) -> None:
        with httpx.Client(proxy=proxy_url, timeout=30) as client:
            results[name] = client.get(url)
        results[f"{name} done"] = time.monotonic()

    with _serving(throttled, free) as (slow_url, free_url):
        started = time.monotonic()
        threads = [threading.Thread(target=fetch, args=(f"slow {i}", slow_url)) for i in range(2)]
        for thread in threads:
            thread.start()
        fetch("free", free_url)  # meanwhile, another sandbox's egress
        for thread in threads:
            thread.join(30)
    assert [len(results[name].content) for name in ("slow 0", "slow 1", "free")] == [size] * 3
    slow_done = [results["slow 0 done"], results["slow 1 done"]]
    assert max(slow_done) - started >= (2 * size - RATE) / RATE * 0.9  # the two shared one rate
    assert results["free done"] < min(slow_done)  # the other sandbox did not wait for them


async def test_a_byte_rate_lets_a_burst_through_then_paces_the_rest() -> None:
    now = [0.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    rate = ByteRate(1000, clock=lambda: now[0], sleep=sleep)
    await rate.take(1000)  # the burst
    await rate.take(500)  # half a second of debt
    now[0] += 2.0  # idle: the bucket refills to its burst, no more
    await rate.take(1000)
    await rate.take(3000)  # larger than the burst: passes, three seconds of debt
    assert slept == [0.5, 3.0]
    with pytest.raises(ValueError):
        ByteRate(0)
