"""The exec helper's native writes (`sandboxes._helper._files`) on a local jail: the same answers
and files as the scripts (`native_writes`), the path really taken, what is handed back to the
script, a lost answer never resent, and nothing left behind by a client that went away.

The Docker and SSH twins of these tests are in their backends' modules."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mux_faults import faulty
from native_writes import (
    assert_bad_op_refused,
    assert_file_ops_go_native,
    assert_native_writes_match_the_scripts,
    helper_client,
    write_call,
)
from support import HAS_BWRAP, needs, wait_for

from sandboxes import protocol as p
from sandboxes._mux._frames import _Pending, wire_spec
from sandboxes._mux._shipped import HELPER_SOURCES, ON_DEMAND_OPS, bootstrap
from sandboxes._output import OutputBuffer
from sandboxes.local import LocalSandbox, LocalSandboxConfig
from sandboxes.local import _helper as local_helper
from sandboxes.local import sandbox as local_sandbox


def _foreign_maker(sandbox: LocalSandbox) -> object:
    """A world-writable file owned by root on the host: inside the jail (mapped to another
    uid) it belongs to nobody the sandbox is."""

    def make(path: str) -> None:
        Path(path).write_bytes(b"someone else's\n")
        os.chmod(path, 0o666)
        assert sandbox.execute(f"test -O {path} || echo foreign").output == "foreign\n"

    return make


def test_native_writes_answer_what_the_scripts_answer(jail: LocalSandbox) -> None:
    make = _foreign_maker(jail) if os.geteuid() == 0 else None
    assert_native_writes_match_the_scripts(jail, str(jail.root), make)  # type: ignore[arg-type]


def test_file_ops_go_through_the_helper_without_a_process(jail: LocalSandbox) -> None:
    mux = helper_client(jail)
    path = f"{jail.root}/native.txt"
    assert jail.write(path, "one two\n").error is None
    assert jail.edit(path, "two", "three").occurrences == 1
    assert jail.upload_files([(f"{jail.root}/up.bin", b"\x00\xff")])[0].error is None
    assert mux.native_answers == 4  # the edit is two: its read, then its compare-and-swap
    assert jail.read(path).file_data == p.FileData("one three\n")
    assert mux.native_answers == 5
    jail.native_file_ops = False
    assert jail.write(path, "scripted\n").error is None
    assert jail.read(path).file_data == p.FileData("scripted\n")
    assert mux.native_answers == 5


def test_file_ops_and_a_binary_download_go_native(jail: LocalSandbox) -> None:
    assert_file_ops_go_native(jail, str(jail.root))


async def test_async_writes_go_native_too(jail: LocalSandbox) -> None:
    mux = helper_client(jail)
    assert (await jail.awrite(f"{jail.root}/a.txt", "async\n")).error is None
    assert (await jail.aedit(f"{jail.root}/a.txt", "async", "edited")).error is None
    assert mux.native_answers == 3
    assert (await jail.aread(f"{jail.root}/a.txt")).file_data == p.FileData("edited\n")


def test_the_hello_names_the_ops_the_native_code_answers() -> None:
    """The hello's list (`_loop.NATIVE_OPS`) is written out beside the code it names, which is
    imported only at the first file op: the two must not drift apart."""
    from sandboxes._helper import _listdir, _listing, _loop, _search, _usage, _xattrs

    names = ["write", "cas_write", "read_file", "download", "upload", *_search.SEARCH_OPS, *_listing.LISTING_OPS]
    names += _usage.USAGE_OPS + _listdir.LIST_DIR_OPS + _xattrs.METADATA_OPS
    assert sorted(_loop.NATIVE_OPS) == sorted(names)
    # The ops whose modules are shipped with their first request, named by those modules.
    assert {name: ("_listdir",) for name in _listdir.LIST_DIR_OPS} | {
        name: ("_usage",) for name in _usage.USAGE_OPS
    } | {name: ("_xattrs",) for name in _xattrs.METADATA_OPS} == ON_DEMAND_OPS


def test_the_file_ops_compile_while_the_helper_idles_and_a_failure_hands_them_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file ops' code is compiled once the helper idles (`_server.NATIVE_IDLE`), not at its
    start, so no command waits for it: here it cannot compile, the helper says so on its own
    with no file op sent, runs commands all along, and answers N to the ops (the script does
    them)."""
    needs(HAS_BWRAP, "bubblewrap not installed")
    broken = bootstrap({**HELPER_SOURCES, "_files": "def broken(:\n"})
    monkeypatch.setattr(local_sandbox, "HELPER_COMMAND", (*local_sandbox.HELPER_COMMAND[:-1], broken))
    with LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap")) as sandbox:
        mux = helper_client(sandbox)
        helper = sandbox._helper_process
        assert helper is not None
        wait_for(lambda: b"native file ops unavailable: SyntaxError" in helper.stderr, "the idle compile's failure")
        assert mux.native_declined == 0
        assert sandbox.write(f"{sandbox.root}/a.txt", "by the script\n").error is None
        assert (mux.native_answers, mux.native_declined) == (0, 1)
        assert sandbox.read(f"{sandbox.root}/a.txt").file_data == p.FileData("by the script\n")
        assert mux.native_declined == 2
        assert sandbox.execute("echo served on").output == "served on\n"
        assert helper_client(sandbox) is mux
        assert helper.stderr.count(b"native file ops unavailable") == 1  # tried once


def test_a_native_write_whose_answer_was_lost_is_never_resent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    needs(HAS_BWRAP, "bubblewrap not installed")
    streams = faulty(monkeypatch, local_helper)
    with LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap")) as sandbox:
        assert sandbox.execute("true").exit_code == 0
        first = helper_client(sandbox)
        streams[-1].lose_answers()
        lost = sandbox.write(f"{sandbox.root}/once.txt", "written\n")
        assert lost.error == p.CONNECTION_LOST, lost
        assert len(streams) == 1, "the write was sent to a second helper"
        second = helper_client(sandbox)  # starts the next helper, which never saw the write
        assert second is not first
        assert second.native_answers == 0
        assert sandbox.read(f"{sandbox.root}/once.txt").file_data == p.FileData("written\n")  # done, by the first


def test_a_native_write_not_sent_whole_is_resent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    needs(HAS_BWRAP, "bubblewrap not installed")
    streams = faulty(monkeypatch, local_helper)
    with LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap")) as sandbox:
        assert sandbox.execute("true").exit_code == 0
        failing = streams[-1]
        failing.fail_next_request()
        assert sandbox.write(f"{sandbox.root}/resent.txt", "resent\n").error is None
        assert failing.failed_sends == 1
        assert failing.sends_after_failure == 0
        assert len(streams) == 2
        assert helper_client(sandbox).native_answers == 1
        assert sandbox.read(f"{sandbox.root}/resent.txt").file_data == p.FileData("resent\n")


def test_a_client_gone_midway_leaves_no_temporary_file(jail: LocalSandbox) -> None:
    """The bytes stop before the announced size and the stream ends (the client is gone): nothing
    is placed, the staged file goes, the old file stays whole. (A helper killed outright leaves
    the staged file, as a killed shell does; never a torn target.)"""
    target = jail.root / "kept.txt"
    assert jail.write(str(target), "old\n").error is None  # the sandbox's own (one made here would be foreign)
    mux = helper_client(jail)
    call = write_call(str(target), b"x" * 100)
    ident, _pending = mux.register(_Pending(OutputBuffer(0)))
    assert call.native is not None
    mux._send(b"F", ident, wire_spec({"op": list(call.native)}))
    mux._send(b"I", ident, b"x" * 50)
    assert jail.execute(f"ls -A {jail.root}").output.count(".sandboxes-write.") == 1  # staged, in flight
    assert not _pending.not_native
    helper = jail._helper_process
    assert helper is not None
    assert helper.process.stdin is not None
    helper.process.stdin.close()  # the stream ends (a jail's close would SIGKILL it, as a lost host would)
    helper.process.wait(30)
    assert [n for n in os.listdir(jail.root) if n.startswith(".sandboxes-write.")] == []
    assert target.read_text() == "old\n"


@pytest.mark.parametrize("native", [True, False], ids=["native", "scripted"])
def test_parents_deeper_than_pythons_recursion_limit_are_created(jail: LocalSandbox, native: bool) -> None:
    """``mkdir -p`` has no depth limit; neither has the helper's (`os.makedirs` recursed once per
    level and answered a RecursionError)."""
    jail.native_file_ops = native
    before = helper_client(jail).native_answers
    deep = f"{jail.root}/{native}/" + "d/" * 1200 + "bottom.txt"
    assert jail.write(deep, "bottom").error is None
    assert jail.read(deep).file_data == p.FileData("bottom")
    assert helper_client(jail).native_answers - before == (2 if native else 0)
    assert jail.execute(f"rm -rf {jail.root}/{native}").exit_code == 0


@pytest.mark.parametrize(
    "op",
    [["download"], ["download", "x", "/a"], ["download", "-", "relative"], ["upload", "tok", "/a"]],
    ids=["no paths", "bad limit", "relative path", "no size"],
)
def test_a_malformed_transfer_is_refused_and_the_helper_serves_on(jail: LocalSandbox, op: list[str]) -> None:
    """What the client never sends, a forged or broken one might: an error, nothing written."""
    assert_bad_op_refused(jail, op)
