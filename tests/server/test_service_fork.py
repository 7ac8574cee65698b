"""Fork through the service, on the local jail: three new sandboxes with the forked one's files
(one snapshot, restored into each at once, each verified), and a fork repeated with its
``Idempotency-Key`` answers the same three sandboxes and the same snapshot, making nothing more."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from service_harness import Running, create, execute, running, settings_for
from support import HAS_BWRAP, SESSION_OWNER, needs


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    needs(HAS_BWRAP, "bubblewrap is not installed")
    owner = f"{SESSION_OWNER}-fork-{uuid.uuid4().hex[:6]}"
    with running(settings_for(tmp_path_factory.mktemp("fork"), owner=owner)) as svc:
        yield svc


def _fork(client: httpx.Client, sandbox_id: str, key: str) -> httpx.Response:
    return client.post(f"/v1/sandboxes/{sandbox_id}/fork", json={"count": 3}, headers={"Idempotency-Key": key})


def test_three_forks_have_the_files_and_a_retry_answers_the_same(service: Running) -> None:
    with service.client("alice") as client:
        source = create(client, labels={"team": "qa"})["id"]
        made = execute(client, source, "mkdir -p d && printf 'state\\n' > d/kept && chmod 600 d/kept && echo ok")
        assert made["output"] == "ok\n"
        key = str(uuid.uuid4())
        forked = _fork(client, source, key)
        assert forked.status_code == 201, forked.text
        children = forked.json()["sandboxes"]
        ids = [child["id"] for child in children]
        assert len(set(ids)) == 3
        assert source not in ids
        for child in children:
            assert child["labels"] == {"team": "qa", "forked-from": source}
            assert execute(client, child["id"], "cat d/kept; stat -c %a d/kept")["output"] == "state\n600\n"
        execute(client, ids[0], "echo changed > d/kept")
        assert execute(client, source, "cat d/kept")["output"] == "state\n"  # each its own copy

        again = _fork(client, source, key)
        assert again.status_code == 201, again.text
        assert [child["id"] for child in again.json()["sandboxes"]] == ids
        assert again.json()["snapshot"] == forked.json()["snapshot"]
        assert len(client.get("/v1/snapshots").json()["snapshots"]) == 1
        listed = {item["id"] for item in client.get("/v1/sandboxes").json()["sandboxes"]}
        assert listed == {source, *ids}
