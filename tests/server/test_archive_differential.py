"""The same tree, made in a local jail and in a Docker container, answers the same: its snapshot
(the exec helper's program in each, `sandboxes.server.tarred`) the same manifest, and its ``GET
/archive`` (the service's own reading of a local root, ``tar`` in a container) the same members:
names, types, modes, link targets and every file's bytes."""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support import HAS_BWRAP, SESSION_OWNER, needs
from test_service_snapshots import MAKE_TREE

from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.local import LocalSandbox
from sandboxes.server.archive import open_local_archive
from sandboxes.server.backends import _open_streamed_archive
from sandboxes.server.tarred import archive_by_helper

MADE = "mkdir tree && cd tree && SMALL_FILES=20 && " + MAKE_TREE.replace(
    "head -c 70000 /dev/urandom", "seq 100000 | head -c 70000", 1
)
"""`MAKE_TREE` with the same bytes in both: its blob not random."""


@pytest.fixture(scope="module")
def jail() -> Iterator[LocalSandbox]:
    needs(HAS_BWRAP, "bubblewrap is not installed")
    with LocalSandbox.create() as sandbox:
        made = sandbox.execute(MADE, timeout=60)
        assert made.exit_code == 0, made
        yield sandbox


@pytest.fixture(scope="module")
def container(docker_client: Any, runtime_image: str) -> Iterator[DockerSandbox]:
    config = DockerSandboxConfig(image=runtime_image, owner=SESSION_OWNER)
    with DockerSandbox.create(config, client=docker_client) as sandbox:
        made = sandbox.execute(MADE, timeout=60)
        assert made.exit_code == 0, made
        yield sandbox


def _tree(sandbox: LocalSandbox | DockerSandbox) -> str:
    return f"{sandbox.workdir}/tree"


def test_a_snapshot_of_the_same_tree_is_the_same_manifest(jail: LocalSandbox, container: DockerSandbox) -> None:
    manifests = []
    for sandbox in (jail, container):
        manifest = archive_by_helper(sandbox, _tree(sandbox), io.BytesIO(), max_members=1000)
        assert manifest is not None
        manifests.append(sorted(manifest, key=lambda entry: entry.path))
    assert len(manifests[0]) > 20
    assert manifests[0] == manifests[1]


def _members(produce: Callable[[Callable[[bytes], None]], None]) -> dict[str, tuple[str, int, str]]:
    """Each member of the tar ``produce`` emits: (its type, its mode, its link or sha256)."""
    chunks: list[bytes] = []
    produce(chunks.append)
    found = {}
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        for member in tar:
            content = tar.extractfile(member) if member.isreg() else None
            kept = member.linkname if content is None else hashlib.sha256(content.read()).hexdigest()
            found[member.name] = (member.type.decode(), member.mode, kept)
    return found


def test_get_archive_of_the_same_tree_is_the_same_members(jail: LocalSandbox, container: DockerSandbox) -> None:
    uid, gid = jail.user_ids
    local = _members(open_local_archive(str(jail.root), _tree(jail), uid=uid, gid=gid, limit=1 << 20))
    docker = _members(_open_streamed_archive(container, _tree(container), 1 << 20))
    assert len(local) > 20
    assert local == docker
