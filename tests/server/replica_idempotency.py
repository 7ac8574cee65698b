"""One ``Idempotency-Key`` raced across two replicas of the service over ONE shared backend:
each replica looks, finds nothing and creates, so only the backend can arbitrate (the key names
the sandbox there, and a second sandbox of that name is refused). A backend's replica test class
adds `OneKeyAcrossReplicas` beside `replica_scenarios.ReplicaScenarios`, whose fixtures it uses."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
from service_harness import Running, error_of

from sandboxes.server.backends import LABEL_USER_PREFIX

URL = "/v1/sandboxes"
CREATES = 6
"""Concurrent creates with one key, split evenly across the two replicas."""


class OneKeyAcrossReplicas:
    def test_one_key_raced_across_replicas_makes_one_sandbox(
        self, pair: tuple[Running, Running], recorded: Callable[[], dict[str, dict[str, str]]]
    ) -> None:
        key, race = str(uuid.uuid4()), uuid.uuid4().hex
        body = {"ttl": 300, "labels": {"race": race}}
        start = threading.Barrier(CREATES)

        def send(client: httpx.Client) -> httpx.Response:
            start.wait(timeout=30)  # all at once: every replica looks before either has made it
            return client.post(URL, json=body, headers={"Idempotency-Key": key})

        def made() -> set[str]:
            return {sid for sid, labels in recorded().items() if labels.get(f"{LABEL_USER_PREFIX}race") == race}

        with contextlib.ExitStack() as stack:
            clients = [stack.enter_context(pair[i % 2].client("alice")) for i in range(CREATES)]
            try:
                with ThreadPoolExecutor(CREATES) as pool:
                    answers = list(pool.map(send, clients))
                assert [a.status_code for a in answers] == [201] * CREATES, [a.text for a in answers]
                sandboxes = made()
                assert len(sandboxes) == 1, f"{len(sandboxes)} sandboxes made with one key: {sorted(sandboxes)}"
                assert {a.json()["id"] for a in answers} == sandboxes
                replayed = [a.headers.get("idempotent-replayed") for a in answers]
                assert sorted(replayed, key=str) == sorted([None] + ["true"] * (CREATES - 1), key=str)
                other = clients[1].post(URL, json={"ttl": 300}, headers={"Idempotency-Key": key})
                assert (other.status_code, error_of(other)) == (422, "invalid_request"), other.text
            finally:
                for sandbox_id in made():
                    clients[0].delete(f"{URL}/{sandbox_id}")
