"""FilesystemBackend: the conformance suite, plus the escapes it must make impossible.

Symlinks are refused with ``permission_denied`` wherever they are met (final or intermediate
component, absolute or relative target, pointing outside or inside the root); ``delete``
removes a link itself and never its target; ``ls`` lists a link as a non-directory entry.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError
from support import needs

from sandboxes import protocol as p
from sandboxes.filesystem import FilesystemBackend, FilesystemBackendConfig
from sandboxes.testing import BackendConformance

NOBODY = 65534


class TestFilesystemConformance(BackendConformance):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> FilesystemBackend:
        return FilesystemBackend(tmp_path / "root")


# --------------------------------------------------------------------------- fixtures & helpers


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "root"


@pytest.fixture
def backend(root: Path) -> FilesystemBackend:
    return FilesystemBackend(root)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the root that nothing done through the backend may touch."""
    target = tmp_path / "outside"
    (target / "sub").mkdir(parents=True)
    (target / "secret.txt").write_text("SECRET\n")
    (target / "sub" / "deep.txt").write_text("SECRET deep\n")
    return target


def _snapshot(directory: Path) -> dict[str, bytes | None]:
    """Every entry under ``directory`` with its bytes (``None`` for directories)."""
    return {
        str(path.relative_to(directory)): None if path.is_dir() else path.read_bytes()
        for path in sorted(directory.rglob("*"))
    }


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# --------------------------------------------------------------------------- escapes


LINK_TARGETS = ("/dirlink/secret.txt", "/rellink/secret.txt", "/filelink", "/dangling", "/real/inner/secret.txt")
LINKED_DIRS = ("/dirlink", "/rellink", "/real/inner", "/internal")


@pytest.fixture
def linked(root: Path, outside: Path, backend: FilesystemBackend) -> Path:
    """Symlinks of every flavour inside the root."""
    assert backend.write("/real/own.txt", "SECRET own\n").error is None
    (root / "dirlink").symlink_to(outside)  # absolute, to a directory outside
    (root / "rellink").symlink_to("../outside")  # relative, escaping upwards
    (root / "filelink").symlink_to(outside / "secret.txt")
    (root / "dangling").symlink_to(outside / "created.txt")  # would create a file outside
    (root / "real" / "inner").symlink_to(outside)  # an intermediate component deeper down
    (root / "internal").symlink_to(root / "real")  # stays inside the root, refused all the same
    return outside


@pytest.mark.parametrize("target", LINK_TARGETS)
def test_file_operations_through_symlinks_are_refused(backend: FilesystemBackend, linked: Path, target: str) -> None:
    before = _snapshot(linked)
    assert backend.read(target).error == p.PERMISSION_DENIED
    assert backend.write(target, "pwned").error == p.PERMISSION_DENIED
    assert backend.edit(target, "SECRET", "pwned").error == p.PERMISSION_DENIED
    assert backend.upload_files([(target, b"pwned")])[0].error == p.PERMISSION_DENIED
    [download] = backend.download_files([target])
    assert (download.error, download.content) == (p.PERMISSION_DENIED, None)
    assert backend.grep("SECRET", target).error == p.PERMISSION_DENIED
    assert backend.glob("*", target).error == p.PERMISSION_DENIED
    message = backend.read(target).message
    assert message is not None
    assert "symbolic link" in message
    assert _snapshot(linked) == before
    assert not (linked / "created.txt").exists()


@pytest.mark.parametrize("directory", LINKED_DIRS)
def test_directory_operations_through_symlinks_are_refused(
    backend: FilesystemBackend, linked: Path, directory: str
) -> None:
    before = _snapshot(linked)
    assert backend.ls(directory).error == p.PERMISSION_DENIED
    assert backend.grep("SECRET", directory).error == p.PERMISSION_DENIED
    assert backend.glob("**/*", directory).error == p.PERMISSION_DENIED
    assert backend.write(f"{directory}/new/deeper.txt", "x").error == p.PERMISSION_DENIED
    assert backend.delete(f"{directory}/secret.txt").error == p.PERMISSION_DENIED
    assert backend.read(f"{directory}/sub/deep.txt").error == p.PERMISSION_DENIED
    assert _snapshot(linked) == before
    assert not (linked / "new").exists()


def test_walks_never_follow_symlinks(backend: FilesystemBackend, linked: Path) -> None:
    grep = backend.grep("SECRET")
    assert grep == p.GrepResult(matches=[p.GrepMatch("/real/own.txt", 1, "SECRET own")])
    assert [m.path for m in backend.glob("**/*").matches or []] == ["/real/own.txt"]
    assert [m.path for m in backend.glob("*.txt").matches or []] == ["/real/own.txt"]
    assert backend.grep("SECRET", "/real") == grep


def test_ls_lists_symlinks_as_plain_entries(backend: FilesystemBackend, linked: Path, root: Path) -> None:
    entries = {e.path: e for e in backend.ls("/").entries or []}
    assert sorted(entries) == ["/dangling", "/dirlink", "/filelink", "/internal", "/real/", "/rellink"]
    link = entries["/dirlink"]
    assert (link.is_dir, link.size) == (False, len(str(linked)))  # the link's own size, not the target's
    assert [e.path for e in backend.ls("/real").entries or []] == ["/real/inner", "/real/own.txt"]


def test_delete_removes_links_never_targets(backend: FilesystemBackend, linked: Path, root: Path) -> None:
    before = _snapshot(linked)
    for link in ("/dirlink", "/rellink", "/filelink", "/dangling", "/internal"):
        assert backend.delete(link) == p.DeleteResult(path=link)
        assert not os.path.lexists(root / link[1:])
    assert backend.delete("/real") == p.DeleteResult(path="/real")  # holds the link `inner`
    assert backend.ls("/") == p.LsResult(entries=[])
    assert _snapshot(linked) == before


def test_absolute_paths_stay_under_the_root(backend: FilesystemBackend, root: Path) -> None:
    real = Path("/etc/hostname").read_bytes() if Path("/etc/hostname").exists() else None
    assert backend.read("/etc/hostname").error == p.FILE_NOT_FOUND
    assert backend.write("/etc/hostname", "jail").error is None
    assert (root / "etc" / "hostname").read_text() == "jail"
    assert (Path("/etc/hostname").read_bytes() if real is not None else None) == real
    assert backend.read(str(root / "etc" / "hostname")).error == p.FILE_NOT_FOUND  # host path means nothing
    assert backend.write("/../outside.txt", "x").error == p.INVALID_PATH
    assert not (root.parent / "outside.txt").exists()


def test_hard_links_are_replaced_not_written_through(backend: FilesystemBackend, outside: Path, root: Path) -> None:
    root.mkdir(exist_ok=True)
    os.link(outside / "secret.txt", root / "hard.txt")
    assert backend.write("/hard.txt", "replaced\n").error is None
    assert (root / "hard.txt").read_text() == "replaced\n"
    assert (outside / "secret.txt").read_text() == "SECRET\n"
    os.link(outside / "secret.txt", root / "hard2.txt")
    assert backend.edit("/hard2.txt", "SECRET", "edited").error is None
    assert (outside / "secret.txt").read_text() == "SECRET\n"


def test_symlink_swapped_in_concurrently_never_escapes(backend: FilesystemBackend, outside: Path, root: Path) -> None:
    """A directory that keeps turning into a symlink to the outside (the classic TOCTOU race):
    whatever the interleaving, nothing outside is read, written or deleted."""
    assert backend.write("/flip/secret.txt", "inside\n").error is None
    (outside / "victim").write_text("keep me")
    before = _snapshot(outside)
    stop = threading.Event()
    flips = 0

    def flipper() -> None:
        # The backend's own writes may recreate `flip` as a fresh directory at any moment
        # (write creates parents), so every step tolerates losing the race.
        nonlocal flips
        while not stop.is_set():
            parked = root / f"parked{flips}"
            with contextlib.suppress(OSError):
                os.rename(root / "flip", parked)
            with contextlib.suppress(OSError):
                (root / "flip").symlink_to(outside)
            with contextlib.suppress(OSError):
                os.unlink(root / "flip")
            with contextlib.suppress(OSError):
                os.rename(parked, root / "flip")
            flips += 1

    thread = threading.Thread(target=flipper)
    thread.start()
    outcomes: set[str | None] = set()
    try:
        for i in range(1000):
            read = backend.read("/flip/secret.txt")
            assert read.file_data is None or "SECRET" not in read.file_data.content
            outcomes.add(read.error)
            outcomes.add(backend.write(f"/flip/new{i % 3}.txt", "x").error)
            outcomes.add(backend.edit("/flip/secret.txt", "SECRET", "pwned").error)
            outcomes.add(backend.delete("/flip/victim").error)
            assert backend.grep("SECRET", "/flip").matches in (None, [])
            assert {m.path for m in backend.glob("*", "/flip").matches or []} <= {
                "/flip/secret.txt",
                *(f"/flip/new{n}.txt" for n in range(3)),
            }
    finally:
        stop.set()
        thread.join()
    assert _snapshot(outside) == before
    assert flips > 100
    assert None in outcomes  # the race was real: some operations did run inside the directory
    assert p.PERMISSION_DENIED in outcomes or p.FILE_NOT_FOUND in outcomes


# --------------------------------------------------------------------------- permissions (errno mapping)


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A root the unprivileged user can reach (pytest's tmp_path is private to root)."""
    directory = Path(tempfile.mkdtemp(prefix="fs-backend-"))
    directory.chmod(0o755)
    yield directory / "root"
    for path in directory.rglob("*"):  # tests lock directories; unlock them so cleanup works unprivileged
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o700)
    shutil.rmtree(directory)


_UNPRIVILEGED = """
import json, os, sys
from sandboxes import protocol as p
from sandboxes.filesystem import FilesystemBackend
from sandboxes.semantics import compile_glob
compile_glob("*")  # imports the glob matcher now, before the interpreter's files may be out of reach
try:
    os.setgroups([]); os.setgid({uid}); os.setuid({uid})
except PermissionError:
    sys.exit(77)
backend = FilesystemBackend(sys.argv[1])
result = {{}}
{body}
print(json.dumps(result))
"""


def _as_unprivileged(root: Path, body: str) -> dict[str, object]:
    """Run ``body`` (which fills ``result``) against a backend on ``root`` as a user subject to
    file permissions. Root ignores permission bits, so under root (as in CI containers) it runs
    in a child that drops to uid 65534 after importing; otherwise right here."""
    if os.geteuid() != 0:
        namespace: dict[str, object] = {"backend": FilesystemBackend(root), "result": {}, "p": p}
        exec(body, namespace)
        return json.loads(json.dumps(namespace["result"]))  # type: ignore[no-any-return]
    for path in [root, *root.rglob("*")]:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    script = _UNPRIVILEGED.format(uid=NOBODY, body=body)
    done = subprocess.run([sys.executable, "-c", script, str(root)], capture_output=True, text=True, timeout=60)
    needs(done.returncode != 77, "running as root without CAP_SETUID: cannot drop to an unprivileged user")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_unreadable_file_is_permission_denied(shared_root: Path) -> None:
    FilesystemBackend(shared_root).write("/d/locked.txt", "private needle\n")
    (shared_root / "d" / "open.txt").write_text("public needle\n")
    (shared_root / "d" / "locked.txt").chmod(0o000)
    result = _as_unprivileged(
        shared_root,
        """
result["read"] = backend.read("/d/locked.txt").error
result["download"] = backend.download_files(["/d/locked.txt"])[0].error
result["edit"] = backend.edit("/d/locked.txt", "private", "x").error
result["write"] = backend.write("/d/locked.txt", "x").error
result["grep"] = [m.path for m in backend.grep("needle").matches]
result["ls"] = [e.path for e in backend.ls("/d").entries]
""",
    )
    assert result == {
        "read": p.PERMISSION_DENIED,
        "download": p.PERMISSION_DENIED,
        "edit": p.PERMISSION_DENIED,
        "write": p.PERMISSION_DENIED,
        "grep": ["/d/open.txt"],  # unreadable files are skipped, as grep -s does
        "ls": ["/d/locked.txt", "/d/open.txt"],
    }
    (shared_root / "d" / "locked.txt").chmod(0o600)
    assert (shared_root / "d" / "locked.txt").read_text() == "private needle\n"


def test_read_only_file_stays_read_only(shared_root: Path) -> None:
    FilesystemBackend(shared_root).write("/ro.txt", "original\n")
    (shared_root / "ro.txt").chmod(0o444)
    result = _as_unprivileged(
        shared_root,
        """
result["write"] = backend.write("/ro.txt", "x").error
result["upload"] = backend.upload_files([("/ro.txt", b"x")])[0].error
result["edit"] = backend.edit("/ro.txt", "original", "x").error
result["read"] = backend.read("/ro.txt").file_data.content
result["delete"] = backend.delete("/ro.txt").error
""",
    )
    # Like `echo > ro.txt` (refused) and `rm -f ro.txt` in a writable directory (allowed).
    assert result == {
        "write": p.PERMISSION_DENIED,
        "upload": p.PERMISSION_DENIED,
        "edit": p.PERMISSION_DENIED,
        "read": "original\n",
        "delete": None,
    }


def test_read_only_and_locked_directories(shared_root: Path) -> None:
    backend = FilesystemBackend(shared_root)
    backend.write("/ro/f.txt", "kept\n")
    backend.write("/locked/hidden.txt", "needle\n")
    backend.write("/visible.txt", "needle\n")
    (shared_root / "ro").chmod(0o555)
    (shared_root / "locked").chmod(0o000)
    result = _as_unprivileged(
        shared_root,
        """
result["write_new"] = backend.write("/ro/new.txt", "x").error
result["write_parents"] = backend.write("/ro/sub/new.txt", "x").error
result["write_existing"] = backend.write("/ro/f.txt", "x").error
result["delete"] = backend.delete("/ro/f.txt").error
result["ls_locked"] = backend.ls("/locked").error
result["read_locked"] = backend.read("/locked/hidden.txt").error
result["glob"] = [m.path for m in backend.glob("**/*.txt").matches]
result["grep"] = [m.path for m in backend.grep("needle").matches]
result["delete_tree"] = backend.delete("/locked").error
""",
    )
    assert result == {
        "write_new": p.PERMISSION_DENIED,
        # Writes are atomic renames, so they need the directory writable even for an
        # existing writable file (a shell's in-place `>` would not): documented trade-off.
        "write_existing": p.PERMISSION_DENIED,
        "write_parents": p.PERMISSION_DENIED,
        "delete": p.PERMISSION_DENIED,
        "ls_locked": p.PERMISSION_DENIED,
        "read_locked": p.PERMISSION_DENIED,
        "glob": ["/ro/f.txt", "/visible.txt"],  # unreadable directories are skipped, as find does
        "grep": ["/visible.txt"],
        "delete_tree": p.PERMISSION_DENIED,
    }
    (shared_root / "locked").chmod(0o755)
    assert (shared_root / "ro" / "f.txt").read_text() == "kept\n"
    assert (shared_root / "locked" / "hidden.txt").exists()
    assert sorted(os.listdir(shared_root / "ro")) == ["f.txt"]  # no temporary file left behind


def test_full_disk_is_no_space_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """ENOSPC on a 256 KiB tmpfs mounted in a private mount namespace (needs root)."""
    needs(shutil.which("unshare") is not None and os.geteuid() == 0, "needs root and unshare(1) to mount a tmpfs")
    mountpoint = tmp_path / "tiny"
    mountpoint.mkdir()
    script = """
import json, os, sys
from sandboxes.filesystem import FilesystemBackend
backend = FilesystemBackend(sys.argv[1])
small = backend.write("/small.txt", "fits\\n").error
big = backend.write("/big.txt", "x" * (1 << 20)).error
over = backend.write("/small.txt", "y" * (1 << 20)).error
upload = backend.upload_files([("/up.bin", b"z" * (1 << 20))])[0].error
kept = open(os.path.join(sys.argv[1], "small.txt")).read()
print(json.dumps([small, big, over, upload, kept, sorted(os.listdir(sys.argv[1]))]))
"""
    command = 'mount -t tmpfs -o size=256k tmpfs "$1" || exit 77; exec "$2" -c "$3" "$1"'
    namespace = ["unshare", "--mount", "--propagation", "private"]
    done = subprocess.run(
        [*namespace, "sh", "-c", command, "sh", mountpoint, sys.executable, script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    needs(done.returncode != 77 and not done.stderr.startswith("unshare:"), f"cannot mount a tmpfs: {done.stderr}")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [None, p.NO_SPACE, p.NO_SPACE, p.NO_SPACE, "fits\n", ["small.txt"]]


# --------------------------------------------------------------------------- content and names


def test_binary_roundtrip_is_byte_exact_on_disk(backend: FilesystemBackend, root: Path) -> None:
    blob = bytes(range(256)) * 4096 + os.urandom(4096)
    assert backend.upload_files([("/bin/blob", blob)]) == [p.FileUploadResponse("/bin/blob")]
    assert (root / "bin" / "blob").read_bytes() == blob
    assert backend.download_files(["/bin/blob"])[0].content == blob
    small = bytes(range(256))
    backend.upload_files([("/bin/small", small)])
    read = backend.read("/bin/small")
    assert read.file_data is not None
    assert (read.file_data.encoding, base64.b64decode(read.file_data.content)) == ("base64", small)
    assert backend.write("/nul.txt", "a\x00b").error is None  # NUL is text to write, binary to read
    assert (root / "nul.txt").read_bytes() == b"a\x00b"
    assert backend.edit("/bin/small", "a", "b").error == p.NOT_A_TEXT_FILE


WEIRD_NAMES = (
    "日本語 ファイル.txt",
    "new\nline",
    "tab\tand space ",
    "emoji 🦀",
    "-rf",
    "back\\slash",
    "..dots..",
    "a" * 255,
)


@pytest.mark.parametrize("name", WEIRD_NAMES, ids=repr)
def test_weird_names_map_to_the_same_host_name(backend: FilesystemBackend, root: Path, name: str) -> None:
    path = f"/dir/{name}"
    assert backend.write(path, "needle\n") == p.WriteResult(path=path)
    assert (root / "dir" / name).read_text() == "needle\n"
    assert [e.path for e in backend.ls("/dir").entries or []] == [path]
    assert backend.grep("needle", "/dir") == p.GrepResult(matches=[p.GrepMatch(path, 1, "needle")])
    assert backend.edit(path, "needle", "thread").occurrences == 1
    assert backend.delete(path) == p.DeleteResult(path=path)
    assert os.listdir(root / "dir") == []


def test_name_longer_than_the_filesystem_allows_is_invalid_path(backend: FilesystemBackend) -> None:
    assert backend.write("/" + "a" * 256, "x").error == p.INVALID_PATH
    assert backend.read("/" + "a" * 256).error == p.INVALID_PATH


def test_non_utf8_host_names_roundtrip(backend: FilesystemBackend, root: Path) -> None:
    root.mkdir(exist_ok=True)
    raw_name = b"caf\xe9.txt"  # latin-1, not UTF-8: made by some other program
    with open(os.path.join(os.fsencode(root), raw_name), "wb") as handle:
        handle.write(b"legacy\n")
    [entry] = backend.ls("/").entries or []
    assert entry.path == "/" + os.fsdecode(raw_name)
    read = backend.read(entry.path)
    assert read.file_data is not None
    assert read.file_data.content == "legacy\n"
    assert backend.delete(entry.path).error is None
    assert os.listdir(root) == []


# --------------------------------------------------------------------------- special files


def test_fifo_is_listed_but_never_opened(backend: FilesystemBackend, root: Path) -> None:
    backend.write("/text.txt", "needle\n")
    os.mkfifo(root / "pipe")  # opening it for reading would block forever
    assert backend.read("/pipe").error == p.INVALID_ARGUMENT
    assert backend.edit("/pipe", "a", "b").error == p.INVALID_ARGUMENT
    assert backend.write("/pipe", "x").error == p.INVALID_ARGUMENT
    assert backend.download_files(["/pipe"])[0].error == p.INVALID_ARGUMENT
    assert [(e.path, e.is_dir, e.size) for e in backend.ls("/").entries or []] == [
        ("/pipe", False, 0),
        ("/text.txt", False, 7),
    ]
    assert [m.path for m in backend.grep("needle").matches or []] == ["/text.txt"]
    assert [m.path for m in backend.glob("*").matches or []] == ["/text.txt"]
    assert backend.glob("*", "/pipe") == p.GlobResult(matches=[])  # like find -type f on it
    assert backend.delete("/pipe") == p.DeleteResult(path="/pipe")
    assert stat.S_ISREG(os.stat(root / "text.txt").st_mode)


def test_device_nodes_are_never_opened(backend: FilesystemBackend, root: Path) -> None:
    root.mkdir(exist_ok=True)
    try:
        os.mknod(root / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        needs(False, "creating a device node needs CAP_MKNOD")
    assert backend.read("/null").error == p.INVALID_ARGUMENT
    assert backend.write("/null", "x").error == p.INVALID_ARGUMENT
    assert stat.S_ISCHR(os.stat(root / "null", follow_symlinks=False).st_mode)  # not replaced
    assert backend.delete("/null").error is None


# --------------------------------------------------------------------------- size cap, config


def test_max_file_bytes_caps_read_edit_and_grep(root: Path) -> None:
    backend = FilesystemBackend(config=FilesystemBackendConfig(root_dir=root, max_file_bytes=100))
    backend.write("/exact.txt", "n" * 99 + "\n")
    backend.write("/over.txt", "n" * 100 + "\n")
    assert backend.read("/exact.txt").error is None
    assert backend.edit("/exact.txt", "nn", "mm", replace_all=True).error is None
    over = backend.read("/over.txt")
    assert over.error == p.FILE_TOO_LARGE
    assert over.message is not None
    assert "download_files" in over.message
    assert backend.edit("/over.txt", "n", "m").error == p.FILE_TOO_LARGE
    assert backend.download_files(["/over.txt"])[0].content == b"n" * 100 + b"\n"
    assert [m.path for m in backend.grep("n").matches or []] == ["/exact.txt"]


def test_config_and_constructor(tmp_path: Path) -> None:
    created = FilesystemBackend(tmp_path / "a" / "b")
    assert created.root == (tmp_path / "a" / "b").resolve()
    assert created.root.is_dir()
    assert created.config.max_file_bytes == 256 << 20
    with pytest.raises(ValueError, match="root_dir or a config"):
        FilesystemBackend()
    with pytest.raises(ValueError, match="not both"):
        FilesystemBackend(tmp_path, FilesystemBackendConfig(root_dir=tmp_path))
    with pytest.raises(ValidationError):
        FilesystemBackendConfig(root_dir=tmp_path, max_file_bytes=0)
    with pytest.raises(ValidationError):
        FilesystemBackendConfig(root_dir=tmp_path, surprise=True)  # type: ignore[call-arg]
    (tmp_path / "file").write_text("x")
    with pytest.raises((ValueError, FileExistsError)):
        FilesystemBackend(tmp_path / "file")


def test_root_removed_after_creation_is_unavailable(tmp_path: Path) -> None:
    backend = FilesystemBackend(tmp_path / "gone")
    (tmp_path / "gone").rmdir()
    assert backend.ls("/").error == p.UNAVAILABLE
    assert backend.write("/x", "y").error == p.UNAVAILABLE


# --------------------------------------------------------------------------- atomic writes


def test_write_replaces_atomically_and_keeps_the_mode(backend: FilesystemBackend, root: Path) -> None:
    backend.write("/script.sh", "#!/bin/sh\necho old\n")
    (root / "script.sh").chmod(0o751)
    inode = os.stat(root / "script.sh").st_ino
    assert backend.write("/script.sh", "#!/bin/sh\necho new\n").error is None
    assert stat.S_IMODE(os.stat(root / "script.sh").st_mode) == 0o751
    assert os.stat(root / "script.sh").st_ino != inode  # a new file renamed over the old one
    assert backend.edit("/script.sh", "new", "newer").error is None
    assert stat.S_IMODE(os.stat(root / "script.sh").st_mode) == 0o751
    umask = os.umask(0)
    os.umask(umask)
    backend.write("/fresh.txt", "x")
    assert stat.S_IMODE(os.stat(root / "fresh.txt").st_mode) == 0o666 & ~umask
    backend.write("/script.sh/below", "x")  # refused: must not leave a temporary file either
    assert sorted(os.listdir(root)) == ["fresh.txt", "script.sh"]


class _RacedBackend(FilesystemBackend):
    """Another process rewrites the file between edit's read and its rename (a real write on
    disk at the one moment a concurrent writer would have to hit)."""

    def _fetch(self, path: str, *, capped: bool = True, cap: int | None = None) -> tuple[bytes, os.stat_result]:
        fetched = super()._fetch(path, capped=capped, cap=cap)
        (self.root / path.lstrip("/")).write_text("someone else's version\n")
        return fetched


def test_edit_detects_a_concurrent_write(root: Path) -> None:
    backend = _RacedBackend(root)
    backend.write("/f.txt", "mine\n")
    assert backend.edit("/f.txt", "mine", "edited").error == p.FILE_CHANGED
    assert (root / "f.txt").read_text() == "someone else's version\n"
    assert os.listdir(root) == ["f.txt"]


# --------------------------------------------------------------------------- resources


@pytest.fixture
def few_descriptors() -> Iterator[Callable[[], None]]:
    """Lower the open-file limit to a little above what is open now, for the block's duration."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (_open_fds() + 16, hard))

    yield lower
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_deep_trees_need_neither_recursion_nor_a_descriptor_per_level(
    backend: FilesystemBackend, few_descriptors: Callable[[], None]
) -> None:
    deep = "/" + "/".join(["d"] * 1500) + "/bottom.txt"  # deeper than the recursion limit
    assert backend.write(deep, "needle\n").error is None
    few_descriptors()
    assert backend.grep("needle") == p.GrepResult(matches=[p.GrepMatch(deep, 1, "needle")])
    assert backend.glob("**/bottom.txt") == p.GlobResult(matches=[p.FileInfo(deep)])
    assert backend.delete("/d") == p.DeleteResult(path="/d")
    assert backend.ls("/") == p.LsResult(entries=[])


def test_no_descriptor_leaks(backend: FilesystemBackend, linked: Path) -> None:
    def battery() -> None:
        backend.write("/a/b/c.txt", "x\n")
        backend.write("/a/b/c.txt/d", "x")
        backend.read("/a/b/c.txt")
        backend.read("/missing/x")
        backend.read("/dirlink/secret.txt")
        backend.edit("/a/b/c.txt", "x", "y")
        backend.ls("/a")
        backend.ls("/filelink")
        backend.grep("y")
        backend.grep("\n", "/a")
        backend.glob("**/*")
        backend.upload_files([("/u", b"\x00"), ("/dirlink/u", b"x")])
        backend.download_files(["/u", "/nope", "/a"])
        backend.delete("/a")
        backend.delete("/missing")

    battery()
    before = _open_fds()
    for _ in range(20):
        battery()
    assert _open_fds() == before
