"""benchmarks/_http_load.py, the service benchmark's lean load generator, against a real HTTP/1.1
server on loopback (the standard library's): what it counts as a request served must be one,
and anything else must stop the benchmark loudly rather than be counted or resent."""

from __future__ import annotations

import importlib.util
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

_MODULE = Path(__file__).resolve().parent.parent / "benchmarks" / "_http_load.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_http_load", _MODULE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


http_load = _load()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append((self.path, self.headers["Authorization"], body))
        answer = json.dumps({"exit_code": 0, "path": self.path}).encode()
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (answer[:5], answer[5:]):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
            return
        self.send_response({"/missing": 404}.get(self.path, 200))
        self.send_header("Content-Length", str(len(answer)))
        if self.path == "/closing":
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Handler.seen.clear()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("path", ["/plain", "/chunked"])
def test_one_connection_serves_request_after_request(server: str, path: str) -> None:
    client = http_load.KeepAliveClient(server, path, {"command": "true"}, "sbx_key")
    try:
        answers = [client.call() for _ in range(3)]
    finally:
        client.close()
    assert answers == [{"exit_code": 0, "path": path}] * 3
    assert _Handler.seen == [(path, "Bearer sbx_key", b'{"command": "true"}')] * 3


def test_an_error_status_stops_the_run(server: str) -> None:
    client = http_load.KeepAliveClient(server, "/missing", {}, "k")
    try:
        with pytest.raises(RuntimeError, match="404"):
            client.call()
    finally:
        client.close()


def test_a_connection_the_server_closes_is_never_used_again(server: str) -> None:
    """The answer says the connection ends: the call fails rather than send the next request
    where it may be lost, or acted on unseen."""
    client = http_load.KeepAliveClient(server, "/closing", {}, "k")
    try:
        with pytest.raises(ConnectionError, match="close"):
            client.call()
    finally:
        client.close()
    assert len(_Handler.seen) == 1
