"""`FakeKubernetes`: the FAKE API server started on 127.0.0.1 in a thread (uvicorn), with the
admin methods a test needs (evict a pod, inject a start failure, drop exec streams, compact the
watch history, count requests). A test double only.

Its sockets have ``TCP_NODELAY`` set, as Go's servers (the API server, the kubelet) do, so a
frame written right after another does not wait for the client's delayed ACK (~40 ms)."""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Literal

import uvicorn
import websockets.http11

from .app import build_app
from .exec_bridge import SUPPORTED_PROTOCOLS
from .kubelet import LABEL, Kubelet, NodeConfig
from .selectors import label_selector
from .store import ApiError, Store

__all__ = ["FakeKubernetes", "StartFault"]

_VERBS = ("create", "get", "list", "watch", "patch", "delete", "exec")
StartFault = Literal["OOMKilled", "Evicted"]
"""Start failures a node brings about that no pod spec can make happen on cue; the others
(``ErrImagePull``, ``Unschedulable``, ``StartError``, ``CrashLoopBackOff``) follow from the spec."""


class FakeKubernetes:
    """A FAKE Kubernetes API server for tests; pods are Docker containers labelled
    ``io.sandboxes.fake-k8s=<instance>`` (plus ``container_labels``) so a sweep finds them."""

    def __init__(
        self,
        docker: Any,
        *,
        namespaces: tuple[str, ...] = ("default",),
        node: NodeConfig | None = None,
        container_labels: dict[str, str] | None = None,
        protocols: tuple[str, ...] = SUPPORTED_PROTOCOLS,
    ) -> None:
        """``protocols``: the exec subprotocols served, e.g. ``("v4.channel.k8s.io",)`` for a
        server older than Kubernetes 1.30, which has no ``v5``."""
        self.instance = uuid.uuid4().hex[:12]
        self.protocols = protocols
        # Every key there from the start: a copy taken in a test's thread never sees the dict
        # grow under it while the server's thread counts.
        self.requests: Counter[str] = Counter(dict.fromkeys(_VERBS, 0))
        """Requests served: ``create``, ``get``, ``list``, ``watch``, ``patch``, ``delete`` (of
        pods) and ``exec`` (exec streams opened). Compare copies taken before and after."""
        self.labels = {LABEL: self.instance, **(container_labels or {})}
        self.store = Store()
        self.kubelet = Kubelet(self.store, docker, node or NodeConfig(), self.labels)
        self.namespaces = set(namespaces)
        self.kubelet.claims.namespaces = self.namespaces
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def start(self) -> FakeKubernetes:
        # The exec helper travels in the query string (``command=python3&command=-c&command=...``):
        # the real API server reads request lines of up to 1 MiB, the websockets library 8 KiB.
        websockets.http11.MAX_LINE_LENGTH = max(websockets.http11.MAX_LINE_LENGTH, 1 << 20)
        # Made with IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose
        # ``proto`` says TCP, and ``socket.socket()`` leaves it 0 (so do the ones it accepts).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        app = build_app(self.store, self.kubelet, self.namespaces, self.protocols, self.requests)
        config = uvicorn.Config(
            app,
            log_level="warning",
            ws="websockets-sansio",
            ws_per_message_deflate=False,
            http="httptools",
            lifespan="off",
            ws_ping_interval=None,
        )
        self._server = uvicorn.Server(config)
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            self._loop.call_soon(ready.set)
            self._loop.run_until_complete(self._server.serve(sockets=[sock]))  # type: ignore[union-attr]

        self._thread = threading.Thread(target=run, name="fake-apiserver", daemon=True)
        self._thread.start()
        ready.wait(10)
        while not self._server.started:
            threading.Event().wait(0.01)
        return self

    def call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coroutine`` on the server's loop (where the store lives) and return its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(60)

    def evict(self, namespace: str, name: str, message: str = "The node was low on resource: memory.") -> None:
        """What a node under pressure does: the pod ends Failed with reason Evicted."""
        self.call(self.kubelet.fail(namespace, name, "Evicted", message))

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored pod as the API serves it, or ``None`` once it is gone."""

        async def get() -> dict[str, Any] | None:
            try:
                return self.store.get(namespace, name)
            except ApiError:
                return None

        result: dict[str, Any] | None = self.call(get())
        return result

    def pod_names(self, namespace: str) -> set[str]:
        async def names() -> set[str]:
            return {pod["metadata"]["name"] for pod in self.store.items(namespace)}

        result: set[str] = self.call(names())
        return result

    def inject_start_failure(self, selector: str, fault: StartFault) -> None:
        """Every pod created from now on that ``selector`` (a label selector) selects fails to
        start as a node makes it: ``OOMKilled`` (killed by the kernel before it is reported
        running: terminated, reason OOMKilled, exit code 137), or ``Evicted`` (phase Failed,
        reason Evicted, the node's message)."""
        self.kubelet.faults.append((label_selector(selector), fault))

    def drop_exec_streams(self, namespace: str, name: str) -> int:
        """Close every open exec stream into the pod from the server's side, mid-command and
        without an exit status; how many there were."""

        async def drop() -> int:
            drops = [event for ns, pod, event in self.kubelet.exec_drops if (ns, pod) == (namespace, name)]
            for event in drops:
                event.set()
            return len(drops)

        dropped: int = self.call(drop())
        return dropped

    def connection_options(self, level: int, option: int) -> list[int]:
        """``getsockopt(level, option)`` of every client connection the server holds now."""

        async def options() -> list[int]:
            assert self._server is not None
            sockets = [conn.transport.get_extra_info("socket") for conn in self._server.server_state.connections]
            return [sock.getsockopt(level, option) for sock in sockets if sock is not None]

        result: list[int] = self.call(options())
        return result

    def compact(self) -> None:
        """Drop the watch history, so a watch from an older resourceVersion gets 410 Gone."""

        async def compact() -> None:
            self.store.compact()

        self.call(compact())

    def add_namespace(self, name: str) -> None:
        self.namespaces.add(name)

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: fake\n  cluster:\n    server: {self.url}\n"
            "users:\n- name: fake\n  user:\n    token: fake-token\n"
            f"contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: {namespace}\n"
            "current-context: fake\n"
        )
        return path

    def stop(self) -> None:
        if self._loop is not None and self._server is not None:
            self.call(self.kubelet.shutdown())
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
