"""The file scripts (`sandboxes._scripts`) on a LocalSandbox, at their edges: a listing that races
a removal, one past the kernel's argument limit, one whose jail could not start, and the mode
a new file gets from the writing shell's umask."""

from __future__ import annotations

import stat
import tempfile
from pathlib import Path

import pytest

from sandboxes import _scripts
from sandboxes import protocol as p
from sandboxes.local import LocalSandbox, LocalSandboxConfig, NotIsolatedWarning


def test_an_entry_gone_while_it_was_listed_leaves_the_listing_standing(tmp_path: Path) -> None:
    """`sandboxes._scripts.LS` lists the names, then ``exec``s one ``stat`` for them all; an entry
    removed in between makes ``stat`` exit 1 (`EXIT_LS_VANISHED`): the listing is still an
    answer, not a backend error. The race is made, not waited for: a ``stat`` first in PATH
    removes the entry, then runs the real one."""
    shims, root = tmp_path / "shims", tmp_path / "root"
    shims.mkdir()
    (shims / "stat").write_text('#!/bin/sh\nrm -f -- "$GONE"\nexec /usr/bin/stat "$@"\n')
    (shims / "stat").chmod(0o755)
    (root / "d").mkdir(parents=True)
    for name in ("a", "b", ".c"):
        (root / "d" / name).write_text(name)
    env = {"PATH": f"{shims}:/usr/bin:/bin", "GONE": str(root / "d" / "b")}
    with pytest.warns(NotIsolatedWarning):
        sandbox = LocalSandbox(config=LocalSandboxConfig(root_dir=root, isolation="none", env=env))
    with sandbox:
        listed = sandbox.ls(str(root / "d"))
        assert listed.error is None, listed
        assert [e.path.rsplit("/", 1)[1] for e in listed.entries or []] == [".c", "a", "b"]
        assert not (root / "d" / "b").exists(), "the shim did not run: no race was made"


def test_a_listing_past_the_argument_limit_still_answers(tmp_path: Path) -> None:
    """Names over the kernel's argument limit (~2 MiB here): `sandboxes._scripts.LS` cannot
    ``exec`` its ``stat`` for them (status 126 would end the script), so it runs it as a child,
    whose failure leaves the listing, without sizes. Over 64 KiB of names the native ls hands
    a directory to the script, so this is the path a big directory takes everywhere."""
    directory = tmp_path / "root" / "big"
    directory.mkdir(parents=True)
    for i in range(12000):
        (directory / f"f{i:0200}").touch()
    with pytest.warns(NotIsolatedWarning):
        sandbox = LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "root", isolation="none"))
    with sandbox:
        listed = sandbox.ls(str(directory))
        assert listed.error is None, listed.message
        assert len(listed.entries or []) == 12000


def test_a_jail_that_could_not_start_is_not_an_empty_listing(tmp_path: Path) -> None:
    """bwrap's own failures exit 1 (a full pids limit: "Creating new namespace failed"), as the
    listing's ``stat`` does when an entry vanished: before any record, it is an error."""
    config = LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap", use_exec_helper=False)
    with tempfile.TemporaryDirectory(prefix="fake-bwrap-") as shared, LocalSandbox(config=config) as sandbox:
        fake = Path(shared) / "bwrap"  # where the jail's launcher may read it, unlike tmp_path (0700)
        fake.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: Resource temporarily' >&2\nexit 1\n")
        fake.chmod(0o755)
        Path(shared).chmod(0o755)
        (sandbox.root / "a").write_text("a")
        assert [e.path for e in sandbox.ls(str(sandbox.root)).entries or []] == [f"{sandbox.root}/a"]
        assert sandbox._jail is not None
        sandbox._jail.bwrap = str(fake)
        listed = sandbox.ls(str(sandbox.root))
        assert listed.error == p.BACKEND_ERROR, listed


@pytest.mark.parametrize("umask", [0o027, 0o077, 0o002])
def test_the_scripts_give_a_new_file_the_mode_of_the_shells_umask(unisolated_sandbox: LocalSandbox, umask: int) -> None:
    """A new target gets the mode of the writing shell's umask: a write and an upload from
    their temporary file's (no ``$(umask)``), a staged file's commit from its own ``$(umask)``,
    whatever mode the staged file was made with (Kubernetes' tar: 0644). Each in a shell whose
    umask is not the default."""
    directory = unisolated_sandbox.root / f"umask-{umask:03o}"
    directory.mkdir()
    data = b"hello"
    staged = f"{directory}/.staged"
    steps = [
        (_scripts.command(_scripts.WRITE, f"{directory}/written", str(len(data)), "w"), data),
        (_scripts.command(_scripts.UPLOAD, "u", f"{directory}/uploaded", str(len(data))), data),
        (_scripts.command(_scripts.STAGE_CHUNK, staged, "new") + f'\nchmod 644 "{staged}"', data),  # as tar makes it
        (_scripts.command(_scripts.COMMIT_STAGED, staged, f"{directory}/committed", str(len(data))), None),
    ]
    for command, stdin in steps:
        done = unisolated_sandbox.execute(f"umask {umask:03o}\n{command}", stdin=stdin, env={"nm": "777"})
        assert done.exit_code == 0, done
        assert done.output.strip("0\n") == "", done  # the per-file statuses, all 0
    for name in ("written", "uploaded", "committed"):
        assert (directory / name).read_bytes() == data
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o666 & ~umask, name
