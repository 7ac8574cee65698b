"""`sandboxes._beneath`: the one no-follow walker under `FilesystemBackend` and the service's
local archives, tested directly.

Each test puts something worth stealing outside the directory being opened (``outside``) and
checks the walker neither reaches it nor changes it: through a symlink at every component
(first, middle, final, one met while creating parents), through a symlink swapped in between
two calls or between the check and the open, through a directory moved away mid-walk, or
through names that are not one plain component. Hard links are opened as the files they are;
FIFOs and devices are refused unopened (`open_file`) or reported as ``other`` (`walk`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxes import _beneath as beneath


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "root").mkdir()
    return tmp_path / "root"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Next to the root; nothing done beneath the root may reach it."""
    target = tmp_path / "outside"
    (target / "b" / "c").mkdir(parents=True)
    (target / "secret.txt").write_text("SECRET\n")
    (target / "b" / "secret.txt").write_text("SECRET b\n")
    return target


@pytest.fixture
def root_fd(root: Path) -> Iterator[int]:
    fd = os.open(root, beneath.DIR_FLAGS)
    yield fd
    os.close(fd)


def _same(fd: int, path: Path) -> bool:
    opened, named = os.fstat(fd), os.stat(path, follow_symlinks=False)
    return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)


def _refused(reason: beneath.Reason) -> pytest.RaisesExc[beneath.Refused]:
    return pytest.raises(beneath.Refused, check=lambda exc: exc.reason == reason)


def _tree(outside: Path) -> dict[str, str]:
    """Everything under ``outside``, to show it is untouched."""
    return {
        str(path.relative_to(outside)): path.read_text() if path.is_file() else "/"
        for path in sorted(outside.rglob("*"))
    }


def _open_fds(root: Path) -> int:
    """Descriptors this process holds on ``root`` or beneath it: counting every descriptor would
    count what other tests' threads (sandboxes, helpers, sockets) open and close meanwhile."""
    real, inside = os.path.realpath(root), 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed since the listing
            continue
        inside += target == real or target.startswith(f"{real}/")
    return inside


# ---------------------------------------------------------------------- open_dir


def test_open_dir_opens_each_component_beneath_the_descriptor(root: Path, root_fd: int) -> None:
    (root / "a" / "b").mkdir(parents=True)
    fd = beneath.open_dir(root_fd, ["a", "b"])
    try:
        assert _same(fd, root / "a" / "b")
    finally:
        os.close(fd)
    no_parts = beneath.open_dir(root_fd, [])
    try:
        assert no_parts != root_fd
        assert _same(no_parts, root)
    finally:
        os.close(no_parts)


LINK_AT = {"first": "a", "middle": "a/b", "final": "a/b/c"}
"""Where on the way to a/b/c a link is put; it points at the directory of the same shape
outside (``a`` at ``outside``, ``a/b`` at ``outside/b``, ``a/b/c`` at ``outside/b/c``)."""


@pytest.mark.parametrize("create", [False, True], ids=["open", "create"])
@pytest.mark.parametrize("where", list(LINK_AT))
def test_open_dir_refuses_a_symlink_at_every_component(
    root: Path, root_fd: int, outside: Path, where: str, create: bool
) -> None:
    link = root / LINK_AT[where]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside.joinpath(*LINK_AT[where].split("/")[1:]))
    before = _tree(outside)
    for parts in (["a", "b", "c"], ["a", "b", "c", "new"]):
        with _refused("symlink"):
            os.close(beneath.open_dir(root_fd, parts, create=create))
    assert _tree(outside) == before


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-directory", "dangling"])
def test_creating_parents_never_goes_through_a_symlink(root: Path, root_fd: int, outside: Path, dangling: bool) -> None:
    """``mkdir -p`` stops at a link in the way, even one whose target does not exist yet:
    neither the link's target nor anything below it is created."""
    (root / "a").mkdir()
    target = outside / "made-by-walker" if dangling else outside / "b"
    (root / "a" / "b").symlink_to(target)
    before = _tree(outside)
    with _refused("symlink"):
        os.close(beneath.open_dir(root_fd, ["a", "b", "c"], create=True))
    assert _tree(outside) == before
    assert not (outside / "made-by-walker").exists()


def test_a_parent_swapped_for_a_symlink_just_after_it_was_created_is_refused(
    root: Path, root_fd: int, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``mkdir -p a/new``: ``a`` is made, and the sandbox replaces it with a link to a directory
    outside before it is opened. The open refuses the link; nothing is made outside."""
    real_mkdir = os.mkdir

    def mkdir_then_swap(name: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        real_mkdir(name, mode, dir_fd=dir_fd)
        if name == "a":
            os.rmdir(name, dir_fd=dir_fd)
            os.symlink(outside, name, dir_fd=dir_fd)

    before = _tree(outside)
    with monkeypatch.context() as patched:  # os.mkdir is global: patched only around the call
        patched.setattr(os, "mkdir", mkdir_then_swap)
        with _refused("symlink"):
            os.close(beneath.open_dir(root_fd, ["a", "new"], create=True))
    assert (root / "a").is_symlink()
    assert _tree(outside) == before


def test_open_dir_creates_missing_directories_with_the_mode_given(root: Path, root_fd: int) -> None:
    (root / "a").mkdir()
    old = os.umask(0o022)
    try:
        os.close(beneath.open_dir(root_fd, ["a", "b", "c"], create=True, mode=0o750))
    finally:
        os.umask(old)
    assert (root / "a" / "b" / "c").is_dir()
    assert stat.S_IMODE((root / "a" / "b").stat().st_mode) == 0o750


def test_open_dir_names_what_is_in_the_way(root: Path, root_fd: int) -> None:
    (root / "file").write_text("x")
    with _refused("not_a_directory"):
        beneath.open_dir(root_fd, ["file", "x"])
    with _refused("not_a_directory"):
        beneath.open_dir(root_fd, ["file"], create=True)
    with _refused("not_found"):
        beneath.open_dir(root_fd, ["missing", "x"])
    os.mkfifo(root / "fifo")
    with _refused("not_a_directory"):
        beneath.open_dir(root_fd, ["fifo"])


def test_a_symlink_swapped_in_between_two_calls_is_refused(root: Path, root_fd: int, outside: Path) -> None:
    """What was a directory at the first call is a link at the second: the second refuses it
    (no result of a previous check is trusted), while a descriptor held from the first still
    names the real directory, wherever it was moved, never the link's target."""
    (root / "b" / "c").mkdir(parents=True)
    (root / "b" / "mine.txt").write_text("mine")
    held = beneath.open_dir(root_fd, ["b"])
    try:
        os.rename(root / "b", root / "b.moved")
        (root / "b").symlink_to(outside / "b")
        with _refused("symlink"):
            beneath.open_dir(root_fd, ["b", "c"])
        with _refused("symlink"):
            beneath.open_file(root_fd, "b", os.O_RDONLY, directories=True)
        fd, _ = beneath.open_file(held, "mine.txt", os.O_RDONLY)
        with os.fdopen(fd, "rb") as mine:
            assert mine.read() == b"mine"
        with _refused("not_found"):
            beneath.open_file(held, "secret.txt", os.O_RDONLY)
    finally:
        os.close(held)


BAD_NAMES = ["", ".", "..", "a/b", "/etc", "../outside", "a\x00b"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_names_that_are_not_one_plain_component_are_refused(root: Path, root_fd: int, name: str) -> None:
    """``..`` climbs out, an absolute name ignores the descriptor, ``a/b`` passes through ``a``
    unchecked: refused by every entry point, before any I/O."""
    (root / "a" / "b").mkdir(parents=True)
    with _refused("invalid_name"):
        beneath.open_dir(root_fd, ["a", name])
    with _refused("invalid_name"):
        beneath.open_dir(root_fd, [name], create=True)
    with _refused("invalid_name"):
        beneath.open_file(root_fd, name, os.O_RDONLY, directories=True)
    with _refused("invalid_name"):
        beneath.remove_tree(root_fd, name)
    assert (root / "a" / "b").is_dir()


# ---------------------------------------------------------------------- open_file


def test_open_file_opens_a_regular_file_with_the_flags_given(root: Path, root_fd: int) -> None:
    (root / "f.txt").write_text("old")
    fd, info = beneath.open_file(root_fd, "f.txt", os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, b"new")
    finally:
        os.close(fd)
    assert stat.S_ISREG(info.st_mode)
    assert (root / "f.txt").read_text() == "new"


@pytest.mark.parametrize("target", ["secret.txt", "b", "missing"], ids=["to-a-file", "to-a-directory", "dangling"])
def test_open_file_refuses_a_symlink(root: Path, root_fd: int, outside: Path, target: str) -> None:
    (root / "link").symlink_to(outside / target)
    for directories in (False, True):
        with _refused("symlink"):
            beneath.open_file(root_fd, "link", os.O_RDONLY, directories=directories)


def test_open_file_names_a_directory_or_a_missing_file(root: Path, root_fd: int) -> None:
    (root / "d").mkdir()
    with _refused("is_a_directory"):
        beneath.open_file(root_fd, "d", os.O_RDONLY)
    with _refused("not_found"):
        beneath.open_file(root_fd, "missing", os.O_RDONLY)
    fd, info = beneath.open_file(root_fd, "d", os.O_RDONLY, directories=True)
    os.close(fd)
    assert stat.S_ISDIR(info.st_mode)


def test_a_symlink_swapped_in_after_the_check_is_refused_by_the_open(
    root: Path, root_fd: int, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``lstat`` that classifies the file sees a regular file; then the file becomes a
    link to a secret before the open. ``O_NOFOLLOW`` on the open itself refuses it."""
    (root / "f.txt").write_text("mine")
    real_lstat = beneath.lstat

    def lstat_then_swap(dir_fd: int, name: str) -> os.stat_result | None:
        found = real_lstat(dir_fd, name)
        os.unlink(name, dir_fd=dir_fd)
        os.symlink(outside / "secret.txt", name, dir_fd=dir_fd)
        return found

    monkeypatch.setattr(beneath, "lstat", lstat_then_swap)
    with _refused("symlink"):
        fd, _ = beneath.open_file(root_fd, "f.txt", os.O_RDONLY)
        os.close(fd)


def test_a_fifo_swapped_in_after_the_check_is_refused_without_hanging(
    root: Path, root_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "f.txt").write_text("mine")
    real_lstat = beneath.lstat

    def lstat_then_swap(dir_fd: int, name: str) -> os.stat_result | None:
        found = real_lstat(dir_fd, name)
        os.unlink(name, dir_fd=dir_fd)
        os.mkfifo(name, dir_fd=dir_fd)
        return found

    monkeypatch.setattr(beneath, "lstat", lstat_then_swap)
    before = _open_fds(root)
    with _refused("not_regular"):
        beneath.open_file(root_fd, "f.txt", os.O_RDONLY)
    assert _open_fds(root) == before


def test_special_files_are_refused_without_being_opened(root: Path, root_fd: int) -> None:
    """A FIFO or a device is refused on ``lstat``, before any open: opening a device can act on
    it, and opening a FIFO for writing with no reader fails (``ENXIO``) where it is refused
    here. (The device is ``/dev/null``, so no privilege is needed.)"""
    os.mkfifo(root / "fifo")
    for flags in (os.O_RDONLY, os.O_WRONLY):
        for directories in (False, True):
            with _refused("not_regular"):
                beneath.open_file(root_fd, "fifo", flags, directories=directories)
    dev = os.open("/dev", beneath.DIR_FLAGS)
    try:
        with _refused("not_regular"):
            beneath.open_file(dev, "null", os.O_WRONLY)
    finally:
        os.close(dev)


def test_a_hard_link_is_opened_as_the_file_it_is(root: Path, root_fd: int, outside: Path) -> None:
    """Nothing tells a hard link from its file, so it opens like any file (``st_nlink`` says
    2): a caller that writes must rename a new file over it, which `FilesystemBackend` and the
    archive extraction both do, never write through it."""
    os.link(outside / "secret.txt", root / "linked.txt")
    fd, info = beneath.open_file(root_fd, "linked.txt", os.O_RDONLY)
    os.close(fd)
    assert stat.S_ISREG(info.st_mode)
    assert info.st_nlink == 2


# ---------------------------------------------------------------------- walk


def test_walk_reports_every_entry_and_enters_only_real_directories(root: Path, root_fd: int, outside: Path) -> None:
    (root / "d" / "e").mkdir(parents=True)
    (root / "z.txt").write_text("z")
    (root / "a.txt").write_text("a")
    (root / "d" / "f.txt").write_text("f")
    (root / "d" / "e" / "g.txt").write_text("g")
    (root / "d" / "to-dir").symlink_to(outside / "b")
    (root / "d" / "to-file").symlink_to(outside / "secret.txt")
    os.mkfifo(root / "d" / "fifo")
    os.link(outside / "secret.txt", root / "hard.txt")
    steps = [(relpath, name, kind) for _, name, relpath, kind in beneath.walk(root_fd)]
    assert steps == [
        ("a.txt", "a.txt", "file"),
        ("hard.txt", "hard.txt", "file"),
        ("z.txt", "z.txt", "file"),
        ("d", "d", "dir"),
        ("d/f.txt", "f.txt", "file"),
        ("d/fifo", "fifo", "other"),
        ("d/to-dir", "to-dir", "other"),
        ("d/to-file", "to-file", "other"),
        ("d/e", "e", "dir"),
        ("d/e/g.txt", "g.txt", "file"),
        ("d/e", "e", "leave"),
        ("d", "d", "leave"),
    ]


def test_walk_gives_each_entry_with_the_descriptor_of_its_directory(root: Path, root_fd: int) -> None:
    (root / "d" / "e").mkdir(parents=True)
    (root / "d" / "e" / "g.txt").write_text("g")
    for dir_fd, name, relpath, _ in beneath.walk(root_fd):
        holder = (root / relpath).parent
        assert _same(dir_fd, holder), relpath
        assert beneath.lstat(dir_fd, name) is not None


def test_a_directory_swapped_for_a_symlink_mid_walk_is_not_entered(root: Path, root_fd: int, outside: Path) -> None:
    """The walk lists ``b`` as a directory, then ``b`` becomes a link to a directory outside
    before the walk descends: it is reported as ``other``, and nothing outside is listed."""
    (root / "a.txt").write_text("a")
    (root / "b").mkdir()
    walk = beneath.walk(root_fd)
    with contextlib.closing(walk):
        first = next(walk)
        assert first.relpath == "a.txt"
        os.rmdir(root / "b")
        (root / "b").symlink_to(outside / "b")
        rest = [(relpath, kind) for _, _, relpath, kind in walk]
    assert rest == [("b", "other")]


def test_a_directory_moved_out_mid_walk_stops_the_walk(root: Path, root_fd: int, outside: Path) -> None:
    """Going back up from ``d/e`` opens ``..``; if ``e`` was moved outside meanwhile, that is
    no longer ``d`` but ``outside``, whose ``f`` would then be walked in place of ``d/f``.
    The walk checks it is the directory it came down from and raises ``ESTALE`` instead."""
    (root / "d" / "e").mkdir(parents=True)
    (root / "d" / "f").mkdir()
    (root / "d" / "e" / "x.txt").write_text("x")
    (outside / "f").mkdir()
    (outside / "f" / "stolen.txt").write_text("SECRET f\n")
    seen: list[str] = []

    def walk_moving_e_out() -> None:
        for _, _, relpath, _ in beneath.walk(root_fd):
            seen.append(relpath)
            if relpath == "d/e/x.txt":
                os.rename(root / "d" / "e", outside / "e")

    with pytest.raises(OSError, match="moved during the walk") as raised:
        walk_moving_e_out()
    assert raised.value.errno == errno.ESTALE
    assert "d/f/stolen.txt" not in seen


DEPTH = 1500


@pytest.fixture
def deep(root: Path, root_fd: int) -> Iterator[None]:
    """``root/d/d/.../bottom.txt``, `DEPTH` levels: deeper than the recursion limit. Removed
    afterwards by ``rm -rf`` whatever the test did (pytest's own clean-up recurses, and fails)."""
    os.close(beneath.open_dir(root_fd, ["d"] * DEPTH, create=True))
    deepest = beneath.open_dir(root_fd, ["d"] * DEPTH)
    with os.fdopen(os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=deepest), "w") as bottom:
        bottom.write("x")
    os.close(deepest)
    yield
    subprocess.run(["rm", "-rf", "--", str(root / "d")], check=True)


@pytest.mark.usefixtures("deep")
def test_a_deep_tree_costs_neither_recursion_nor_a_descriptor_per_level(root: Path, root_fd: int) -> None:
    before = _open_fds(root)
    most = 0
    files = []
    for _, _, relpath, kind in beneath.walk(root_fd):
        most = max(most, _open_fds(root))
        if kind == "file":
            files.append(relpath)
    assert files == ["d/" * DEPTH + "bottom.txt"]
    assert before >= 1  # the root's own descriptor: the count sees what it is meant to
    assert before < most <= before + 2
    assert _open_fds(root) == before
    beneath.remove_tree(root_fd, "d")
    assert os.listdir(root) == []


def test_a_walk_left_early_closes_what_it_opened(root: Path, root_fd: int) -> None:
    (root / "d" / "e").mkdir(parents=True)
    (root / "d" / "e" / "g.txt").write_text("g")
    before = _open_fds(root)
    for kind in ("dir", "file"):
        walk = beneath.walk(root_fd)
        for step in walk:
            if step.relpath.startswith("d/e") and step.kind == kind:
                break
        walk.close()
        assert _open_fds(root) == before, kind


def test_strict_walks_raise_what_lenient_ones_skip(root: Path, root_fd: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A subdirectory that cannot be opened (permission, here simulated: root bypasses modes)
    is reported as ``dir`` and not entered; a strict walk raises instead."""
    (root / "locked").mkdir()
    (root / "locked" / "hidden.txt").write_text("h")
    real_open = os.open

    def refuse_locked(path: str, flags: int, *args: object, **kwargs: object) -> int:
        if path == "locked":
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    with monkeypatch.context() as patched:  # os.open is global: patched only around the walks
        patched.setattr(os, "open", refuse_locked)
        lenient = [(s.relpath, s.kind) for s in beneath.walk(root_fd)]
        with pytest.raises(PermissionError):
            list(beneath.walk(root_fd, strict=True))
    assert lenient == [("locked", "dir")]


# ---------------------------------------------------------------------- remove_tree


def test_remove_tree_unlinks_links_and_never_their_targets(root: Path, root_fd: int, outside: Path) -> None:
    (root / "d" / "e").mkdir(parents=True)
    (root / "d" / "e" / "g.txt").write_text("g")
    (root / "d" / "to-dir").symlink_to(outside / "b")
    (root / "d" / "e" / "to-file").symlink_to(outside / "secret.txt")
    os.mkfifo(root / "d" / "fifo")
    os.link(outside / "secret.txt", root / "d" / "hard.txt")
    before = _tree(outside)
    beneath.remove_tree(root_fd, "d")
    assert os.listdir(root) == []
    assert _tree(outside) == before


def test_remove_tree_on_a_directory_swapped_for_a_link_removes_the_link(
    root: Path, root_fd: int, outside: Path
) -> None:
    (root / "d").symlink_to(outside / "b")
    before = _tree(outside)
    beneath.remove_tree(root_fd, "d")
    assert os.listdir(root) == []
    assert _tree(outside) == before
