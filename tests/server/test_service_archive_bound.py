"""``GET /archive`` streams no file bigger than ``max_archive_file_bytes``, whoever made the
tar (the service for a local sandbox, ``tar`` in a Docker one): a single file over it is a
``too_large`` before any byte; in a tree, the stream is cut at the big file's header. The tar
headers are read as they pass (`sandboxes.server.members`), pax and GNU long names included.
A pseudo-file (``/proc``, ``/sys``: its size says 0 or a page) is archived as a read gives it,
within the same bound."""

from __future__ import annotations

import base64
import io
import tarfile
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from service_harness import Running, create, error_of, execute, running, settings_for
from support import SESSION_OWNER

from sandboxes.docker import DockerTemplate
from sandboxes.server.errors import ServiceError
from sandboxes.server.members import MemberBound

LIMIT = 1 << 20


@pytest.fixture(scope="module", params=["local", "docker"])
def service(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    data_dir = tmp_path_factory.mktemp(f"archive-bound-{request.param}")
    if request.param == "local":
        with running(settings_for(data_dir, max_archive_file_bytes=LIMIT)) as svc:
            yield svc
        return
    template = DockerTemplate(
        backend="docker",
        image=request.getfixturevalue("runtime_image"),
        cpus=0.5,
        memory="256m",
        labels={"io.sandboxes.test-session": SESSION_OWNER},
    )
    settings = settings_for(
        data_dir, owner=SESSION_OWNER, templates={"default": template}, max_archive_file_bytes=LIMIT
    )
    with running(settings, docker_client=request.getfixturevalue("docker_client")) as svc:
        yield svc


@pytest.fixture(scope="module")
def made(service: Running) -> Iterator[tuple[httpx.Client, dict[str, Any]]]:
    """A sandbox with ``tree/`` (a small file, then one over the bound), ``big`` (over it) and
    ``fits`` (exactly at it)."""
    with service.client("alice") as client:
        sandbox = create(client)
        script = (
            f"mkdir tree && head -c 300000 /dev/urandom > tree/a && head -c {LIMIT + 1} /dev/zero > tree/b"
            f" && head -c {LIMIT + 1} /dev/zero > big && head -c {LIMIT} /dev/urandom > fits"
        )
        assert execute(client, sandbox["id"], script)["exit_code"] == 0
        yield client, sandbox
        client.delete(f"/v1/sandboxes/{sandbox['id']}")


def _archive(client: httpx.Client, sandbox: dict[str, Any], name: str) -> httpx.Response:
    return client.get(f"/v1/sandboxes/{sandbox['id']}/archive", params={"path": f"{sandbox['workdir']}/{name}"})


def test_a_file_over_the_bound_is_refused_before_any_byte(made: tuple[httpx.Client, dict[str, Any]]) -> None:
    client, sandbox = made
    refused = _archive(client, sandbox, "big")
    assert (refused.status_code, error_of(refused)) == (413, "too_large"), refused.content[:200]
    assert "max_archive_file_bytes" in refused.json()["message"]


def test_a_tree_is_cut_at_the_file_over_the_bound(made: tuple[httpx.Client, dict[str, Any]]) -> None:
    client, sandbox = made
    url = f"/v1/sandboxes/{sandbox['id']}/archive"
    received: list[bytes] = []
    with client.stream("GET", url, params={"path": f"{sandbox['workdir']}/tree"}) as response:
        if response.status_code == 200:  # the small file came first: the stream breaks at the big one
            with pytest.raises(httpx.HTTPError):
                received.extend(response.iter_bytes())
        else:
            response.read()
            assert (response.status_code, error_of(response)) == (413, "too_large")
    assert sum(map(len, received)) < LIMIT


PSEUDO_FILES = ["/proc/sys/kernel/random/boot_id", "/proc/cpuinfo", "/sys/devices/system/cpu/online"]
"""Pseudo-files whose content is the same at every read: boot_id and cpuinfo say 0 bytes, the
``/sys`` attribute a page."""
IN_A_JAIL = PSEUDO_FILES[:2]
"""Those a local jail holds: it mounts no ``/sys/devices``."""


def assert_pseudo_files_are_archived_as_read(
    client: httpx.Client, sandbox: dict[str, Any], paths: list[str] = PSEUDO_FILES
) -> None:
    """Each of ``paths`` is one member holding what ``cat`` prints, and ``/proc/self/status``
    (the archiver's own) is a whole status: not an empty member, nor one padded to a page."""
    url = f"/v1/sandboxes/{sandbox['id']}/archive"
    for path in paths:
        printed = execute(client, sandbox["id"], f"base64 -w0 {path}")
        assert printed["exit_code"] == 0, printed
        answer = client.get(url, params={"path": path})
        assert answer.status_code == 200, answer.text[:200]
        with tarfile.open(fileobj=io.BytesIO(answer.content)) as tar:
            [member] = tar.getmembers()
            content = tar.extractfile(member)
            assert content is not None
            assert (member.name, content.read()) == (path.rsplit("/", 1)[1], base64.b64decode(printed["output"]))
    answer = client.get(url, params={"path": "/proc/self/status"})
    assert answer.status_code == 200, answer.text[:200]
    with tarfile.open(fileobj=io.BytesIO(answer.content)) as tar:
        content = tar.extractfile("status")
        assert content is not None
        status = content.read()
    assert status.startswith(b"Name:\t"), status[:200]
    assert b"\nPid:\t" in status, status
    assert status.endswith(b"\n"), status


def test_a_pseudo_file_is_archived_as_a_read_gives_it(
    service: Running, made: tuple[httpx.Client, dict[str, Any]]
) -> None:
    """On Docker and in a local jail alike (the tar made in the sandbox, of its own ``/proc``
    and ``/sys``) every pseudo-file is its read."""
    client, sandbox = made
    assert_pseudo_files_are_archived_as_read(
        client, sandbox, IN_A_JAIL if sandbox["backend"] == "local" else PSEUDO_FILES
    )


def test_a_pseudo_file_over_the_bound_is_refused(made: tuple[httpx.Client, dict[str, Any]]) -> None:
    """``/proc/kallsyms`` says 0 bytes and holds megabytes: ``too_large``, as a big file is."""
    client, sandbox = made
    assert int(execute(client, sandbox["id"], "wc -c < /proc/kallsyms")["output"]) > LIMIT
    refused = client.get(f"/v1/sandboxes/{sandbox['id']}/archive", params={"path": "/proc/kallsyms"})
    assert (refused.status_code, error_of(refused)) == (413, "too_large"), refused.content[:200]
    assert "max_archive_file_bytes" in refused.json()["message"]


def test_a_file_at_the_bound_streams_whole(made: tuple[httpx.Client, dict[str, Any]]) -> None:
    client, sandbox = made
    answer = _archive(client, sandbox, "fits")
    assert answer.status_code == 200, answer.text[:200]
    with tarfile.open(fileobj=io.BytesIO(answer.content)) as tar:
        member = tar.getmember("fits")
        assert member.size == LIMIT


@pytest.mark.parametrize("form", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_headers_are_followed_through_long_names(form: int) -> None:
    """A long name is a header of its own (pax ``x``, GNU ``L``) before its member's: the sizes
    are still read where they are, in chunks cut anywhere."""
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w", format=form) as tar:
        for name, size in [("n" * 300, 1000), ("é" * 200, LIMIT), ("last", LIMIT + 1)]:
            entry = tarfile.TarInfo(name)
            entry.size = size
            tar.addfile(entry, io.BytesIO(bytes(size)))
    data = stream.getvalue()
    bound = MemberBound(LIMIT, "x")
    cut = data.index(b"last\0")  # the last member's header
    for at in range(0, cut - cut % 512, 333):
        bound.feed(data[at : min(at + 333, cut - cut % 512)])
    with pytest.raises(ServiceError) as refused:
        bound.feed(data[cut - cut % 512 :])
    assert refused.value.code == "too_large"


def test_a_stream_out_of_step_is_refused() -> None:
    with pytest.raises(ServiceError) as garbled:
        MemberBound(LIMIT, "x").feed(b"not a tar header".ljust(512, b"!"))
    assert garbled.value.code == "backend_unavailable"
