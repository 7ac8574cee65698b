"""A FAKE of one Kubernetes API endpoint, the pod exec subresource, for tests only: a
WebSocket server on 127.0.0.1 speaking ``v5.channel.k8s.io`` / ``v4.channel.k8s.io`` (stdin 0,
stdout 1, stderr 2, the error channel 3 with a `Status` carrying the exit code, v5's close
255), that runs each exec as ``docker exec`` in a container standing in for the pod.

It stands in until the full fake API server (``tests/kubernetes/fake_apiserver``, pods and
watches too) lands; it lets the exec path of `KubernetesSandbox` (the official client's
``stream()``, the channel adapter, the exec helper, the per-command fallback) run the
conformance suite against a real container now. No pod API: tests construct the sandbox on a
pod name, which here is the container's name.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from collections.abc import Iterator
from urllib.parse import parse_qs, urlparse

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import Server, ServerConnection, serve

V4 = "v4.channel.k8s.io"
V5 = "v5.channel.k8s.io"


class ExecDouble:
    """``http://127.0.0.1:<port>``; ``protocols`` the subprotocols it accepts, in preference."""

    def __init__(self, *, protocols: tuple[str, ...] = (V5, V4), user: str = "1000:1000") -> None:
        self.user = user
        self.execs = 0
        self._server: Server = serve(
            self._handle,
            "127.0.0.1",
            0,
            subprotocols=list(protocols),  # type: ignore[arg-type]
            max_size=None,
            compression=None,
            ping_interval=None,
        )
        self.port = self._server.socket.getsockname()[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="exec-double", daemon=True)
        self._thread.start()

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._thread.join(5)

    def _handle(self, connection: ServerConnection) -> None:
        request = connection.request
        assert request is not None
        url = urlparse(request.path)
        parts = url.path.strip("/").split("/")  # api v1 namespaces <ns> pods <name> exec
        query = parse_qs(url.query)
        pod, argv = parts[5], query.get("command", [])
        with_stdin = query.get("stdin", ["false"])[0] == "true"
        self.execs += 1
        process = subprocess.Popen(
            ["docker", "exec", *(["-i"] if with_stdin else []), "-u", self.user, pod, *argv],
            stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert process.stdout is not None
        assert process.stderr is not None
        pumps = [
            threading.Thread(target=_pump, args=(connection, process.stdout, 1), daemon=True),
            threading.Thread(target=_pump, args=(connection, process.stderr, 2), daemon=True),
        ]
        for pump in pumps:
            pump.start()
        feeder = threading.Thread(target=_feed, args=(connection, process), daemon=True)
        feeder.start()
        code = process.wait()
        for pump in pumps:
            pump.join()
        with contextlib.suppress(ConnectionClosed):
            connection.send(bytes([3]) + json.dumps(_status(code)).encode())
        connection.close()


def _status(code: int) -> dict[str, object]:
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: {code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


def _pump(connection: ServerConnection, pipe: object, channel: int) -> None:
    read = pipe.read1  # type: ignore[attr-defined]
    with contextlib.suppress(ConnectionClosed, OSError, ValueError):
        while chunk := read(65536):
            connection.send(bytes([channel]) + chunk)


def _feed(connection: ServerConnection, process: subprocess.Popen[bytes]) -> None:
    """Client frames: stdin bytes to the process; v5 close of channel 0 ends its stdin; the
    connection closing ends the exec (its stdin closes, as the kubelet's does)."""
    try:
        for message in _messages(connection):
            if message[:1] == b"\x00" and process.stdin is not None:
                process.stdin.write(message[1:])
                process.stdin.flush()
            elif message[:2] == b"\xff\x00" and process.stdin is not None:
                process.stdin.close()
    except (OSError, ValueError):
        pass
    finally:
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()


def _messages(connection: ServerConnection) -> Iterator[bytes]:
    with contextlib.suppress(ConnectionClosed):
        while True:
            message = connection.recv()
            yield message if isinstance(message, bytes) else message.encode()
