"""The disk bound of a `LocalSandbox` for commands: a loop-mounted ext4 image of ``disk`` bytes.

Started by root, a sandbox that owns its root directory keeps its files in an image file beside
it (``<root>.sandbox-disk``, sparse: the host's disk is taken as files are written, and given
back as they are removed, through ``discard``). The image is mounted at ``<root>.sandbox-disk.d``
and holds two directories: ``sandbox-root``, bind-mounted on the root directory (so the caller
and the jail see the same path as ever), and ``sandbox-tmp``, where each jail has its ``/tmp``.
Whatever a command writes to either, the filesystem answers ``No space left on device`` once
the image is full. Mounts live in the host's mount namespace, so they outlive the process that
made them: a sandbox attached again (a service restarted) finds them, or mounts the image again
after a reboot; `release` (destroy) unmounts, detaches the loop device and deletes the image,
and an image never outlives its root directory (made after it, deleted before it).

Elsewhere (not root, no ``/dev/loop-control``, no ``mkfs.ext4``, a root directory the caller
brought) the bound stays per file for commands (``RLIMIT_FSIZE``, `sandboxes.local._limits`);
`available` says which, and the first sandbox that falls back logs why.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

__all__ = ["TEMP_PREFIX", "Disk", "Owner", "available", "image_of", "reclaim_orphans", "release", "release_under"]

logger = logging.getLogger(__name__)

IMAGE_SUFFIX = ".sandbox-disk"
MOUNT_SUFFIX = ".sandbox-disk.d"
ROOT_DIR = "sandbox-root"
TMP_DIR = "sandbox-tmp"
_TOOLS = ("mkfs.ext4", "mount", "umount", "losetup")
TEMP_PREFIX = "sandboxes-tmp-"
"""Marks the root directories `LocalSandbox.create` makes in the temporary directory: each lives
as long as the process that made it, which holds its lock (`Owner`)."""
LOCK_SUFFIX = ".sandbox-lock"


@functools.cache
def available() -> str | None:
    """``None`` where images can be mounted here, else why not (one sentence)."""
    if os.geteuid() != 0:
        return "not started by root (mounting a loop device needs root)"
    if not os.path.exists("/dev/loop-control"):
        return "no /dev/loop-control (loop devices unavailable)"
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    return f"{', '.join(missing)} not installed" if missing else None


_warned: list[str] = []


def warn_fallback(reason: str) -> None:
    """Say once per process that commands get only the per-file bound, and why."""
    if not _warned:
        _warned.append(reason)
        logger.warning(
            "local sandboxes bound each file a command writes, not their total, to the disk bound: %s", reason
        )


def image_of(root: Path) -> Path:
    return root.with_name(root.name + IMAGE_SUFFIX)


def _mount_dir(root: Path) -> Path:
    return root.with_name(root.name + MOUNT_SUFFIX)


class Disk:
    """A sandbox's mounted image: ``root`` shows its ``sandbox-root``; ``tmp`` holds its jails' /tmp."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.image = image_of(root)
        self.mount = _mount_dir(root)
        self.tmp = self.mount / TMP_DIR

    @classmethod
    def create(cls, root: Path, size: int) -> Disk:
        """A fresh image of ``size`` bytes mounted on ``root`` (an empty directory); on failure
        nothing is left behind and `OSError` says why."""
        disk = cls(root)
        try:
            fd = os.open(disk.image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.ftruncate(fd, size)
            finally:
                os.close(fd)
            options = "lazy_itable_init=1,lazy_journal_init=1,nodiscard"
            _run("mkfs.ext4", "-q", "-F", "-m", "0", "-E", options, str(disk.image))
            disk.mount.mkdir(mode=0o700)
            disk._mount()
        except BaseException:
            with contextlib.suppress(OSError):
                release(root)
            root.mkdir(mode=0o755, exist_ok=True)  # the sandbox goes on without an image
            raise
        return disk

    @classmethod
    def existing(cls, root: Path) -> Disk | None:
        """The image a sandbox made for ``root`` earlier (mounted again if it is not, after a
        reboot), or ``None`` if there is none of ours."""
        disk = cls(root)
        try:
            info = disk.image.lstat()
        except FileNotFoundError:
            return None
        if not disk.image.is_file() or disk.image.is_symlink() or info.st_uid != os.geteuid():
            return None
        disk.mount.mkdir(mode=0o700, exist_ok=True)
        disk._mount()
        return disk

    def _mount(self) -> None:
        if not os.path.ismount(self.mount):
            _run("mount", "-o", "loop,discard,noinit_itable,nosuid,nodev", str(self.image), str(self.mount))
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(self.mount / "lost+found")  # the sandbox never sees it; fsck makes it anew
        for name in (ROOT_DIR, TMP_DIR):
            (self.mount / name).mkdir(mode=0o755, exist_ok=True)
        if not os.path.ismount(self.root):
            _run("mount", "--bind", str(self.mount / ROOT_DIR), str(self.root))


def release(root: Path) -> None:
    """Unmount ``root``'s image, detach its loop device, delete it (none is fine). `OSError`
    if it stays mounted: the root's files are in it, and must not be removed underneath."""
    image, mount = image_of(root), _mount_dir(root)
    if not image.exists() and not mount.exists():
        return
    for point in (root, mount):
        if os.path.ismount(point):
            _run("umount", str(point))
    # Every jail launched while the image was mounted holds a copy of these mounts in its own
    # namespace; removing the directories they sit on detaches those copies (Linux >= 3.18).
    for point in (mount, root):
        with contextlib.suppress(FileNotFoundError, OSError):
            point.rmdir()
    start = time.monotonic()
    detached = False
    while devices := _devices_of(image):  # unmounted, the kernel detaches it by itself, soon
        if not detached and time.monotonic() > start + 0.2:  # or not: attached by hand, say
            detached = True
            for device in devices:
                subprocess.run(["losetup", "-d", device], check=False, capture_output=True)
        if time.monotonic() > start + 2:  # a jail still running holds it: freed when that jail ends
            logger.warning("the image of %s stays attached until the jails using it end", root)
            break
        time.sleep(0.005)
    image.unlink(missing_ok=True)


def release_under(top: Path) -> list[Path]:
    """`release` every sandbox disk mounted below ``top`` (a base dir being given up, a test
    run's temporary tree); the roots released."""
    released = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        point = Path(re.sub(r"\\([0-7]{3})", lambda match: chr(int(match[1], 8)), fields[4]))
        if point.name.endswith(MOUNT_SUFFIX) and point.is_relative_to(top):
            root = point.with_name(point.name.removesuffix(MOUNT_SUFFIX))
            with contextlib.suppress(OSError):
                release(root)
                released.append(root)
    return released


class Owner:
    """The lock a process holds on a temporary root directory it made (``<root>.sandbox-lock``)
    for as long as it may use it: the kernel drops it when the process dies, however it dies,
    so a root whose lock is free was left behind (`reclaim_orphans`)."""

    def __init__(self, root: Path) -> None:
        self.path = root.with_name(root.name + LOCK_SUFFIX)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def release(self) -> None:
        """The root is gone: drop the lock and its file (idempotent)."""
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


def reclaim_orphans(top: Path) -> list[Path]:
    """Release the images (mounted or not) of the temporary roots under ``top`` (`TEMP_PREFIX`)
    whose process is gone (their lock is free), and remove those roots; the roots reclaimed."""
    reclaimed = []
    for image in top.glob(f"{TEMP_PREFIX}*{IMAGE_SUFFIX}"):
        root = image.with_name(image.name.removesuffix(IMAGE_SUFFIX))
        lock = root.with_name(root.name + LOCK_SUFFIX)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # no lock: not made by `Owner` (or being made right now): not ours to judge
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its process lives
            os.close(fd)
            continue
        try:
            release(root)
            shutil.rmtree(root, ignore_errors=True)
            lock.unlink(missing_ok=True)
            reclaimed.append(root)
        except OSError as exc:
            logger.warning("could not reclaim the sandbox %s left by a process that died: %s", root, exc)
        finally:
            os.close(fd)
    if reclaimed:
        logger.info("reclaimed %d local sandboxes left by processes that died", len(reclaimed))
    return reclaimed


def _devices_of(image: Path) -> list[str]:
    """The loop devices ``image`` is attached to (read from sysfs: no process started)."""
    names = {str(image), os.path.realpath(image)}
    devices = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if backing.read_text().rstrip("\n") in names:
                devices.append(f"/dev/{backing.parent.parent.name}")
    return devices


def _run(*argv: str) -> None:
    done = subprocess.run(argv, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"{' '.join(argv[:2])} failed: {(done.stderr or done.stdout).strip()[:300]}")
