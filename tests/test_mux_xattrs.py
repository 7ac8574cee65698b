"""The exec helper's native ``e2b_metadata`` (`sandboxes._helper._xattrs`): E2B's file metadata as
``user.e2b.*`` extended attributes, set and read back through the helper of a local jail (the
helper's client counts which path ran, so no case passes by never taking it); a filesystem
without user attributes (procfs) is a clear refusal; a sandbox whose helper does not answer the
op (the script's path) reads none and refuses to set; malformed ops are refused."""

from __future__ import annotations

import os

import pytest
from native_writes import assert_bad_op_refused, helper_client

from sandboxes import protocol as p
from sandboxes._helper import _xattrs
from sandboxes.local import LocalSandbox
from sandboxes.server.e2b.metadata import get_call, parsed, set_call, set_failure


def test_metadata_is_set_replaced_and_read_back_as_user_e2b_attributes(jail: LocalSandbox) -> None:
    mux = helper_client(jail)
    first, second = f"{jail.root}/meta-a.txt", f"{jail.root}/meta-b.txt"
    jail.upload_files([(first, b"a"), (second, b"b")])
    before = mux.native_answers
    done = jail.run_call(set_call([first, second], {"author": "me", "purpose": "upload"}))
    assert set_failure(done, first) is None, done
    assert os.getxattr(first, "user.e2b.author") == b"me"  # what envd writes, where `getfattr` finds it
    assert set_failure(jail.run_call(set_call([second], {"stage": "two"})), second) is None
    os.setxattr(first, "user.other", b"kept")  # not E2B's: neither read nor cleared
    found = parsed(jail.run_call(get_call([first, second, f"{jail.root}/missing"])))
    assert found == {first: {"author": "me", "purpose": "upload"}, second: {"stage": "two"}}
    assert os.getxattr(first, "user.other") == b"kept"
    assert mux.native_answers == before + 3


def test_a_filesystem_without_user_attributes_is_a_clear_refusal() -> None:
    """procfs keeps none: a file of this process's own (the jail's helper is not dumpable, its
    ``/proc/self`` is root's, so the op runs here, as the helper runs it)."""
    assert _xattrs.metadata(["e2b_metadata", "set", "1", "/proc/self/comm", "author", "me"]) == (95, b"")
    assert _xattrs.metadata(["e2b_metadata", "get", "/proc/self/comm"]) == (0, b"{}")
    answer = p.ExecuteResponse(output="", exit_code=_xattrs.EXIT_UNSUPPORTED)
    assert set_failure(answer, "/proc/self/comm") == (
        p.INVALID_ARGUMENT,
        "the sandbox's filesystem at /proc/self/comm keeps no user extended attributes (file metadata)",
    )


def test_without_the_helper_metadata_reads_none_and_is_not_set(jail: LocalSandbox) -> None:
    path = f"{jail.root}/meta-script.txt"
    jail.upload_files([(path, b"x")])
    assert set_failure(jail.run_call(set_call([path], {"k": "v"})), path) is None
    jail.native_file_ops = False
    try:
        assert parsed(jail.run_call(get_call([path]))) == {}
        failure = set_failure(jail.run_call(set_call([path], {"k": "w"})), path)
    finally:
        jail.native_file_ops = True
    assert failure is not None
    assert failure[0] == p.UNAVAILABLE
    assert os.getxattr(path, "user.e2b.k") == b"v"


@pytest.mark.parametrize(
    "op",
    [["e2b_metadata"], ["e2b_metadata", "get", "relative"], ["e2b_metadata", "set", "2", "/a"]],
    ids=["no mode", "relative", "short"],
)
def test_a_malformed_metadata_op_is_refused(jail: LocalSandbox, op: list[str]) -> None:
    assert_bad_op_refused(jail, op)
