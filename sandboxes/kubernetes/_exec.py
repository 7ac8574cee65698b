"""The pod exec subresource as a byte stream: opening it through the official client's
`kubernetes.stream.stream` (which offers ``v5.channel.k8s.io`` then ``v4.channel.k8s.io``), and
adapting its channels (stdin 0 out; stdout 1, stderr 2, the error channel 3 in; v5's close
255) to the `ByteStream` the exec helper's client reads.

The client's `WSClient` is only used to open the websocket: its own reader keeps every byte of
stdout and stderr in an unbounded buffer (``capture_all``) for the life of the stream, which a
long-lived stream fed by a hostile sandbox cannot afford. Frames are read here from its
`websocket.WebSocket` directly, and what is kept aside (stderr, the error channel) is bounded.
"""

from __future__ import annotations

import contextlib
import json
import tarfile
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from sandboxes.kubernetes._pods import CONTAINER

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api

STDIN, STDOUT, STDERR, ERROR, CLOSE = 0, 1, 2, 3, 255
V5 = "v5.channel.k8s.io"
_KEPT = 64 << 10
"""Bytes of stderr and of the error channel kept for diagnostics; the rest is dropped."""
_SEND_CHUNK = 256 << 10
KEEPALIVE = 20.0
"""Seconds between the pings an open exec stream sends: a proxy or load balancer in front of
the API server that cuts idle connections sees traffic while a command prints nothing."""

_LOCKS: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def _stream_lock(api: Any) -> threading.Lock:
    """`kubernetes.stream.stream` swaps the API client's ``call_api`` for the duration of the
    call: two at once on one client can leave it swapped for good, so calls on one client take
    its lock (sandboxes on different clients open streams in parallel), and exec goes through
    an API client of its own (see `exec_api`) that no REST call uses."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(api.api_client)
        if lock is None:
            lock = _LOCKS[api.api_client] = threading.Lock()
        return lock


class ExecError(RuntimeError):
    """The exec could not be opened (pod gone, not running, refused)."""


def exec_api(api: CoreV1Api) -> CoreV1Api:
    """A CoreV1Api on its own API client (same configuration) for exec streams only: while
    `kubernetes.stream.stream` holds a client's ``call_api`` swapped, a REST call from another
    thread through that client would become a websocket."""
    from kubernetes import client

    return client.CoreV1Api(client.ApiClient(api.api_client.configuration))


class ExecStream:
    """One exec: `send` writes the process's stdin, `recv` returns its stdout (and, with
    ``merge_stderr``, stderr, in arrival order); the error channel's status is kept in
    `status`. Thread-safe for one reader and any number of writers.

    While open, it pings the server every ``keepalive`` seconds (`KEEPALIVE` from `open_exec`),
    and `recv` counts the pongs in `pongs`: silence on the stream is never idleness on the
    connection. Frames go out one at a time, under one lock, whoever sends them."""

    def __init__(self, client: Any, *, merge_stderr: bool = False, keepalive: float | None = None) -> None:
        self._client = client
        self._ws = client.sock
        self.protocol: str | None = client.subprotocol
        self._merge = merge_stderr
        self._pending = b""
        self.stderr = bytearray()
        self.status = bytearray()
        self.ended = False
        self.pongs = 0
        self._sending = threading.Lock()
        self._closed = threading.Event()
        if keepalive:
            threading.Thread(target=self._ping, args=(keepalive,), name="exec-keepalive", daemon=True).start()

    def _ping(self, interval: float) -> None:
        """Until the stream closes or a ping fails (the stream is gone: its reader finds out)."""
        from websocket import WebSocketException

        while not self._closed.wait(interval):
            try:
                with self._sending:
                    self._ws.ping()
            except (WebSocketException, OSError, AttributeError):
                return

    def send(self, data: bytes | memoryview) -> None:
        """Stdin bytes; `OSError` once the stream is gone."""
        from websocket import ABNF, WebSocketException

        view = memoryview(data)
        try:
            for offset in range(0, len(view), _SEND_CHUNK):
                with self._sending:
                    self._ws.send(bytes([STDIN]) + view[offset : offset + _SEND_CHUNK], opcode=ABNF.OPCODE_BINARY)
        except WebSocketException as exc:
            raise OSError(f"exec stream closed: {exc}") from exc

    def close_stdin(self) -> bool:
        """End the process's stdin (``v5`` only); whether the protocol could."""
        if self.protocol != V5:
            return False
        from websocket import ABNF, WebSocketException

        with contextlib.suppress(WebSocketException, OSError), self._sending:
            self._ws.send(bytes([CLOSE, STDIN]), opcode=ABNF.OPCODE_BINARY)
        return True

    def recv(self, size: int) -> bytes:
        """Up to ``size`` bytes of output; ``b""`` once the stream ended (however it ended)."""
        while not self._pending:
            data = self._next_frame()
            if data is None:
                self.ended = True
                return b""
            self._pending = data
        chunk, self._pending = self._pending[:size], self._pending[size:]
        return chunk

    def _next_frame(self) -> bytes | None:
        from websocket import ABNF, WebSocketException

        while True:
            try:
                opcode, frame = self._ws.recv_data_frame(True)
            except (WebSocketException, OSError, ValueError, AttributeError):
                return None
            if opcode == ABNF.OPCODE_CLOSE:
                return None
            if opcode == ABNF.OPCODE_PONG:
                self.pongs += 1
                continue
            if opcode not in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT) or not frame.data:
                continue
            data = frame.data if isinstance(frame.data, bytes) else str(frame.data).encode("utf-8")
            channel, payload = data[0], data[1:]
            if channel == STDOUT or (channel == STDERR and self._merge):
                if payload:
                    return payload
            elif channel == STDERR:
                self.stderr += payload[: max(0, _KEPT - len(self.stderr))]
            elif channel == ERROR:
                self.status += payload[: max(0, _KEPT - len(self.status))]

    def exit_code(self) -> int | None:
        """The process's exit status from the error channel, once the stream ended; ``None``
        when none came (the stream broke: the process's fate is unknown)."""
        return exit_code(bytes(self.status))

    def close(self) -> None:
        """Shut the socket down first, which wakes a thread blocked in `recv`, then close it."""
        self._closed.set()
        with contextlib.suppress(Exception):
            self._ws.abort()
        with contextlib.suppress(Exception):
            self._ws.shutdown()


def exit_code(status: bytes) -> int | None:
    """The exit code in an exec's error-channel `Status`: 0 for ``Success``, the ``ExitCode``
    cause of a ``NonZeroExitCode`` failure; ``None`` for nothing or anything else (the exec
    itself failed)."""
    if not status.strip():
        return None
    try:
        body = json.loads(status)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    if body.get("status") == "Success":
        return 0
    details = body.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    for cause in causes if isinstance(causes, list) else []:
        if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
            with contextlib.suppress(TypeError, ValueError):
                return int(cause.get("message", ""))
    return None


def status_message(status: bytes) -> str:
    """The human message of an error-channel `Status` (a failed exec), bounded."""
    with contextlib.suppress(ValueError):
        body = json.loads(status)
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            return str(body["message"])[:500]
    return status[:500].decode("utf-8", "replace")


def open_exec(
    api: CoreV1Api, namespace: str, pod: str, argv: list[str], *, stdin: bool = True, merge_stderr: bool = False
) -> ExecStream:
    """Start ``argv`` in the pod's sandbox container over a websocket; `ExecError` if refused."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.stream import stream

    try:
        with _stream_lock(api):
            client = stream(
                api.connect_get_namespaced_pod_exec,
                pod,
                namespace,
                command=argv,
                container=CONTAINER,
                stdin=stdin,
                stdout=True,
                stderr=True,
                tty=False,
                binary=True,
                _preload_content=False,
            )
    except ApiException as exc:
        raise ExecError(f"exec in pod {pod} refused: {exc.reason or exc}") from exc
    return ExecStream(client, merge_stderr=merge_stderr, keepalive=KEEPALIVE)


MAX_ARCHIVE_MEMBERS = 10_000
"""Members of one archive put into a pod; a bigger batch is split."""
_SLICE = 1 << 20


def tar_pieces(files: list[tuple[str, bytes]]) -> tuple[list[bytes | memoryview], int]:
    """A tar of regular files named by their absolute paths (extracted under ``/``), as pieces
    (headers, then slices of the callers' own bytes: nothing is copied whole) and its total
    size, known before a byte is sent, so the pod's side can read exactly that much."""
    now = time.time()
    pieces: list[bytes | memoryview] = []
    for path, content in files:
        info = tarfile.TarInfo(path.lstrip("/"))
        info.size, info.mode, info.mtime = len(content), 0o644, now
        pieces.append(info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape"))
        view = memoryview(content)
        pieces.extend(view[offset : offset + _SLICE] for offset in range(0, len(view), _SLICE))
        if len(content) % tarfile.BLOCKSIZE:
            pieces.append(tarfile.NUL * (tarfile.BLOCKSIZE - len(content) % tarfile.BLOCKSIZE))
    pieces.append(tarfile.NUL * (tarfile.BLOCKSIZE * 2))
    return pieces, sum(len(piece) for piece in pieces)
