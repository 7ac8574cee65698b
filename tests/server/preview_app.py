"""A web app that a test runs INSIDE a sandbox (stdlib only), reached through its preview URL:
``python3 preview_app.py PORT``. HTTP/1.1 with keep-alive, threads per connection.

- ``GET /health``: ``ok``; ``GET /big?n=N``: N bytes (a repeated pattern), streamed;
- ``POST /echo``: the body's length and SHA-256; ``GET /headers``: the request's headers as JSON;
- ``GET /sse``: one event, then the rest once ``GET /release`` came (proving the first was not
  held back), then the end;
- ``GET /ws``: a WebSocket echoing every message (text or binary) until the client closes;
- ``POST /execute``: as the E2B code interpreter's server answers ``{"code": "1+1"}``, NDJSON
  lines: the code's arithmetic as a result, then the end of the execution.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

_RELEASED = threading.Event()
_PATTERN = bytes(range(256)) * 256  # 64 KiB
_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self, body: bytes, kind: str = "text/plain") -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/health":
            self._answer(b"ok")
        elif url.path == "/headers":
            self._answer(json.dumps(dict(self.headers.items())).encode(), "application/json")
        elif url.path == "/big":
            self._big(int(parse_qs(url.query)["n"][0]))
        elif url.path == "/release":
            _RELEASED.set()
            self._answer(b"released")
        elif url.path == "/sse":
            self._sse()
        elif url.path == "/ws":
            self._websocket()
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        if urlsplit(self.path).path == "/execute":
            self._execute()
            return
        length = int(self.headers.get("Content-Length", "0"))
        digest, left = hashlib.sha256(), length
        while left:
            chunk = self.rfile.read(min(left, 1 << 16))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
        self._answer(json.dumps({"length": length - left, "sha256": digest.hexdigest()}).encode(), "application/json")

    def _execute(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        left, _, right = request["code"].partition("+")
        lines = [
            {"type": "stdout", "text": "computing\n", "timestamp": 0},
            {"type": "result", "text": str(int(left) + int(right)), "is_main_result": True},
            {"type": "end_of_execution"},
        ]
        body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        self._answer(body, "application/x-ndjson")

    def _big(self, size: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        while size:
            piece = _PATTERN[: min(size, len(_PATTERN))]
            self.wfile.write(piece)
            size -= len(piece)

    def _sse(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(b"data: first\n\n")
        self.wfile.flush()
        _RELEASED.wait(30)
        for index in range(2, 5):
            self.wfile.write(b"data: event %d\n\n" % index)
            self.wfile.flush()
        self.close_connection = True

    def _websocket(self) -> None:
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + _WS_GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        while True:
            opcode, data = self._frame()
            if opcode == 8:  # close: answer it
                self._send(8, data[:2])
                break
            if opcode in (1, 2):
                self._send(opcode, data)
        self.close_connection = True

    def _frame(self) -> tuple[int, bytes]:
        first, second = self.rfile.read(2)
        size = second & 0x7F
        if size == 126:
            size = struct.unpack(">H", self.rfile.read(2))[0]
        elif size == 127:
            size = struct.unpack(">Q", self.rfile.read(8))[0]
        mask = self.rfile.read(4)
        data = bytearray(self.rfile.read(size))
        for index in range(len(data)):
            data[index] ^= mask[index % 4]
        return first & 0x0F, bytes(data)

    def _send(self, opcode: int, data: bytes) -> None:
        head = bytes([0x80 | opcode])
        if len(data) < 126:
            head += bytes([len(data)])
        elif len(data) < 1 << 16:
            head += bytes([126]) + struct.pack(">H", len(data))
        else:
            head += bytes([127]) + struct.pack(">Q", len(data))
        self.wfile.write(head + data)
        self.wfile.flush()


if __name__ == "__main__":
    ThreadingHTTPServer.request_queue_size = 256  # a hundred clients at once (its default backlog is 5)
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    server.serve_forever()
