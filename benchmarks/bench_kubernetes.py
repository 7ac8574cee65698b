"""KubernetesSandbox latency beside what the same work costs with the official client alone.

Runs against the cluster ``$KUBECONFIG`` names (namespace ``--namespace``, image ``--image``,
which the cluster must be able to run), or, without one, against the test suite's fake API
server (``tests/kubernetes/fake_apiserver``: pods are local Docker containers; its figures
say what our client side costs, not what a cluster does). Rows, each beside a raw baseline
measured in the same run on the same pod:

* execute ``true``: through `KubernetesSandbox` (the exec helper on one persistent exec
  stream) beside a raw persistent exec stream (``sh`` reading commands from stdin, a marker
  after each) and beside a raw fresh exec (``stream()`` of ``sh -c true``) per command.
* read a small file: `KubernetesSandbox.read` beside ``cat`` on the raw persistent stream.
* cold start: `KubernetesSandbox.create` + ``destroy`` beside a raw ``create_namespaced_pod``
  of a bare pod, a watch until Running, and a delete.
* warm acquisition: `KubernetesProvider.acquire` from a pool of 2.

Every ratio is baseline / ours (above 1x we are faster). Targets (issue #12, real cluster):
execute p50 <= 1.5x the raw persistent stream and >= 20x faster than a fresh exec; cold start
<= 1.2x raw; warm acquisition p99 <= 100 ms. Reported, never asserted.

    python benchmarks/bench_kubernetes.py [--iterations N] [--namespace NS] [--image IMAGE]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _common import percentile, timed

from sandboxes.kubernetes import KubernetesProvider, KubernetesSandbox, KubernetesSandboxConfig
from sandboxes.kubernetes._pods import LABEL_SANDBOX

MARKER = "__sandboxes_bench_done__"


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
    """A raw persistent exec stream: ``sh`` reading commands from stdin, a marker after each."""

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
        self.ws.write_stdin(f"{command}; echo {MARKER}\n".encode())
        output = b""
        while MARKER.encode() not in output:
            self.ws.update(timeout=10)
            output += self.ws.read_stdout(timeout=0) or b""
        self.ws.read_all()  # the client keeps everything it read otherwise
        return output

    def close(self) -> None:
        self.ws.close()


def fresh_exec(api: Any, namespace: str, pod: str, command: str) -> None:
    from kubernetes.stream import stream

    stream(
        api.connect_get_namespaced_pod_exec,
        pod,
        namespace,
        command=["/bin/sh", "-c", command],
        stdin=False,
        stdout=True,
        stderr=True,
        tty=False,
    )


def raw_cold_start(api: Any, namespace: str, image: str) -> float:
    """Milliseconds from ``create_namespaced_pod`` to a watch event saying Running; the delete
    after is not counted."""
    import time

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


def row(name: str, ours: list[float], baselines: dict[str, list[float]]) -> None:
    ours_p50 = statistics.median(ours)
    line = f"{name:<24} ours p50 {ours_p50:8.2f} ms  p99 {percentile(ours, 0.99):8.2f} ms"
    for label, samples in baselines.items():
        base = statistics.median(samples)
        line += f" | {label} p50 {base:8.2f} ms ({base / ours_p50:5.2f}x)"
    print(line)


def alternate(n: int, ours: Callable[[], object], *others: Callable[[], object]) -> list[list[float]]:
    """Sides alternate within one loop (which goes first alternates too), so noise hits all."""
    sides = [ours, *others]
    samples: list[list[float]] = [[] for _ in sides]
    for i in range(n):
        order = range(len(sides)) if i % 2 == 0 else reversed(range(len(sides)))
        for index in order:
            samples[index].append(timed(sides[index]))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--cold-iterations", type=int, default=5)
    parser.add_argument("--namespace", default="sandboxes")
    parser.add_argument("--image", default="sandboxes/runtime:latest")
    parser.add_argument("--owner", default=f"bench-{uuid.uuid4().hex[:8]}", help="owner label of every pod made")
    args = parser.parse_args()
    from kubernetes import client

    with cluster(args.owner) as (api_client, where):
        print(f"bench_kubernetes against {where}; medians beside raw baselines of the same run")
        api = client.CoreV1Api(api_client)
        template = KubernetesSandboxConfig(namespace=args.namespace, image=args.image, owner=args.owner)
        with KubernetesSandbox.create(template, api_client=api_client) as sandbox:
            sandbox.execute("true")
            sandbox.write(f"{template.workdir}/bench.txt", "hello\n" * 100)
            shell = RawShell(api, args.namespace, sandbox.id)
            try:
                ours, persistent, fresh = alternate(
                    args.iterations,
                    lambda: sandbox.execute("true"),
                    lambda: shell.run("/bin/sh -c true"),  # a process, as the helper spawns one
                    lambda: fresh_exec(api, args.namespace, sandbox.id, "true"),
                )
                row("execute true", ours, {"raw persistent": persistent, "raw fresh exec": fresh})
                ours, persistent = alternate(
                    args.iterations,
                    lambda: sandbox.read(f"{template.workdir}/bench.txt"),
                    lambda: shell.run(f"cat {template.workdir}/bench.txt"),
                )
                row("read small file", ours, {"raw persistent cat": persistent})
            finally:
                shell.close()
        ours, raw = [], []
        made: list[KubernetesSandbox] = []
        for _ in range(args.cold_iterations):  # the deletes after each are not counted
            ours.append(timed(lambda: made.append(KubernetesSandbox.create(template, api_client=api_client))))
            made.pop().destroy()
            raw.append(raw_cold_start(api, args.namespace, args.image))
        row("cold start (to Ready)", ours, {"raw create->Running": raw})
        with KubernetesProvider(template, api_client=api_client, pool_size=2, sweep_interval=None) as pool:
            acquired: list[float] = []
            holder: list[KubernetesSandbox] = []
            for _ in range(args.cold_iterations):
                pool.wait_filled(300)
                acquired.append(timed(lambda: holder.append(pool.acquire())))
                holder.pop().destroy()
            row("warm acquisition", acquired, {})


if __name__ == "__main__":
    main()
