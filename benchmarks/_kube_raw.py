"""The raw baselines of bench_kubernetes.py: the same work done with the official client alone
(``kubernetes.stream.stream`` and ``CoreV1Api``), on the same pod, with nothing of ours in
between. Each one checks its command's exit status, so a baseline that failed is never timed
as if it had worked. Also where the bench runs: ``$KUBECONFIG``'s cluster or the test fake."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sandboxes.kubernetes._pods import LABEL_SANDBOX

MARKER = "__sandboxes_bench_done__"
STDOUT, ERROR = 1, 3
"""The exec subresource's channels read here (v4 and v5 alike)."""
SEND_CHUNK = 1 << 20
"""Stdin frames of the raw uploads: under the API server's (and the fake's) frame limit."""


@contextlib.contextmanager
def cluster(owner: str) -> Iterator[tuple[Any, str]]:
    """(API client, where) for ``$KUBECONFIG``'s cluster, or the test fake."""
    from kubernetes import client, config

    if os.environ.get("KUBECONFIG"):
        configuration = client.Configuration()
        config.load_kube_config(client_configuration=configuration)
        yield client.ApiClient(configuration), f"cluster of {os.environ['KUBECONFIG']}"
        return
    import docker

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "kubernetes"))
    from fake_apiserver import FakeKubernetes

    engine = docker.from_env()
    fake = FakeKubernetes(
        engine, namespaces=("default", "sandboxes"), container_labels={"io.sandboxes.owner": owner}
    ).start()
    try:
        yield (
            client.ApiClient(client.Configuration(host=fake.url)),
            "the test fake API server (pods are Docker containers)",
        )
    finally:
        fake.stop()
        for container in engine.containers.list(all=True, filters={"label": f"io.sandboxes.owner={owner}"}):
            container.remove(force=True, v=True)


class RawShell:
    """A raw persistent exec stream: ``sh`` reading commands from stdin, a marker and the
    command's exit status after each."""

    def __init__(self, api: Any, namespace: str, pod: str) -> None:
        from kubernetes.stream import stream

        self.ws = stream(
            api.connect_get_namespaced_pod_exec,
            pod,
            namespace,
            command=["/bin/sh"],
            stdin=True,
            stdout=True,
            stderr=True,
            tty=False,
            _preload_content=False,
            binary=True,
        )

    def run(self, command: str) -> bytes:
        """``command``'s stdout; `RuntimeError` if it exits non-zero."""
        self.ws.write_stdin(f'{command}; echo "{MARKER} $?"\n'.encode())
        output = b""
        while not output.endswith(b"\n") or MARKER.encode() not in output:
            self.ws.update(timeout=10)
            if not self.ws.is_open():
                raise RuntimeError(f"the raw shell's stream closed during {command!r}")
            output += self.ws.read_stdout(timeout=0) or b""
        self.ws.read_all()  # the client keeps everything it read otherwise
        before, _, status = output.partition(MARKER.encode())
        if status.strip() != b"0":
            raise RuntimeError(f"raw shell: {command!r} exited {status.strip()!r}: {before[-300:]!r}")
        return before

    def close(self) -> None:
        self.ws.close()


def _exec(api: Any, namespace: str, pod: str, command: str, *, stdin: bool) -> Any:
    from kubernetes.stream import stream

    return stream(
        api.connect_get_namespaced_pod_exec,
        pod,
        namespace,
        command=["/bin/sh", "-c", command],
        stdin=stdin,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
        binary=True,
    )


def _finish(ws: Any, command: str, timeout: float = 120) -> bytes:
    """Read the exec's frames from the client's websocket until it closes: its stdout and its
    exit status (`RuntimeError` unless 0). Not through ``WSClient.update``: that appends every
    frame already available to one bytes object, quadratic in the output (a 64 MiB ``cat`` took
    over 30 s that way, and ``read_all()`` would drop the error channel carrying the status)."""
    from websocket import ABNF

    ws.sock.settimeout(timeout)
    chunks: list[bytes] = []
    status = bytearray()
    try:
        while True:
            opcode, frame = ws.sock.recv_data_frame(True)
            if opcode == ABNF.OPCODE_CLOSE:
                break
            if opcode not in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT) or not frame.data:
                continue  # a ping, answered by the websocket itself
            data = frame.data if isinstance(frame.data, bytes) else frame.data.encode()
            if data[0] == STDOUT:
                chunks.append(data[1:])
            elif data[0] == ERROR:
                status += data[1:]
    finally:
        ws.close()
    code = _exit_code(bytes(status))
    if code != 0:
        raise RuntimeError(f"raw exec of {command!r} exited {code} ({bytes(status[:300])!r})")
    return b"".join(chunks)


def _exit_code(status: bytes) -> int | None:
    """The exit code a ``metav1.Status`` on the error channel says (None: none came)."""
    if not status:
        return None
    said = json.loads(status)
    if said.get("status") == "Success":
        return 0
    causes = (said.get("details") or {}).get("causes") or []
    return next((int(c["message"]) for c in causes if c.get("reason") == "ExitCode"), None)


def fresh_exec(api: Any, namespace: str, pod: str, command: str) -> bytes:
    """``command`` in a fresh exec (``sh -c``): its stdout; `RuntimeError` if it exits non-zero."""
    return _finish(_exec(api, namespace, pod, command, stdin=False), command)


def raw_upload(api: Any, namespace: str, pod: str, path: str, data: bytes) -> None:
    """``data`` into ``path`` by a fresh exec of ``head -c N > path`` fed on stdin: the least a
    copy over exec can do (``kubectl cp`` adds a tar around it)."""
    command = f"head -c {len(data)} > {shlex.quote(path)}"
    ws = _exec(api, namespace, pod, command, stdin=True)
    view = memoryview(data)
    for start in range(0, len(data), SEND_CHUNK):
        ws.write_stdin(bytes(view[start : start + SEND_CHUNK]))
    _finish(ws, command)


def raw_download(api: Any, namespace: str, pod: str, path: str) -> bytes:
    """``path``'s bytes by a fresh exec of ``cat``, stdout read raw."""
    return fresh_exec(api, namespace, pod, f"cat {shlex.quote(path)}")


def raw_cold_start(api: Any, namespace: str, image: str) -> float:
    """Milliseconds from ``create_namespaced_pod`` to a watch event saying Running; the delete
    after is not counted."""
    from kubernetes import watch

    started = time.perf_counter()
    name = f"raw-{uuid.uuid4().hex[:12]}"
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {LABEL_SANDBOX: name}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "sandbox", "image": image, "command": ["sleep", "infinity"]}],
        },
    }
    api.create_namespaced_pod(namespace, body)
    version = None
    try:
        while time.perf_counter() - started < 120:  # a watch may end early: resume from where it was
            for event in watch.Watch().stream(
                api.list_namespaced_pod,
                namespace,
                label_selector=f"{LABEL_SANDBOX}={name}",
                resource_version=version,
                timeout_seconds=60,
            ):
                version = event["object"].metadata.resource_version
                if event["object"].status.phase == "Running":
                    return (time.perf_counter() - started) * 1000
        raise RuntimeError(f"raw pod {name} not Running within 120 s")
    finally:
        api.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
