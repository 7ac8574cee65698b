"""A restore into a container goes through its exec helper as one command (`sandboxes.server.untar`):
the tree of every kind comes back exactly; nothing is written through a symbolic link the new
sandbox holds where the snapshot has a directory; a truncated or edited snapshot is refused,
naming the files; an answer of the helper that breaks its bounds is refused; and a sandbox that
runs no helper (busybox, no python3) is still restored, by its commands."""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import test_busybox
from service_harness import Running, create, execute, running, settings_for
from support import SESSION_OWNER
from test_service_snapshots import _listing, _made, _snapshot, _store

from sandboxes._mux import MuxClient
from sandboxes.docker import DockerSandbox, DockerTemplate
from sandboxes.server import keeping, snapshotting
from sandboxes.server.errors import ServiceError
from sandboxes.server.untar import _Answer, _result

busybox_image = test_busybox.busybox_image  # the fixture
CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}
PORT = 8791
LINKED = f"ln -s /tmp /workspace/sub && exec python3 -m http.server -b 127.0.0.1 {PORT}"
"""The start of a template whose sandboxes hold ``sub`` as a symbolic link to /tmp, made before
the port opens, so before any restore into them."""


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, docker_client: Any, runtime_image: str, request: pytest.FixtureRequest
) -> Iterator[Running]:
    owner = f"{SESSION_OWNER}-snaph-{uuid.uuid4().hex[:6]}"
    common: dict[str, Any] = {"backend": "docker", "image": runtime_image, "cpus": 0.5, "memory": "256m"}
    templates: dict[str, Any] = {
        "default": DockerTemplate(**common, labels=CLEANUP),
        "linked": DockerTemplate(**common, labels=CLEANUP, start=LINKED, ready_port=PORT),
        "busybox": DockerTemplate(**{**common, "image": request.getfixturevalue("busybox_image")}, labels=CLEANUP),
    }
    settings = settings_for(tmp_path_factory.mktemp("snaph"), owner=owner, templates=templates)
    with running(settings, docker_client=docker_client) as svc:
        yield svc


@pytest.fixture
def client(service: Running) -> Iterator[httpx.Client]:
    """Alice's client; the sandboxes a test made are deleted after it (the tenant may hold ten)."""
    with service.client("alice") as client:
        yield client
        for sandbox in client.get("/v1/sandboxes").json()["sandboxes"]:
            client.delete(f"/v1/sandboxes/{sandbox['id']}")


def counting_restore(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The commands (and file ops) each restore sends its sandbox's exec helper, one count per
    restore as it ends, counted on its own thread alone (the service samples metrics through
    the helper meanwhile; a fork restores on several threads at once)."""
    counts: list[int] = []
    restoring: dict[int, int] = {}
    register: Callable[..., Any] = MuxClient.register
    restore: Callable[..., None] = keeping.restore

    def counted_register(self: MuxClient, pending: Any) -> Any:
        thread = threading.get_ident()
        if thread in restoring:
            restoring[thread] += 1
        return register(self, pending)

    def counted_restore(*args: Any) -> None:
        thread = threading.get_ident()
        restoring[thread] = 0
        try:
            restore(*args)
        finally:
            counts.append(restoring.pop(thread))

    monkeypatch.setattr(MuxClient, "register", counted_register)
    monkeypatch.setattr(keeping, "restore", counted_restore)
    return counts


def test_a_restore_into_a_container_is_one_helper_command(
    client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _made(client, small_files=50)
    snapshot = _snapshot(client, source)
    counts = counting_restore(monkeypatch)
    restored = create(client, snapshot=snapshot["id"])["id"]
    assert counts == [1]
    assert _listing(client, restored) == _listing(client, source)


def test_a_fork_restores_each_container_through_one_helper_command(
    client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _made(client, small_files=10)
    counts = counting_restore(monkeypatch)
    forked = client.post(f"/v1/sandboxes/{source}/fork", json={"count": 2})
    assert forked.status_code == 201, forked.text
    assert counts == [1, 1]
    expected = _listing(client, source)
    for child in forked.json()["sandboxes"]:
        assert _listing(client, child["id"]) == expected


def test_a_sandbox_without_python_is_restored_by_its_commands(
    client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No exec helper can run there: the restore recreates each member through the sandbox's
    commands, verified by archiving the tree back, as before."""
    source = create(client)["id"]
    made = execute(client, source, "mkdir d && printf 'box\\n' > d/f && chmod 640 d/f && ln -s d/f link && echo ok")
    assert made["output"] == "ok\n", made
    snapshot = _snapshot(client, source)
    counts = counting_restore(monkeypatch)
    restored = create(client, template="busybox", snapshot=snapshot["id"])["id"]
    assert counts == [0]
    assert execute(client, restored, "cat link; stat -c %a d/f")["output"] == "box\n640\n"


def test_a_directory_is_not_restored_through_a_symbolic_link_the_sandbox_made(client: httpx.Client) -> None:
    source = create(client, template="linked")["id"]
    made = execute(client, source, "rm sub && mkdir sub && printf kept > sub/file && echo ok")
    assert made["output"] == "ok\n", made
    snapshot = _snapshot(client, source)
    before = len(client.get("/v1/sandboxes").json()["sandboxes"])
    refused = client.post("/v1/sandboxes", json={"template": "linked", "snapshot": snapshot["id"]})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"] == "invalid_path"
    assert "/workspace/sub: goes through the symbolic link sub" in refused.json()["message"]
    assert len(client.get("/v1/sandboxes").json()["sandboxes"]) == before


def test_an_edited_or_truncated_snapshot_is_refused_naming_the_files(service: Running, client: httpx.Client) -> None:
    snapshot = _snapshot(client, _made(client, small_files=20))
    tar = next(_store(service).glob(f"*/{snapshot['id']}/0.tar"))
    data = tar.read_bytes()
    tar.write_bytes(data.replace(b"EDIT-ME-", b"EDITED!-", 1))
    refused = client.post("/v1/sandboxes", json={"snapshot": snapshot["id"]})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"] == "snapshot_mismatch"
    assert "edit-target.txt: sha256 differ" in refused.json()["message"]
    tar.write_bytes(data[: len(data) // 2])
    refused = client.post("/v1/sandboxes", json={"snapshot": snapshot["id"]})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"] == "snapshot_mismatch"
    assert ": missing" in refused.json()["message"]


def _fed(answer: _Answer, *chunks: bytes) -> str | None:
    for chunk in chunks:
        answer(chunk, "stdout")
    return answer.garbled


def test_an_answer_past_its_bounds_or_grammar_is_refused() -> None:
    entry = b"M 61 f 644 1 " + b"0" * 64 + b" -\n"
    assert _fed(_Answer(2, 1), entry, entry, b"K 2\n") is None
    assert "more than 2 members" in str(_fed(_Answer(2, 1), entry * 3))
    assert "longer than" in str(_fed(_Answer(2, 1), b"M " + b"6" * 20000))  # no newline yet: refused as it comes
    assert "more acknowledgements" in str(_fed(_Answer(2, 1), b"A 1\nA 2\n"))
    assert "does not parse" in str(_fed(_Answer(2, 1), b"M zz f 644 1 - -\n"))
    assert "no known type" in str(_fed(_Answer(2, 1), b"M 61 x 644 1 - -\n"))
    assert "not one" in str(_fed(_Answer(2, 1), b"M 61 f 644 1 abc -\n"))
    assert "after its last" in str(_fed(_Answer(2, 1), b"K 0\n", entry))
    answer = _Answer(2, 1)
    answer(b"x" * (70 << 10), "stderr")
    assert "stderr" in str(answer.garbled)


def test_a_refused_destination_is_named_once() -> None:
    """The program names a refused destination by its own absolute path, a member by its path
    under the destination: the answer names each once."""
    answer = _Answer(10, 10)
    answer(b"E invalid_path %s %s\n" % (b"/home/dest".hex().encode(), b"goes through a link".hex().encode()))
    with pytest.raises(ServiceError, match=r"^/home/dest: goes through a link$"):
        _result(answer, "/home/dest", 1)
    answer = _Answer(10, 10)
    answer(b"E invalid_path %s %s\n" % (b"sub/x".hex().encode(), b"goes through a link".hex().encode()))
    with pytest.raises(ServiceError, match=r"^/home/dest/sub/x: goes through a link$"):
        _result(answer, "/home/dest", 1)


def _manifest(service: Running, snapshot_id: str) -> list[dict[str, Any]]:
    data = json.loads(next(_store(service).glob(f"*/{snapshot_id}/manifest.json")).read_text())
    entries: list[dict[str, Any]] = data["parts"][0]["entries"]
    return sorted(entries, key=lambda entry: str(entry["path"]))


def test_a_snapshot_of_a_container_is_one_helper_command_the_same_as_tars(
    service: Running, client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exec helper makes the tar and its manifest: no ``docker exec`` of ``tar`` of its own,
    and the same snapshot, byte for byte and entry for entry, as ``tar -c`` rewritten by the
    service makes of the same tree (every kind of file)."""
    source = _made(client, small_files=50)
    streams: list[str] = []
    opened = DockerSandbox.open_output_stream

    def counted(self: DockerSandbox, command: str) -> Any:
        streams.append(command)
        return opened(self, command)

    monkeypatch.setattr(DockerSandbox, "open_output_stream", counted)
    by_helper = _snapshot(client, source)
    assert streams == []
    monkeypatch.setattr(snapshotting, "_taken_by_helper", lambda *args: None)  # the tar -c path
    by_tar = _snapshot(client, source)
    assert len(streams) == 1
    assert _manifest(service, by_helper["id"]) == _manifest(service, by_tar["id"])
    assert len(_manifest(service, by_helper["id"])) > 50
    tars = [next(_store(service).glob(f"*/{taken['id']}/0.tar")).read_bytes() for taken in (by_helper, by_tar)]
    assert tars[0] == tars[1]
    assert by_helper["bytes"] == by_tar["bytes"]
    assert by_helper["files"] == by_tar["files"]
    restored = create(client, snapshot=by_helper["id"])["id"]
    assert _listing(client, restored) == _listing(client, source)


def test_a_snapshot_by_the_helper_refuses_what_no_archive_restores(client: httpx.Client) -> None:
    source = create(client)["id"]
    made = execute(client, source, "mkdir d && mkfifo d/pipe && ln -s /etc/passwd out && ln -s ../../x d/up && echo ok")
    assert made["output"] == "ok\n", made
    refused = client.post(f"/v1/sandboxes/{source}/snapshots", json={})
    assert refused.status_code == 422, refused.text
    message = refused.json()["message"]
    assert refused.json()["error"] == "invalid_request"
    for named in ("d/pipe (a device or FIFO)", "out (a symbolic link out of the tree: /etc/passwd)", "d/up"):
        assert named in message
    missing = client.post(f"/v1/sandboxes/{source}/snapshots", json={"workspace": False, "paths": ["/nowhere"]})
    assert missing.status_code == 422, missing.text
    assert missing.json()["error"] == "file_not_found"


def test_a_snapshot_by_the_helper_keeps_a_pseudo_file_as_a_read_gives(service: Running, client: httpx.Client) -> None:
    """``/proc`` says its files hold 0 bytes: the snapshot keeps what a read gives, not empty files."""
    source = create(client)["id"]
    taken = client.post(
        f"/v1/sandboxes/{source}/snapshots", json={"workspace": False, "paths": ["/proc/sys/kernel/random"]}
    )
    assert taken.status_code == 201, taken.text
    entries = {entry["path"]: entry for entry in _manifest(service, taken.json()["id"])}
    read = execute(client, source, "cat /proc/sys/kernel/random/boot_id")["output"].encode()
    assert read.endswith(b"\n")
    assert (entries["boot_id"]["size"], entries["boot_id"]["sha256"]) == (len(read), hashlib.sha256(read).hexdigest())
    assert all(entry["size"] > 0 for entry in entries.values())
