"""The exec helper's native ``ls`` and ``delete`` (`sandboxes._helper._listing`) on a local jail:
the same answers and leftovers as the scripts (`native_listings`), and what it hands back to
them, answered alike: work past its budget (entries, bytes of names, depth) and a directory
resolving into ``/proc``. Also: that `_parse.ls_entries` does not depend on the order of the
entries (only on names and stat lines being paired), and that a delete never walks into a
directory swapped for a symlink. The Docker, SSH and Kubernetes twins of the parity test are in
their backends' modules."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest
from mux_faults import faulty
from native_listings import assert_ls_and_delete_go_native, assert_native_listings_match_the_scripts, ls_call
from native_writes import assert_bad_op_refused, helper_client
from support import HAS_BWRAP, needs

from sandboxes import _parse
from sandboxes import protocol as p
from sandboxes._helper import _listing
from sandboxes.local import LocalSandbox, LocalSandboxConfig
from sandboxes.local import _helper as local_helper


def test_native_listings_answer_what_the_scripts_answer(jail: LocalSandbox) -> None:
    assert_native_listings_match_the_scripts(jail, str(jail.root))


def test_ls_and_delete_start_no_process(jail: LocalSandbox) -> None:
    assert_ls_and_delete_go_native(jail, str(jail.root))


def test_async_ls_and_delete_go_native_too(jail: LocalSandbox) -> None:
    import asyncio

    mux = helper_client(jail)
    assert jail.write(f"{jail.root}/a/f", "x").error is None
    before = mux.native_answers
    listed = asyncio.run(jail.als(f"{jail.root}/a"))
    assert listed.entries is not None
    assert [e.path for e in listed.entries] == [f"{jail.root}/a/f"]
    assert asyncio.run(jail.adelete(f"{jail.root}/a")).error is None
    assert mux.native_answers == before + 2
    assert not (jail.root / "a").exists()


_NAMES_OVER_ARGUMENT = _listing.LS_MAX_ARGUMENT // (230 + 9) + 1  # names of 230 bytes


@pytest.mark.parametrize(
    ("setup", "operation"),
    [
        (f"seq {_listing.LS_MAX_ENTRIES + 1} | xargs touch", "ls"),
        (f"for i in $(seq {_NAMES_OVER_ARGUMENT}); do touch $(printf '%0230d' $i); done", "ls"),
        (f"seq {_listing.DELETE_MAX_ENTRIES + 10} | xargs touch", "delete"),
        (f"mkdir -p $(seq -s / {_listing.DELETE_MAX_DEPTH + 5}) && touch 1/2/3/f", "delete"),
    ],
    ids=["ls: too many entries", "ls: too many bytes of names", "delete: too many entries", "delete: too deep"],
)
def test_what_the_helper_hands_back_the_script_answers(jail: LocalSandbox, setup: str, operation: str) -> None:
    """Bounded work: the helper's one thread serves every other command. A listing past its
    budget is the script's whole; a delete past it leaves the rest to the script, which ends the
    job as ``rm -rf`` would have done alone."""
    directory = f"{jail.root}/tree"
    assert jail.execute(f"mkdir -p {directory} && cd {directory} && {setup}", timeout=120).exit_code == 0
    mux = helper_client(jail)
    before = (mux.native_answers, mux.native_declined)
    if operation == "ls":
        handed_back = jail.ls(directory)
        assert (mux.native_answers, mux.native_declined) == (before[0], before[1] + 1)
        jail.native_file_ops = False
        try:
            assert handed_back == jail.ls(directory)
        finally:
            jail.native_file_ops = True
        assert handed_back.entries, "not vacuous"
    else:
        assert jail.delete(directory) == p.DeleteResult(path=directory)
        assert (mux.native_answers, mux.native_declined) == (before[0], before[1] + 1)
        assert not Path(directory).exists()


def test_a_directory_in_proc_is_the_scripts(jail: LocalSandbox) -> None:
    """``/proc/self`` is the helper for the helper and the shell for the script."""
    mux = helper_client(jail)
    before = mux.native_declined
    listed = jail.ls("/proc/self")
    assert mux.native_declined == before + 1
    assert listed.entries is not None
    assert any(e.path == "/proc/self/status" for e in listed.entries)


def test_a_native_delete_whose_answer_was_lost_is_never_run_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once its F frame is written a delete may have been done: it answers ``connection_lost``,
    and neither a new helper nor the script runs it a second time (`run_native_once`)."""
    needs(HAS_BWRAP, "bubblewrap not installed")
    streams = faulty(monkeypatch, local_helper)
    with LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap")) as sandbox:
        assert sandbox.write(f"{sandbox.root}/d/f", "x").error is None
        first = helper_client(sandbox)
        streams[-1].lose_answers()
        lost = sandbox.delete(f"{sandbox.root}/d")
        assert lost.error == p.CONNECTION_LOST, lost
        assert len(streams) == 1, "the delete went to a second helper, or to the script through one"
        second = helper_client(sandbox)
        assert second is not first
        assert second.native_answers == 0
        assert not (sandbox.root / "d").exists()  # done, by the first


@pytest.mark.parametrize(
    "op",
    [["ls"], ["ls", "relative"], ["delete", "/"], ["delete", "/a/../b"], ["delete", "/a/"], ["ls", "/a", "/b"]],
    ids=["no path", "relative path", "the root", "dot-dot", "trailing slash", "two paths"],
)
def test_a_malformed_listing_is_refused_and_the_helper_serves_on(jail: LocalSandbox, op: list[str]) -> None:
    """What the client never sends, a forged or broken one might: an error, nothing removed."""
    assert_bad_op_refused(jail, op)


def test_ls_entries_does_not_depend_on_the_order_of_the_entries(jail: LocalSandbox) -> None:
    """The native answer lists each glob's names in byte order, the shell in its collation;
    both are right as long as a name and its stat line keep their pairing."""
    for name in ("b", "a", ".z", "..y", "c\nd", "bad\udcffname", "A", "-x"):
        assert jail.write(f"{jail.root}/o/{name}", "x" * len(name)).error is None
    assert jail.execute(f"mkdir {jail.root}/o/dir && ln -s dir {jail.root}/o/link").exit_code == 0
    answer = jail._run_call(ls_call(f"{jail.root}/o"))
    assert answer.exit_code == 0
    *records, stats_text = answer.output.split("\x00")
    stats = stats_text.splitlines()
    assert len(records) == len(stats) == 10
    expected = _parse.ls_entries(answer.output, f"{jail.root}/o")
    pairs = list(zip(records, stats, strict=True))
    for seed in range(5):
        random.Random(seed).shuffle(pairs)
        shuffled = "".join(r + "\x00" for r, _ in pairs) + "".join(s + "\n" for _, s in pairs)
        assert _parse.ls_entries(shuffled, f"{jail.root}/o") == expected


def test_a_delete_never_walks_into_a_directory_swapped_for_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race `shutil.rmtree`'s safe variant closes: a directory seen as one, then replaced by
    a symlink to somewhere else before it is opened. The helper's module runs in this process
    (the path exists: no `_files` function is needed), the swap made from its ``open``."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    victim = tmp_path / "t" / "sub"
    victim.mkdir(parents=True)
    (victim / "f").write_text("x")
    real_open = os.open

    def swapping_open(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if path == "sub" and victim.is_dir() and not victim.is_symlink():
            (victim / "f").unlink()
            victim.rmdir()
            victim.symlink_to(outside)
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_listing.os, "open", swapping_open)
    assert _listing.listing(["delete", str(tmp_path / "t")]) is None  # handed back: the script decides
    assert (outside / "keep").read_text() == "keep"
    assert victim.is_symlink()


def test_the_module_is_python_3_6() -> None:
    """The helper runs on the sandbox's python3, as old as 3.6: no newer syntax here (the
    standard library calls are 3.3's: ``listdir`` of a descriptor, ``dir_fd``)."""
    import ast

    ast.parse(Path(_listing.__file__).read_text(encoding="utf-8"), feature_version=(3, 6))


@pytest.mark.parametrize("scandir_of_a_descriptor", [True, False], ids=["3.7+", "3.6"])
def test_the_names_of_a_directory_are_bounded_on_either_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scandir_of_a_descriptor: bool
) -> None:
    """3.6 has no ``scandir`` of a descriptor: its ``listdir`` answers the same names, and hands
    back past the bound too (having read them all)."""
    if not scandir_of_a_descriptor:
        monkeypatch.setattr(_listing.os, "supports_fd", os.supports_fd - {os.scandir})
    for name in ("a", ".b", "..c", "d\ne"):
        (tmp_path / name).write_text("x")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert sorted(_listing._names(fd, 4)) == sorted(["a", ".b", "..c", "d\ne"])
        with pytest.raises(_listing._ListingHandBack):
            _listing._names(fd, 3)
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("failure", "answer"),
    [(errno.EMFILE, None), (errno.EACCES, (12, b""))],
    ids=["out of descriptors: the script's", "not readable: it stays, as with rm"],
)
def test_a_directory_that_cannot_be_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: int, answer: object
) -> None:
    """Only its permissions make a directory one ``rm`` cannot empty either; any other failure
    to open it (the helper out of descriptors) is no answer about the file: handed back."""
    (tmp_path / "t" / "sub").mkdir(parents=True)
    (tmp_path / "t" / "sub" / "f").write_text("x")
    real_open = os.open

    def failing_open(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if path == "sub":
            raise OSError(failure, os.strerror(failure))
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_listing.os, "open", failing_open)
    assert _listing.listing(["delete", str(tmp_path / "t")]) == answer
    assert (tmp_path / "t" / "sub" / "f").exists()
