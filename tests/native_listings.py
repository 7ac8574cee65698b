"""The exec helper's native ``ls`` and ``delete`` (`sandboxes._helper._listing`) answer exactly what
the scripts (`sandboxes._scripts.LS`, ``DELETE``) answer, for the tests of every backend that has
the helper. A listing runs natively, then as the script, on the same tree: the same exit code
and the same bytes (names, kinds, sizes, mtimes, order). A delete runs once as the script and
once natively, each in its own fresh copy of the same setup: the same exit code and the same
files left behind (names, modes, owners, types, sizes), and what lies outside (a symlink's
target) untouched by both. Which path ran is counted by the helper's client
(`MuxClient.native_answers` / ``native_declined``), so a test cannot pass by never taking it.

The tree is built to trip a lister or a remover: names with newlines, quotes, a 0xff byte, a
leading dash or ``!``, ``*``; hidden names of every glob class (``.x``, ``..x``, ``...``);
symlinks to files and directories, dangling and looping ones; a FIFO (never opened); fixed
mtimes, 0 and negative too; directories we may not read or search, or write in. Everything is
real: the sandbox, its helper, its shell."""

from __future__ import annotations

import shlex
import uuid
from dataclasses import dataclass

from native_writes import HOSTILE, NOT_UTF8, NOT_UTF8_SH, helper_client, observe

from sandboxes import _scripts
from sandboxes import protocol as p
from sandboxes.base import BaseSandbox, Call

__all__ = ["assert_ls_and_delete_go_native", "assert_native_listings_match_the_scripts", "delete_call", "ls_call"]

_TREE = r"""mkdir -p tree/sub/deeper tree/.hidden tree/empty tree/noread tree/nosearch/inner tree/only-hidden \
  tree/newline/'a
b'
cd tree
printf 'one\n' > a.py
printf 'two\n' > 'we:ird
name.py'
printf 'x' > '!bang' && printf 'y' > -dash && printf 'z' > '*' && printf q > "q'uo\"te"
printf 'w' > "$(printf 'bad\377name')"
printf 'hidden\n' > .hidden/secret.txt && printf h > .h && printf hh > ..h && printf hhh > ...
printf 'deep\n' > sub/deeper/c.txt
printf '' > empty.txt
touch -d @0 epoch.txt
touch -d @-5 before-epoch.txt 2>/dev/null || touch -d @5 before-epoch.txt
touch -d '2001-02-03 04:05:06.999' fraction.txt
printf 'n' > only-hidden/.only && printf 'n' > newline/'a
b'/f
ln -s a.py link.py && ln -s sub sublink && ln -s nowhere dangling && ln -s loop loop
mkfifo fifo
printf 'secret\n' > noread/f.txt && printf 'secret\n' > nosearch/inner/f.txt
chmod 311 noread
chmod 644 nosearch
"""
"""Built with the sandbox's own shell, so every backend gets the same bytes."""


def ls_call(path: str) -> Call:
    return Call(_scripts.command(_scripts.LS, path), native=("ls", path))


def delete_call(path: str) -> Call:
    return Call(_scripts.command(_scripts.DELETE, path), idempotent=False, native=("delete", path))


@dataclass(frozen=True)
class Listing:
    name: str
    path: str
    """Under the tree's directory."""
    native: bool
    """Whether the helper answers it itself (``False``: it hands it back to the script)."""


_LISTINGS = [
    Listing("the tree", "tree", True),
    Listing("a subdirectory", "tree/sub", True),
    Listing("hidden entries only", "tree/only-hidden", True),
    Listing("an empty directory", "tree/empty", True),
    Listing("a name with a newline", "tree/newline", True),
    Listing("a name with a newline, inside", "tree/newline/a\nb", True),
    Listing("through a symlink to a directory", "tree/sublink", True),
    Listing("a file", "tree/a.py", True),
    Listing("a symlink to a file", "tree/link.py", True),
    Listing("a dangling symlink", "tree/dangling", True),
    Listing("a symlink loop", "tree/loop", True),
    Listing("a FIFO", "tree/fifo", True),
    Listing("missing", "tree/missing", True),
    Listing("below a file", "tree/a.py/x", True),
    Listing("not searchable", "tree/nosearch", True),
    Listing("behind a directory not searchable", "tree/nosearch/inner", True),
    Listing("searchable, not readable", "tree/noread", False),
]


@dataclass(frozen=True)
class Deletion:
    name: str
    setup: str
    """Shell run in the case's fresh directory first."""
    target: str
    """Deleted, relative to that directory."""
    native: bool = True


_OUTSIDE = "mkdir -p ../outside/dir && printf keep > ../outside/dir/f && printf keep > ../outside/f"
_DELETIONS = [
    Deletion("a file", "printf x > f", "f"),
    Deletion("an empty file", "true > f", "f"),
    Deletion("a tree", _TREE, "tree"),
    Deletion("hidden entries", "mkdir -p d/.a/..b && printf x > d/.a/..b/... && printf y > d/.c", "d"),
    Deletion("hostile name", f"printf x > {shlex.quote(HOSTILE)}", HOSTILE),
    Deletion("non-UTF-8 name (byte 0xff)", f"printf x > {NOT_UTF8_SH}", NOT_UTF8),
    Deletion("a name with a newline", "mkdir 'a\nb' && printf x > 'a\nb/c\nd'", "a\nb"),
    Deletion("a symlink to a file: the link", "printf keep > f && ln -s f link", "link"),
    Deletion("a symlink to a directory: the link", "mkdir d && printf keep > d/f && ln -s d link", "link"),
    Deletion("a dangling symlink", "ln -s nowhere link", "link"),
    Deletion("a FIFO, never opened", "mkfifo fifo", "fifo"),
    Deletion(
        "a tree with links out: not followed",
        f"{_OUTSIDE} && mkdir -p t/in && ln -s ../../../outside/dir t/in/out && ln -s ../../outside/f t/file-out",
        "t",
    ),
    Deletion("through a symlinked parent", "mkdir d && printf x > d/f && printf y > d/g && ln -s d link", "link/f"),
    Deletion("a deep tree", "mkdir -p $(seq -s / 40) && printf x > $(seq -s / 40)/f && touch 1/2/g", "1"),
    Deletion("missing", "", "missing"),
    Deletion("below a file", "printf x > f", "f/g"),
    Deletion("below a directory not searchable", "mkdir -p d/e && printf x > d/e/f && chmod 644 d", "d/e"),
    Deletion("in a read-only directory", "mkdir ro && printf x > ro/f && chmod 555 ro", "ro/f"),
    Deletion(
        "a tree with a read-only part",
        "mkdir -p t/ro t/rw && printf x > t/ro/f && printf y > t/rw/g && chmod 555 t/ro",
        "t",
    ),
    Deletion(
        "a tree with an unreadable part", "mkdir -p t/nr && printf x > t/nr/f && printf y > t/g && chmod 311 t/nr", "t"
    ),
    Deletion("a tree with an unsearchable part", "mkdir -p t/ns && printf x > t/ns/f && chmod 644 t/ns", "t"),
    Deletion("an empty unreadable directory", "mkdir t && chmod 000 t", "t"),
    Deletion("read-only files in a writable tree", "mkdir -p t/u && printf x > t/u/f && chmod 444 t/u/f", "t"),
]


def _delete_case(sandbox: BaseSandbox, case: Deletion, directory: str) -> tuple[int | None, str]:
    made = sandbox.execute(
        f"mkdir -p {shlex.quote(directory)} && cd {shlex.quote(directory)} && {case.setup or 'true'}"
    )
    assert made.exit_code == 0, (case.name, made)
    response = sandbox._run_call(delete_call(f"{directory}/{case.target}"))
    assert response.error is None, (case.name, response)
    return response.exit_code, observe(sandbox, directory.rpartition("/")[0], open_up=True)


def assert_native_listings_match_the_scripts(sandbox: BaseSandbox, root: str) -> None:
    """Every listing natively and as the script on one tree built under ``root``, and every
    delete natively and as the script in fresh directories: equal answers, equal leftovers; the
    helper answered exactly the cases meant to be native."""
    assert sandbox.native_file_ops, "the sandbox does not offer native file ops"
    mux = helper_client(sandbox)
    run = f"{root}/listings-{uuid.uuid4().hex[:8]}"
    made = sandbox.execute(f"mkdir -p {shlex.quote(run)} && cd {shlex.quote(run)} && {_TREE}")
    assert made.exit_code == 0, made
    differences: list[tuple[str, object, object]] = []
    try:
        for listing in _LISTINGS:
            call = ls_call(f"{run}/{listing.path}")
            before = (mux.native_answers, mux.native_declined)
            native = sandbox._run_call(call)
            counted = (mux.native_answers - before[0], mux.native_declined - before[1])
            assert counted == ((1, 0) if listing.native else (0, 1)), f"{listing.name}: wrong path"
            sandbox.native_file_ops = False
            try:
                scripted = sandbox._run_call(call)
            finally:
                sandbox.native_file_ops = True
            assert native.error is None, (listing.name, native)
            assert scripted.error is None, (listing.name, scripted)
            # A failure is its exit code; the shell's complaint beside it is noise no caller sees.
            native_answer = (native.exit_code, native.output if native.exit_code == 0 else "")
            scripted_answer = (scripted.exit_code, scripted.output if scripted.exit_code == 0 else "")
            if native_answer != scripted_answer:
                differences.append((listing.name, scripted_answer, native_answer))
        tree = sandbox.ls(f"{run}/tree")
        assert tree.error is None
        assert tree.entries is not None
        assert len(tree.entries) >= 25, tree  # not vacuous: every name made it
        sized = {e.path.rpartition("/")[2]: e for e in tree.entries}
        assert sized["epoch.txt"].modified_at is not None
        assert sized["epoch.txt"].modified_at.startswith("1970-01-01T00:00:00")
        for index, case in enumerate(_DELETIONS):
            before = (mux.native_answers, mux.native_declined)
            sandbox.native_file_ops = False
            try:
                scripted_delete = _delete_case(sandbox, case, f"{run}/d{index}-script/case")
            finally:
                sandbox.native_file_ops = True
            assert (mux.native_answers, mux.native_declined) == before, f"{case.name}: native ops were off"
            native_delete = _delete_case(sandbox, case, f"{run}/d{index}-native/case")
            counted = (mux.native_answers - before[0], mux.native_declined - before[1])
            assert counted == ((1, 0) if case.native else (0, 1)), f"{case.name}: wrong path"
            if native_delete != scripted_delete:
                differences.append((case.name, scripted_delete, native_delete))
    finally:
        sandbox.native_file_ops = True
        sandbox.execute(f"chmod -R u+rwx {shlex.quote(run)}; rm -rf {shlex.quote(run)}")
    assert not differences, "\n".join(f"{name}:\n script {s!r}\n native {n!r}" for name, s, n in differences)


def assert_ls_and_delete_go_native(sandbox: BaseSandbox, directory: str) -> None:
    """An ``ls`` and a ``delete`` answered by the exec helper itself, and right."""
    mux = helper_client(sandbox)
    assert sandbox.write(f"{directory}/gone/f.txt", "x").error is None
    before = mux.native_answers
    listed = sandbox.ls(f"{directory}/gone")
    assert listed.entries is not None
    assert [e.path for e in listed.entries] == [f"{directory}/gone/f.txt"]
    assert sandbox.delete(f"{directory}/gone") == p.DeleteResult(path=f"{directory}/gone")
    assert mux.native_answers == before + 2
    assert sandbox.ls(f"{directory}/gone").error == p.FILE_NOT_FOUND
