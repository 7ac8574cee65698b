"""``download_files`` bounds a batch in all, not only each file: each file of a batch gets its
share of ``max_batch_download_bytes`` (at least 64 KiB), and one past it answers
``file_too_large`` saying so, on the local jail, on Docker (whose big files take the bulk path)
and through the client (whose big files are streamed), synchronously and not."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server.service_harness import KEYS, running, settings_for
from support import HAS_BWRAP, SESSION_OWNER, needs

from sandboxes import protocol as p
from sandboxes.client import SandboxClient
from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.local import LocalSandbox, LocalSandboxConfig

BATCH = 4 << 20
BIG = 3 << 20
"""Over its share of a batch of two (2 MiB), within the batch's bound alone."""
SMALL = 100_000


def _files(sandbox: Any, root: str) -> tuple[str, str]:
    made = sandbox.execute(f"head -c {BIG} /dev/urandom > {root}/big && head -c {SMALL} /dev/zero > {root}/small")
    assert made.exit_code == 0, made
    return f"{root}/big", f"{root}/small"


def _assert_bounded(found: list[p.FileDownloadResponse], big: str, small: str) -> None:
    refused, kept = found
    assert (refused.path, refused.error, refused.content) == (big, p.FILE_TOO_LARGE, None), refused
    assert refused.error is not None
    assert "its share of a batch of 2 files" in (refused.message or ""), refused.message
    assert (kept.error, kept.content) == (None, bytes(SMALL))


@pytest.fixture(scope="module", params=["local", "docker"])
def sandbox(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if request.param == "local":
        needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
        root = tmp_path_factory.mktemp("batch")
        with LocalSandbox(config=LocalSandboxConfig(root_dir=root, isolation="bwrap")) as local:
            yield local
        return
    config = DockerSandboxConfig(image=request.getfixturevalue("runtime_image"), owner=SESSION_OWNER)
    with DockerSandbox.create(config, client=request.getfixturevalue("docker_client")) as docker:
        yield docker


def _root(sandbox: Any) -> str:
    return str(sandbox.root) if isinstance(sandbox, LocalSandbox) else "/workspace"


def test_a_batch_is_bounded_in_all(sandbox: Any) -> None:
    big, small = _files(sandbox, _root(sandbox))
    sandbox.max_batch_download_bytes = BATCH
    try:
        _assert_bounded(sandbox.download_files([big, small]), big, small)
        _assert_bounded(asyncio.run(sandbox.adownload_files([big, small])), big, small)
        [alone] = sandbox.download_files([big])
        assert (alone.error, len(alone.content or b"")) == (None, BIG)
    finally:
        del sandbox.max_batch_download_bytes


def test_the_clients_streamed_files_are_bounded_in_all(tmp_path: Path) -> None:
    """The service answers files over 1 MiB ``file_too_large`` inline; the client streams them,
    each up to its share of the client's batch bound."""
    settings = settings_for(tmp_path, max_inline_download_bytes=1 << 20)
    with (
        running(settings) as service,
        SandboxClient(service.url, KEYS["alice"], max_batch_download_bytes=BATCH) as client,
        client.create() as remote,
    ):
        root = remote.execute("pwd").output.strip()
        big, small = _files(remote, root)
        _assert_bounded(remote.download_files([big, small]), big, small)
        _assert_bounded(asyncio.run(remote.adownload_files([big, small])), big, small)
        [alone] = remote.download_files([big])
        assert (alone.error, len(alone.content or b"")) == (None, BIG)
