"""The exec helper's native ``list_dir`` (`sandboxes._helper._listdir`), E2B's ``ListDir`` without
a process, on a local jail: for every case the same exit code and the same bytes as the script
it stands for (`sandboxes.server.e2b.filesystem.LIST`, GNU ``find`` in the sandbox) on the same
tree (`native_listings`'s, built to trip a lister), at several depths; what it hands back (past
its budget, ``/proc``) answered by the script alike; malformed ops refused. Which path ran is
counted by the helper's client, so a case cannot pass by never taking it. Also in a container,
as its unprivileged user."""

from __future__ import annotations

import shlex
import uuid
from typing import Any

import pytest
from native_listings import _TREE as TREE
from native_writes import assert_bad_op_refused, helper_client
from support import SESSION_OWNER

from sandboxes import _scripts
from sandboxes._helper import _listdir
from sandboxes.base import BaseSandbox, Call
from sandboxes.docker import DockerSandbox, DockerSandboxConfig
from sandboxes.local import LocalSandbox
from sandboxes.server.e2b.filesystem import LIST, LIST_OUTPUT_LIMIT

_CASES = [
    ("tree", "1"),
    ("tree", "2"),
    ("tree", "64"),
    ("tree/sub", "1"),
    ("tree/sublink", "3"),
    ("tree/newline/a\nb", "1"),
    ("tree/empty", "1"),
    ("tree/only-hidden", "2"),
    ("tree/noread", "1"),
    ("tree/nosearch", "1"),
    ("tree/nosearch/inner", "1"),
    ("tree/a.py", "1"),
    ("tree/link.py", "1"),
    ("tree/dangling", "1"),
    ("tree/loop", "1"),
    ("tree/fifo", "1"),
    ("tree/missing", "1"),
    ("tree/a.py/x", "1"),
]


def _call(path: str, depth: str) -> Call:
    return Call(_scripts.command(LIST, path, depth), output_limit=LIST_OUTPUT_LIMIT, native=("list_dir", path, depth))


def _both(sandbox: BaseSandbox, path: str, depth: str) -> tuple[tuple[int | None, str], tuple[int | None, str]]:
    """(native, scripted) answers: the exit code, and the output where it succeeded."""
    native = sandbox.run_call(_call(path, depth))
    sandbox.native_file_ops = False
    try:
        scripted = sandbox.run_call(_call(path, depth))
    finally:
        sandbox.native_file_ops = True
    assert native.error is None, native
    assert scripted.error is None, scripted
    return (
        (native.exit_code, native.output if native.exit_code == 0 else ""),
        (scripted.exit_code, scripted.output if scripted.exit_code == 0 else ""),
    )


def _assert_list_dir_matches_the_script(sandbox: BaseSandbox, root: str) -> None:
    mux = helper_client(sandbox)
    run = f"{root}/listdir-{uuid.uuid4().hex[:8]}"
    assert sandbox.execute(f"mkdir -p {shlex.quote(run)} && cd {shlex.quote(run)} && {TREE}").exit_code == 0
    differences = []
    try:
        for relative, depth in _CASES:
            before = mux.native_answers
            native, scripted = _both(sandbox, f"{run}/{relative}", depth)
            assert mux.native_answers == before + 1, f"{relative}: not answered natively"
            if native != scripted:
                differences.append((relative, depth, scripted, native))
        whole = _both(sandbox, f"{run}/tree", "64")[0]
        assert whole[0] == 0
        assert whole[1].count("\0") >= 30, whole  # not vacuous: the tree's every entry, deep ones too
        assert "./sub/deeper/c.txt\0" in whole[1]
    finally:
        sandbox.execute(f"chmod -R u+rwx {shlex.quote(run)}; rm -rf {shlex.quote(run)}")
    assert not differences, "\n".join(f"{r!r} depth {d}:\n script {s!r}\n native {n!r}" for r, d, s, n in differences)


def test_list_dir_answers_what_the_script_answers(jail: LocalSandbox) -> None:
    _assert_list_dir_matches_the_script(jail, str(jail.root))


def test_list_dir_answers_what_the_script_answers_in_a_container(docker_client: Any, runtime_image: str) -> None:
    """As the container's unprivileged user: the directories it may not read or search matter."""
    config = DockerSandboxConfig(image=runtime_image, owner=SESSION_OWNER)
    with DockerSandbox.create(config, client=docker_client) as sandbox:
        assert sandbox.execute("id -u").output.strip() != "0"
        _assert_list_dir_matches_the_script(sandbox, "/workspace")


@pytest.mark.parametrize(
    ("setup", "path"),
    [(f"seq {_listdir.LIST_DIR_MAX_ENTRIES + 1} | xargs touch", "{run}"), ("true", "/proc/self")],
    ids=["too many entries", "into /proc"],
)
def test_what_list_dir_hands_back_the_script_answers(jail: LocalSandbox, setup: str, path: str) -> None:
    """Bounded work (the helper's one thread serves every other command): past its budget, or
    where ``/proc/self`` would be the helper, the listing is the script's whole."""
    run = f"{jail.root}/big-{uuid.uuid4().hex[:8]}"
    assert jail.execute(f"mkdir -p {run} && cd {run} && {setup}", timeout=120).exit_code == 0
    mux = helper_client(jail)
    target = path.format(run=run)
    before = (mux.native_answers, mux.native_declined)
    handed_back = jail.run_call(_call(target, "1"))
    assert (mux.native_answers, mux.native_declined) == (before[0], before[1] + 1)
    assert handed_back.exit_code == 0, handed_back
    assert handed_back.output.count("\0") >= 1


@pytest.mark.parametrize(
    "op",
    [["list_dir", "/tmp"], ["list_dir", "tmp", "1"], ["list_dir", "/tmp/../etc", "1"], ["list_dir", "/tmp", "0"]],
    ids=["no depth", "relative", "not normalized", "depth 0"],
)
def test_a_malformed_list_dir_is_refused(jail: LocalSandbox, op: list[str]) -> None:
    assert_bad_op_refused(jail, op)
