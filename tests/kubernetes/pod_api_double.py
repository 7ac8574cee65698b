"""A FAKE Kubernetes API server for tests only, just big enough for `KubernetesProvider`: pods
create/get/list/patch/delete and watch (label selectors, resourceVersions), and the exec
subresource over WebSocket (``v5``/``v4`` channels), on 127.0.0.1. Each pod runs as a Docker
container named after it, its security context mapped to Docker's (user, read-only root,
capabilities, no-new-privileges, tmpfs ``emptyDir``s, memory limit, no network).

Deliberately small, and a stand-in until the full fake (``tests/kubernetes/fake_apiserver``)
lands. Simplifications a real server does not make: a watch answers once it has events (or its
timeout passed) and ends, as a server may, so clients watch again from the last
resourceVersion; no ``activeDeadlineSeconds``, no scheduler, no kubelet restarts.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import json
import socket
import struct
import subprocess
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

V4 = "v4.channel.k8s.io"
V5 = "v5.channel.k8s.io"
NODE_LABELS = {"kubernetes.io/os": "linux", "kubernetes.io/hostname": "fake-node"}
"""The one node's labels, which a pod's ``nodeSelector`` must match to be scheduled."""
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class FakeCluster:
    """``host`` is the API server's URL; ``label`` marks every container for cleanup."""

    def __init__(self, docker_client: Any, *, label: dict[str, str], protocols: tuple[str, ...] = (V5, V4)) -> None:
        self.docker = docker_client
        self.label = label
        self.protocols = protocols
        self.pods: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self.execs = 0
        self.requests: Counter[str] = Counter()
        """Requests served, by kind: ``list``, ``watch``, ``get``, ``create``, ``delete``, ``patch``."""
        self._versions = itertools.count(1)
        self._changed = threading.Condition()
        cluster = self

        class Handler(_Handler):
            fake = cluster

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.host = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-k8s", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        for name in list(self.pods):
            with contextlib.suppress(Exception):
                self.docker.containers.get(name).remove(force=True)

    # ------------------------------------------------------------------ state

    def record(self, kind: str, pod: dict[str, Any]) -> None:
        with self._changed:
            version = next(self._versions)
            pod["metadata"]["resourceVersion"] = str(version)
            if kind == "DELETED":
                self.pods.pop(pod["metadata"]["name"], None)
            else:
                self.pods[pod["metadata"]["name"]] = pod
            self.events.append((version, kind, json.loads(json.dumps(pod))))
            self._changed.notify_all()

    def set_status(self, name: str, status: dict[str, Any]) -> None:
        with self._changed:
            pod = self.pods.get(name)
            if pod is None:
                return
            pod = json.loads(json.dumps(pod))
        pod["status"] = status
        self.record("MODIFIED", pod)

    def create(self, pod: dict[str, Any]) -> dict[str, Any]:
        name = pod["metadata"]["name"]
        pod["metadata"]["creationTimestamp"] = _now()
        pod["metadata"]["uid"] = hashlib.sha1(name.encode()).hexdigest()
        pod["status"] = {"phase": "Pending"}
        self.record("ADDED", pod)
        threading.Thread(target=self._start, args=(json.loads(json.dumps(pod)),), daemon=True).start()
        return pod

    def _start(self, pod: dict[str, Any]) -> None:
        import docker.errors

        name, spec = pod["metadata"]["name"], pod["spec"]
        container = spec["containers"][0]
        wanted = spec.get("nodeSelector") or {}
        if any(NODE_LABELS.get(key) != value for key, value in wanted.items()):
            message = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
            condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
            self.set_status(name, {"phase": "Pending", "conditions": [condition]})
            return
        try:
            self.docker.images.get(container["image"])  # nothing is pulled here: no registry
        except docker.errors.ImageNotFound as exc:
            reason = "ErrImageNeverPull" if container.get("imagePullPolicy") == "Never" else "ErrImagePull"
            self.set_status(
                name, _waiting(container, reason, f'image "{container["image"]}": {exc.explanation or exc}')
            )
            return
        try:
            self.docker.containers.run(
                container["image"], container.get("command"), name=name, **_docker_options(pod, self.label)
            )
        except docker.errors.APIError as exc:
            self.set_status(name, _waiting(container, "CreateContainerError", str(exc.explanation or exc)))
            return
        status = {
            "phase": "Running",
            "startTime": _now(),
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": _now()}},
                }
            ],
        }
        self.set_status(name, status)

    def delete(self, name: str) -> dict[str, Any] | None:
        with self._changed:
            pod = self.pods.get(name)
            if pod is None:
                return None
            pod = json.loads(json.dumps(pod))
        if pod["metadata"].get("deletionTimestamp") is None:
            pod["metadata"]["deletionTimestamp"] = _now()
            self.record("MODIFIED", pod)
            threading.Thread(target=self._remove, args=(pod,), daemon=True).start()
        return pod

    def _remove(self, pod: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):
            self.docker.containers.get(pod["metadata"]["name"]).remove(force=True)
        if not pod["metadata"].get("finalizers"):  # a finalizer holds the object, as a real server does
            self.record("DELETED", pod)

    def patch(self, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        with self._changed:
            pod = self.pods.get(name)
            if pod is None:
                return None
            pod = json.loads(json.dumps(pod))
        if "finalizers" in patch.get("metadata", {}):
            pod["metadata"]["finalizers"] = patch["metadata"]["finalizers"]
        for field in ("labels", "annotations"):
            for key, value in (patch.get("metadata", {}).get(field) or {}).items():
                target = pod["metadata"].setdefault(field, {})
                if value is None:
                    target.pop(key, None)
                else:
                    target[key] = value
        self.record("MODIFIED", pod)
        return pod

    def matching(self, selector: str) -> list[dict[str, Any]]:
        with self._changed:
            return [json.loads(json.dumps(pod)) for pod in self.pods.values() if _selects(selector, pod)]

    def watch(self, selector: str, since: int | None, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        with self._changed:
            if since is None:
                return [{"type": "ADDED", "object": pod} for pod in self.pods.values() if _selects(selector, pod)]
            while True:
                events = [
                    {"type": kind, "object": pod}
                    for version, kind, pod in self.events
                    if version > since and _selects(selector, pod)
                ]
                remaining = deadline - time.monotonic()
                if events or remaining <= 0:
                    return events
                self._changed.wait(remaining)

    @property
    def version(self) -> str:
        with self._changed:
            return str(self.events[-1][0] if self.events else 0)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _waiting(container: dict[str, Any], reason: str, message: str) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "containerStatuses": [
            {
                "name": container["name"],
                "image": container["image"],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}},
            }
        ],
    }


_NAME = "\0name"
"""A pseudo label standing for ``metadata.name`` in a selector."""


def _selects(selector: str, pod: dict[str, Any]) -> bool:
    labels = {**(pod["metadata"].get("labels") or {}), _NAME: pod["metadata"]["name"]}
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _bytes(quantity: str) -> int:
    from kubernetes.utils.quantity import parse_quantity

    return int(parse_quantity(quantity))


def _docker_options(pod: dict[str, Any], label: dict[str, str]) -> dict[str, Any]:
    """The pod's security settings as Docker's."""
    spec = pod["spec"]
    container = spec["containers"][0]
    context = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
    volumes = {volume["name"]: volume.get("emptyDir", {}) for volume in spec.get("volumes", [])}
    uid, gid = context.get("runAsUser", 0), context.get("runAsGroup", 0)
    tmpfs = {}
    for mount in container.get("volumeMounts", []):
        size = volumes.get(mount["name"], {}).get("sizeLimit")
        options = f"rw,nosuid,nodev,uid={uid},gid={gid},mode=0777" + (f",size={_bytes(size)}" if size else "")
        tmpfs[mount["mountPath"]] = options
    limits = container.get("resources", {}).get("limits", {})
    options: dict[str, Any] = {
        "detach": True,
        "init": bool(spec.get("shareProcessNamespace")),  # a PID 1 that reaps, like the pause container
        "user": f"{uid}:{gid}",
        "working_dir": container.get("workingDir"),
        "environment": {item["name"]: item.get("value", "") for item in container.get("env", [])},
        "labels": {**label, **(pod["metadata"].get("labels") or {})},
        "network_mode": "none",
        "read_only": bool(context.get("readOnlyRootFilesystem")),
        "tmpfs": tmpfs,
        "cap_drop": ["ALL"] if "ALL" in context.get("capabilities", {}).get("drop", []) else None,
        "security_opt": ["no-new-privileges"] if context.get("allowPrivilegeEscalation") is False else None,
        "pids_limit": 256,
    }
    if "memory" in limits:
        options["mem_limit"] = _bytes(limits["memory"])
    return options


class _Handler(BaseHTTPRequestHandler):
    fake: FakeCluster
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    # ------------------------------------------------------------------ REST

    def _route(self) -> tuple[list[str], dict[str, list[str]]]:
        url = urlparse(self.path)
        return url.path.strip("/").split("/"), parse_qs(url.query)

    def _reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _not_found(self, name: str) -> None:
        self._reply(
            404,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "NotFound",
                "message": f'pods "{name}" not found',
                "code": 404,
            },
        )

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def do_POST(self) -> None:
        self.fake.requests["create"] += 1
        pod = self._body()
        if pod["metadata"]["name"] in self.fake.pods:
            self._reply(409, {"kind": "Status", "status": "Failure", "reason": "AlreadyExists", "code": 409})
            return
        self._reply(201, self.fake.create(pod))

    def do_DELETE(self) -> None:
        self.fake.requests["delete"] += 1
        parts, _ = self._route()
        self._body()
        pod = self.fake.delete(parts[5])
        self._reply(200, pod) if pod is not None else self._not_found(parts[5])

    def do_PATCH(self) -> None:
        self.fake.requests["patch"] += 1
        parts, _ = self._route()
        pod = self.fake.patch(parts[5], self._body())
        self._reply(200, pod) if pod is not None else self._not_found(parts[5])

    def do_GET(self) -> None:
        parts, query = self._route()
        if len(parts) == 7 and parts[6] == "exec":
            self._exec(parts[5], query)
            return
        if len(parts) == 6:
            self.fake.requests["get"] += 1
            pods = [pod for pod in self.fake.matching("") if pod["metadata"]["name"] == parts[5]]
            self._reply(200, pods[0]) if pods else self._not_found(parts[5])
            return
        selector = query.get("labelSelector", [""])[0]
        named = query.get("fieldSelector", [""])[0]
        if named:  # only metadata.name=<name>, the one field selector the backend uses
            assert named.startswith("metadata.name="), named
            selector = ",".join(filter(None, [selector, f"{_NAME}={named.split('=', 1)[1]}"]))
        if query.get("watch", ["false"])[0] in ("true", "1"):
            self.fake.requests["watch"] += 1
            since = query.get("resourceVersion", [None])[0]
            timeout = float(query.get("timeoutSeconds", ["30"])[0])
            events = self.fake.watch(selector, int(since) if since else None, timeout)
            data = b"".join(json.dumps(event).encode() + b"\n" for event in events)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.fake.requests["list"] += 1
        items = self.fake.matching(selector)
        self._reply(
            200,
            {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": self.fake.version}, "items": items},
        )

    # ------------------------------------------------------------------ exec over WebSocket

    def _exec(self, pod: str, query: dict[str, list[str]]) -> None:
        offered = [item.strip() for item in (self.headers.get("Sec-WebSocket-Protocol") or "").split(",")]
        chosen = next((proto for proto in self.fake.protocols if proto in offered), None)
        if pod not in self.fake.pods or chosen is None:
            self._not_found(pod)
            return
        accept = base64.b64encode(hashlib.sha1(self.headers["Sec-WebSocket-Key"].encode() + _GUID).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.send_header("Sec-WebSocket-Protocol", chosen)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        # Go's servers (the API server, the kubelet) disable Nagle; without this, a frame
        # written right after another waits for the client's delayed ACK (~40 ms).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.fake.execs += 1
        _Exec(self, pod, query.get("command", []), query.get("stdin", ["false"])[0] == "true").run()


class _Exec:
    def __init__(self, handler: _Handler, pod: str, argv: list[str], with_stdin: bool) -> None:
        self.rfile, self.wfile = handler.rfile, handler.wfile
        self.lock = threading.Lock()
        user = "1000:1000"
        self.process = subprocess.Popen(
            ["docker", "exec", *(["-i"] if with_stdin else []), "-u", user, pod, *argv],
            stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def send(self, payload: bytes, opcode: int = 2) -> None:
        length = len(payload)
        if length < 126:
            header = struct.pack(">BB", 0x80 | opcode, length)
        elif length < 1 << 16:
            header = struct.pack(">BBH", 0x80 | opcode, 126, length)
        else:
            header = struct.pack(">BBQ", 0x80 | opcode, 127, length)
        with self.lock:
            self.wfile.write(header + payload)
            self.wfile.flush()

    def run(self) -> None:
        pumps = [
            threading.Thread(target=self._pump, args=(self.process.stdout, 1), daemon=True),
            threading.Thread(target=self._pump, args=(self.process.stderr, 2), daemon=True),
        ]
        for pump in pumps:
            pump.start()
        threading.Thread(target=self._feed, daemon=True).start()
        code = self.process.wait()
        for pump in pumps:
            pump.join()
        status: dict[str, Any] = {"metadata": {}, "status": "Success"}
        if code:
            status = {
                "metadata": {},
                "status": "Failure",
                "reason": "NonZeroExitCode",
                "message": f"command terminated with non-zero exit code: {code}",
                "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
            }
        with contextlib.suppress(OSError, ValueError):
            self.send(bytes([3]) + json.dumps(status).encode())
            self.send(struct.pack(">H", 1000), opcode=8)

    def _pump(self, pipe: Any, channel: int) -> None:
        with contextlib.suppress(OSError, ValueError):
            while chunk := pipe.read1(65536):
                self.send(bytes([channel]) + chunk)

    def _feed(self) -> None:
        stdin = self.process.stdin
        try:
            while (message := self._receive()) is not None:
                if message[:1] == b"\x00" and stdin is not None:
                    stdin.write(message[1:])
                    stdin.flush()
                elif message[:2] == b"\xff\x00" and stdin is not None:
                    stdin.close()
        except (OSError, ValueError, struct.error):
            pass
        finally:
            if stdin is not None:
                with contextlib.suppress(OSError):
                    stdin.close()

    def _receive(self) -> bytes | None:
        """One whole client message (masked frames, continuations joined); ``None`` at close."""
        message = b""
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return None
            opcode, length = head[0] & 0x0F, head[1] & 0x7F
            if length == 126:
                length = struct.unpack(">H", self.rfile.read(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = _unmask(self.rfile.read(length), mask)
            if opcode == 8:
                return None
            if opcode == 9:
                self.send(data, opcode=10)
                continue
            if opcode in (0, 1, 2):
                message += data
                if head[0] & 0x80:
                    return message


def _unmask(data: bytes, mask: bytes) -> bytes:
    if not data:
        return data
    key = (mask * (len(data) // 4 + 1))[: len(data)]
    return (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(len(data), "big")
