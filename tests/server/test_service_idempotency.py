"""Over real HTTP: ``Idempotency-Key`` on create. One key, per tenant, makes one sandbox however
often (and however concurrently) the create is sent, across a restart of the service (also one
killed before it saved its state), and on a shared backend across replicas."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_harness import Running, error_of, running, settings_for
from support import SESSION_OWNER

from sandboxes.docker import DockerTemplate

URL = "/v1/sandboxes"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with running(settings_for(tmp_path_factory.mktemp("idempotency"))) as svc:
        yield svc


def _keyed(client: httpx.Client, key: str, **body: Any) -> httpx.Response:
    return client.post(URL, json=body, headers={"Idempotency-Key": key})


def _ids(client: httpx.Client) -> list[str]:
    return [info["id"] for info in client.get(URL).json()["sandboxes"]]


def test_a_repeated_create_answers_the_sandbox_its_key_made(service: Running) -> None:
    key = str(uuid.uuid4())
    with service.client("alice") as alice:
        before = set(_ids(alice))
        first = _keyed(alice, key, labels={"job": "a"})
        again = _keyed(alice, key, labels={"job": "a"})
        try:
            assert (first.status_code, again.status_code) == (201, 201), again.text
            assert again.json() == first.json()
            assert again.headers["idempotent-replayed"] == "true"
            assert "idempotent-replayed" not in first.headers
            assert set(_ids(alice)) - before == {first.json()["id"]}
        finally:
            alice.delete(f"{URL}/{first.json()['id']}")


def test_the_same_key_with_another_body_is_refused(service: Running) -> None:
    key = str(uuid.uuid4())
    with service.client("alice") as alice:
        first = _keyed(alice, key, labels={"job": "a"})
        try:
            other = _keyed(alice, key, labels={"job": "b"})
            assert (other.status_code, error_of(other)) == (422, "invalid_request")
            assert "another body" in other.json()["message"]
        finally:
            alice.delete(f"{URL}/{first.json()['id']}")


def test_keys_are_per_tenant_and_checked(service: Running) -> None:
    key = str(uuid.uuid4())
    with service.client("alice") as alice, service.client("bob") as bob:
        mine, theirs = _keyed(alice, key), _keyed(bob, key)
        try:
            assert (mine.status_code, theirs.status_code) == (201, 201)
            assert mine.json()["id"] != theirs.json()["id"]
            assert "idempotent-replayed" not in theirs.headers
        finally:
            alice.delete(f"{URL}/{mine.json()['id']}")
            bob.delete(f"{URL}/{theirs.json()['id']}")
        too_long = _keyed(alice, "k" * 256)
        assert (too_long.status_code, error_of(too_long)) == (422, "invalid_request")


def test_concurrent_creates_with_one_key_make_one_sandbox(service: Running) -> None:
    key = str(uuid.uuid4())
    with service.client("alice") as alice:
        before = set(_ids(alice))
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: _keyed(alice, key), range(8)))
        made = {answer.json()["id"] for answer in answers}
        try:
            assert [answer.status_code for answer in answers] == [201] * 8
            assert len(made) == 1
            assert set(_ids(alice)) - before == made
            assert sum(answer.headers.get("idempotent-replayed") == "true" for answer in answers) == 7
        finally:
            for sandbox_id in made:
                alice.delete(f"{URL}/{sandbox_id}")


def test_a_deleted_sandbox_frees_its_key(service: Running) -> None:
    key = str(uuid.uuid4())
    with service.client("alice") as alice:
        first = _keyed(alice, key).json()
        assert alice.delete(f"{URL}/{first['id']}").status_code == 204
        second = _keyed(alice, key)
        assert second.status_code == 201
        assert second.json()["id"] != first["id"]
        alice.delete(f"{URL}/{second.json()['id']}")


@pytest.mark.parametrize("state_saved", [True, False], ids=["restarted", "killed-before-saving"])
def test_the_key_survives_a_restart(tmp_path: Path, state_saved: bool) -> None:
    """A restart adopts the sandbox with its key: from its state file, or (a service killed
    between making the sandbox and saving its state) from the record the backend keeps."""
    settings = settings_for(tmp_path)
    key = str(uuid.uuid4())
    with running(settings) as first, first.client("alice") as alice:
        made = _keyed(alice, key, ttl=600)
        assert made.status_code == 201, made.text
    sandbox_id = made.json()["id"]
    if not state_saved:
        (tmp_path / "state" / f"{sandbox_id}.json").unlink()
    with running(settings) as second, second.client("alice") as alice:
        again = _keyed(alice, key, ttl=600)
        assert (again.status_code, again.json()["id"]) == (201, sandbox_id), again.text
        assert again.headers["idempotent-replayed"] == "true"
        assert _ids(alice) == [sandbox_id]
        assert alice.delete(f"{URL}/{sandbox_id}").status_code == 204


def test_replicas_of_a_shared_backend_see_each_others_keys(
    docker_client: Any, runtime_image: str, tmp_path: Path
) -> None:
    """The key is a label of the container: another replica (or this one restarted) finds it."""
    template = DockerTemplate(
        backend="docker",
        image=runtime_image,
        cpus=0.5,
        memory="256m",
        labels={"io.sandboxes.test-session": SESSION_OWNER},
    )
    options: dict[str, Any] = {"owner": SESSION_OWNER, "templates": {"default": template}}
    key = str(uuid.uuid4())
    with (
        running(settings_for(tmp_path / "one", **options), docker_client=docker_client) as one,
        running(settings_for(tmp_path / "two", **options), docker_client=docker_client) as two,
        one.client("alice") as a,
        two.client("alice") as b,
    ):
        made = _keyed(a, key)
        assert made.status_code == 201, made.text
        try:
            again = _keyed(b, key)
            assert (again.status_code, again.json()["id"]) == (201, made.json()["id"]), again.text
            assert again.headers["idempotent-replayed"] == "true"
            other = _keyed(b, key, ttl=60)
            assert (other.status_code, error_of(other)) == (422, "invalid_request")
        finally:
            a.delete(f"{URL}/{made.json()['id']}")
