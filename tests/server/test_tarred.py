"""A snapshot's tar made by the sandbox's exec helper (`sandboxes.server.tarred`, the program
`sandboxes._helper._tar`) holds the same entries, and answers the same manifest, as the service's
own one-pass tar of the same tree (`manifest.Recorder`), in a local jail: every kind of file; what
no archive restores is refused, naming it; an answer past its bounds or grammar is refused."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterator

import pytest
from support import HAS_BWRAP, needs
from test_service_snapshots import MAKE_TREE

from sandboxes.local import LocalSandbox
from sandboxes.server.archive import write_local_archive
from sandboxes.server.errors import ServiceError
from sandboxes.server.manifest import FileEntry, Recorder, survey
from sandboxes.server.tarred import _Answer, _result, archive_by_helper


@pytest.fixture(scope="module")
def jail() -> Iterator[LocalSandbox]:
    needs(HAS_BWRAP, "bubblewrap is not installed")
    with LocalSandbox.create() as sandbox:
        made = sandbox.execute(f"mkdir tree && cd tree && SMALL_FILES=200 && {MAKE_TREE}", timeout=60)
        assert made.exit_code == 0, made
        yield sandbox


def _ordered(entries: list[FileEntry]) -> list[FileEntry]:
    return sorted(entries, key=lambda entry: entry.path)


def test_the_helpers_tar_is_the_services_own_of_the_same_tree(jail: LocalSandbox) -> None:
    tree = f"{jail.root}/tree"
    by_helper = io.BytesIO()
    manifest = archive_by_helper(jail, tree, by_helper, max_members=10_000)
    assert manifest is not None
    recorder, by_service = Recorder("tree", max_members=10_000), io.BytesIO()
    uid, gid = jail.user_ids
    write_local_archive(str(jail.root), tree, by_service, uid=uid, gid=gid, transform=recorder)
    expected = _ordered(recorder.entries())
    assert len(expected) > 200
    assert _ordered(manifest) == expected
    for written in (by_helper, by_service):
        written.seek(0)
        found, stopped = survey(written)
        assert stopped is None
        assert _ordered(found) == expected
    assert {entry.type for entry in manifest} == {"file", "dir", "symlink"}
    assert any(entry.size == 0 for entry in manifest)
    assert any(entry.mode == 0o600 for entry in manifest)


def test_what_no_archive_restores_is_refused_naming_it(jail: LocalSandbox) -> None:
    made = jail.execute("mkdir bad && mkfifo bad/pipe && ln -s /etc/passwd bad/out && ln -s ../.. bad/up", timeout=30)
    assert made.exit_code == 0, made
    with pytest.raises(ServiceError) as refused:
        archive_by_helper(jail, f"{jail.root}/bad", io.BytesIO(), max_members=100)
    assert refused.value.code == "invalid_request"
    for named in ("pipe (a device or FIFO)", "out (a symbolic link out of the tree: /etc/passwd)", "up (a symbolic"):
        assert named in refused.value.message
    with pytest.raises(ServiceError) as too_many:
        archive_by_helper(jail, f"{jail.root}/tree", io.BytesIO(), max_members=10)
    assert too_many.value.code == "too_large"
    with pytest.raises(ServiceError) as missing:
        archive_by_helper(jail, f"{jail.root}/nowhere", io.BytesIO(), max_members=10)
    assert missing.value.code == "file_not_found"


def test_a_store_that_refuses_a_write_ends_the_command(jail: LocalSandbox) -> None:
    class Full(io.BytesIO):
        def write(self, data: object) -> int:
            raise ServiceError("quota_exceeded", "over")

    with pytest.raises(ServiceError) as refused:
        archive_by_helper(jail, f"{jail.root}/tree", Full(), max_members=10_000)
    assert refused.value.code == "quota_exceeded"
    assert os.path.isdir(f"{jail.root}/tree")


def test_pseudo_files_are_what_a_read_in_the_jail_gives(jail: LocalSandbox) -> None:
    """``/proc`` says its files hold 0 bytes: each member, and its manifest entry, is what a read
    gives, not an empty file."""
    by_helper = io.BytesIO()
    manifest = archive_by_helper(jail, "/proc/sys/kernel/random", by_helper, max_members=100)
    assert manifest is not None
    read = jail.execute("cat /proc/sys/kernel/random/boot_id", timeout=30).output.encode()
    [boot_id] = [entry for entry in manifest if entry.path == "boot_id"]
    assert read.endswith(b"\n")
    assert (boot_id.size, boot_id.sha256) == (len(read), hashlib.sha256(read).hexdigest())
    by_helper.seek(0)
    found, stopped = survey(by_helper)
    assert stopped is None
    assert _ordered(found) == _ordered(manifest)
    assert all(entry.size > 0 for entry in manifest)


def test_a_file_changed_while_it_was_read_is_refused_naming_it() -> None:
    answer = _Answer(io.BytesIO(), 10)
    answer(b"E file_changed %s %s\n" % (b"d/log".hex().encode(), b"it grew while it was read".hex().encode()), "stderr")
    with pytest.raises(ServiceError) as refused:
        _result(answer, "/workspace", 1)
    assert (refused.value.code, refused.value.status) == ("file_changed", 409)
    assert refused.value.message == "/workspace/d/log: it grew while it was read"


def _fed(answer: _Answer, *chunks: bytes) -> str | None:
    for chunk in chunks:
        answer(chunk, "stderr")
    return answer.garbled


def test_an_answer_past_its_bounds_or_grammar_is_refused() -> None:
    entry = b"M 61 f 644 1 " + b"0" * 64 + b" -\n"
    assert _fed(_Answer(io.BytesIO(), 2), entry, entry, b"K 3\n") is None
    assert "more than 4 answer lines" in str(_fed(_Answer(io.BytesIO(), 2), entry * 5))
    assert "longer than" in str(_fed(_Answer(io.BytesIO(), 2), b"M " + b"6" * 20000))
    assert "not a plain relative one" in str(_fed(_Answer(io.BytesIO(), 2), b"M 2e2e2f61 f 644 1 - -\n"))
    assert "not a plain relative one" in str(_fed(_Answer(io.BytesIO(), 2), b"M 2f61 f 644 1 - -\n"))
    assert "not a plain relative one" in str(_fed(_Answer(io.BytesIO(), 2), b"R 612f2f62\n"))
    assert "does not parse" in str(_fed(_Answer(io.BytesIO(), 2), b"M zz f 644 1 - -\n"))
    assert "no known type" in str(_fed(_Answer(io.BytesIO(), 2), b"M 61 x 644 1 - -\n"))
    assert "after its last" in str(_fed(_Answer(io.BytesIO(), 2), b"K 0\n", entry))
    assert "no known kind" in str(_fed(_Answer(io.BytesIO(), 2), b"Q\n"))
