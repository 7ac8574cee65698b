"""`FakeKubernetes`: the FAKE API server started on 127.0.0.1 in a thread (uvicorn), with the
admin methods a test needs (evict a pod, compact the watch history). A test double only."""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import uvicorn
import websockets.http11

from .app import build_app
from .kubelet import LABEL, Kubelet, NodeConfig
from .store import Store

__all__ = ["FakeKubernetes"]


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
    ) -> None:
        self.instance = uuid.uuid4().hex[:12]
        self.labels = {LABEL: self.instance, **(container_labels or {})}
        self.store = Store()
        self.kubelet = Kubelet(self.store, docker, node or NodeConfig(), self.labels)
        self.namespaces = set(namespaces)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def start(self) -> FakeKubernetes:
        # The exec helper travels in the query string (``command=python3&command=-c&command=...``):
        # the real API server reads request lines of up to 1 MiB, the websockets library 8 KiB.
        websockets.http11.MAX_LINE_LENGTH = max(websockets.http11.MAX_LINE_LENGTH, 1 << 20)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        app = build_app(self.store, self.kubelet, self.namespaces)
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
