"""Resource limits of a `LocalSandbox`: a cgroup per sandbox where cgroups can be written,
rlimits otherwise.

A cgroup bounds the whole jail (every command, the exec helper, everything they fork) as one:
memory (no swap), CPU bandwidth and the number of processes, so a memory hog is killed by the
kernel's OOM killer inside the cgroup (and reported, `Cgroup.oom_kills`) and a fork bomb hits
``pids.max`` instead of the host's process table. Both cgroup v2 (``/sys/fs/cgroup`` is
``cgroup2fs``: one tree, the controllers enabled in ``sandboxes-local``'s subtree) and v1 (one
tree per controller) are written; the caller must be allowed to (root, or a delegated tree).

Without a writable cgroup the limits fall back to rlimits set on the launch process and
inherited by the jail: ``RLIMIT_AS`` for memory (address space, not memory used: a coarse
bound that also refuses big reservations), ``RLIMIT_NPROC`` for processes (counted per host
uid, so set to what that uid runs at launch plus the sandbox's allowance), and no CPU bound (``RLIMIT_CPU``
is total CPU time, which would kill the long-lived exec helper).

``RLIMIT_FSIZE`` always bounds each file a command writes to the disk bound (see
`sandboxes.local` for the disk bound as a whole).
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["USAGE_FRESH", "Cgroup", "UsageCount", "disk_usage", "launch_limits", "tasks_of"]

logger = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "sandboxes-local"
CPU_PERIOD_US = 100_000


class Cgroup:
    """The sandbox's cgroup (one directory under v2, one per controller under v1)."""

    def __init__(self, directories: list[Path], version: int) -> None:
        self.directories = directories
        self.version = version

    @property
    def procs_files(self) -> list[str]:
        """Write a pid here (every one of them) to put that process, and its future children,
        under the limits."""
        return [str(directory / "cgroup.procs") for directory in self.directories]

    @classmethod
    def create(cls, name: str, *, memory: int, cpus: float, pids: int) -> Cgroup | None:
        """A fresh cgroup with the limits written, or ``None`` where cgroups cannot be written."""
        try:
            if _filesystem_type(CGROUP_ROOT) == "cgroup2fs":
                return cls._create_v2(name, memory, cpus, pids)
            return cls._create_v1(name, memory, cpus, pids)
        except OSError as exc:
            logger.info("no cgroup for %s (%s): limits fall back to rlimits", name, exc)
            return None

    @classmethod
    def _create_v2(cls, name: str, memory: int, cpus: float, pids: int) -> Cgroup:
        parent = CGROUP_ROOT / PARENT
        parent.mkdir(exist_ok=True)
        for tree in (CGROUP_ROOT, parent):
            _write(tree / "cgroup.subtree_control", "+memory +pids +cpu")
        directory = parent / name
        _fresh(directory, 2)
        group = cls([directory], 2)
        try:
            _write(directory / "memory.max", str(memory))
            with contextlib.suppress(FileNotFoundError):  # no swap accounting: nothing to bound
                _write(directory / "memory.swap.max", "0")
            _write(directory / "pids.max", str(pids))
            _write(directory / "cpu.max", f"{max(1000, int(cpus * CPU_PERIOD_US))} {CPU_PERIOD_US}")
        except OSError:
            group.remove()
            raise
        return group

    @classmethod
    def _create_v1(cls, name: str, memory: int, cpus: float, pids: int) -> Cgroup:
        directories: list[Path] = []
        group = cls(directories, 1)
        try:
            for controller in ("memory", "pids", "cpu"):
                directory = CGROUP_ROOT / controller / PARENT / name
                directory.parent.mkdir(exist_ok=True)
                _fresh(directory, 1)
                directories.append(directory)
            memory_dir, pids_dir, cpu_dir = directories
            _write(memory_dir / "memory.limit_in_bytes", str(memory))
            with contextlib.suppress(FileNotFoundError):  # memory+swap, where swap is accounted
                _write(memory_dir / "memory.memsw.limit_in_bytes", str(memory))
            _write(pids_dir / "pids.max", str(pids))
            _write(cpu_dir / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(cpu_dir / "cpu.cfs_quota_us", str(max(1000, int(cpus * CPU_PERIOD_US))))
        except OSError:
            group.remove()
            raise
        return group

    @classmethod
    def existing(cls, name: str) -> Cgroup | None:
        """The cgroup a sandbox of that name made, if it is still there (to remove one whose
        owner was killed before it could)."""
        try:
            v2 = _filesystem_type(CGROUP_ROOT) == "cgroup2fs"
        except OSError:
            return None
        if v2:
            directories = [CGROUP_ROOT / PARENT / name]
        else:
            controllers = ("memory", "pids", "cpu", "freezer")
            directories = [CGROUP_ROOT / controller / PARENT / name for controller in controllers]
        found = [directory for directory in directories if directory.is_dir()]
        return cls(found, 2 if v2 else 1) if found else None

    @property
    def pids_view(self) -> tuple[str, str]:
        """(host directory, path in the jail) showing the jail its own ``pids.max`` where the
        exec helper looks for it, so it knows it runs under a small pids limit."""
        if self.version == 2:
            return str(self.directories[0]), "/sys/fs/cgroup"
        return str(self.directories[1]), "/sys/fs/cgroup/pids"

    def oom_kills(self) -> int:
        """How many processes the OOM killer took in this cgroup so far."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            text = (self.directories[0] / name).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def throttled_periods(self) -> int:
        """How many CPU periods the cgroup was held back in for exceeding its CPU bandwidth."""
        directory = self.directories[0] if self.version == 2 else self.directories[2]
        try:
            for line in (directory / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "nr_throttled":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def kill_all(self) -> None:
        for _ in range(20):  # repeat: a process may fork while the list is read
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def pids(self) -> list[int]:
        """Every process in the cgroup now."""
        found: set[int] = set()
        for procs in self.procs_files:
            found.update(_read_pids(Path(procs)))
        return sorted(found)

    def freeze(self) -> bool:
        """Stop every process in the cgroup with the kernel's freezer; ``False`` where there is
        none to use (v1 without a ``freezer`` hierarchy)."""
        try:
            return self._freeze()
        except OSError:
            self.thaw()  # not left half frozen
            raise

    def _freeze(self) -> bool:
        if self.version == 2:
            _write(self.directories[0] / "cgroup.freeze", "1")
            return _settled(self.directories[0] / "cgroup.events", "frozen 1")
        freezer = self._v1_freezer()
        if freezer is None:
            return False
        for _ in range(50):  # move every process in; one forked meanwhile comes in the next pass
            moving = set(self.pids()) - set(_read_pids(freezer / "cgroup.procs"))
            for pid in moving:
                with contextlib.suppress(OSError):  # gone meanwhile
                    _write(freezer / "cgroup.procs", str(pid))
            if not moving:
                break
        _write(freezer / "freezer.state", "FROZEN")
        return _settled(freezer / "freezer.state", "FROZEN")

    def thaw(self) -> None:
        """Let every process of a frozen cgroup run again (a cgroup not frozen is left alone)."""
        if self.version == 2:
            with contextlib.suppress(FileNotFoundError):
                _write(self.directories[0] / "cgroup.freeze", "0")
            return
        for directory in self.directories:
            if (directory / "freezer.state").exists():
                _write(directory / "freezer.state", "THAWED")

    def _v1_freezer(self) -> Path | None:
        """The sandbox's own freezer cgroup, made the first time (and removed with the others)."""
        found = [directory for directory in self.directories if directory.parent.parent.name == "freezer"]
        if found:
            return found[0]
        top = CGROUP_ROOT / "freezer"
        if not top.is_dir():
            return None
        directory = top / PARENT / self.directories[0].name
        try:
            directory.parent.mkdir(exist_ok=True)
            directory.mkdir(exist_ok=True)
        except OSError as exc:
            logger.info("no freezer cgroup for %s: %s", directory.name, exc)
            return None
        self.directories.append(directory)
        return directory

    def remove(self) -> None:
        """Kill what is left in it and remove it (a cgroup with processes cannot be removed)."""
        with contextlib.suppress(OSError):
            self.thaw()  # a frozen process takes its SIGKILL only once thawed
        self.kill_all()
        for directory in self.directories:
            for _ in range(50):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # busy: the killed processes are not reaped yet
                    time.sleep(0.02)
            else:
                logger.warning("could not remove cgroup %s", directory)


def launch_limits(
    *, file_size: int, memory: int | None, pids: int | None, join: Sequence[str] = ()
) -> Callable[[], None]:
    """A ``preexec_fn`` for the launch process: set the rlimits and join the cgroup files in
    ``join``. It runs between fork and exec, so it only makes a few plain system calls."""
    limits = [(resource.RLIMIT_FSIZE, file_size)]
    if memory is not None:
        limits.append((resource.RLIMIT_AS, memory))
    if pids is not None:
        limits.append((resource.RLIMIT_NPROC, pids))
    joins = [os.fsencode(path) for path in join]

    def apply() -> None:
        for which, value in limits:
            resource.setrlimit(which, (value, value))
        for path in joins:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"0")  # 0: the writing process itself
            finally:
                os.close(fd)

    return apply


def tasks_of(uid: int) -> int:
    """How many tasks (threads) the host uid runs now: what ``RLIMIT_NPROC`` counts."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{entry}").st_uid == uid:
                count += len(os.listdir(f"/proc/{entry}/task"))
    return count


def disk_usage(*tops: Path) -> int:
    """Bytes of disk the trees under ``tops`` take (allocated blocks; symlinks not followed)."""
    total = 0
    pending = [str(top) for top in tops]
    while pending:
        with contextlib.suppress(OSError), os.scandir(pending.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
    return total


USAGE_FRESH = 1.0
"""Seconds a `UsageCount`'s walk of the trees stands for."""


class UsageCount:
    """What a sandbox bounded without its own filesystem holds: its trees walked (``count``) at
    most once every `USAGE_FRESH` seconds, what its own file operations wrote added between
    walks. A command's writes are seen at the next walk (commands are bounded per file there),
    so a stream of writes into a big tree costs one walk a second, not one each."""

    def __init__(self, count: Callable[[], int], clock: Callable[[], float] = time.monotonic) -> None:
        self._count, self._clock = count, clock
        self._lock = threading.Lock()
        self._used = 0
        self._at: float | None = None

    def used(self) -> int:
        with self._lock:
            now = self._clock()
            if self._at is None or now - self._at >= USAGE_FRESH:
                self._used, self._at = self._count(), now
            return self._used

    def add(self, written: int) -> None:
        """``written`` bytes (a replaced file's own size taken off) more since the last walk."""
        with self._lock:
            self._used += written


def _fresh(directory: Path, version: int) -> None:
    """Make ``directory``; one left by a previous owner of the name (a service that died and
    adopts its sandboxes again) is emptied and made anew, so no stale limit survives."""
    if directory.exists():
        Cgroup([directory], version).remove()
    directory.mkdir()


def _read_pids(procs: Path) -> list[int]:
    try:
        return [int(line) for line in procs.read_text().split()]
    except OSError:
        return []


def _settled(path: Path, wanted: str, deadline: float = 5.0) -> bool:
    """Wait (bounded) until ``path`` says ``wanted``: a freezer stops each process once it is
    scheduled, which on a loaded machine, under the cgroup's CPU bound, can take a while (a
    freezer that never settles is a caller's to fall back from)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        with contextlib.suppress(OSError):
            if wanted in path.read_text():
                return True
        time.sleep(0.002)
    raise OSError(f"{path} did not reach {wanted!r} within {deadline} s")


def _write(path: Path, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _filesystem_type(path: Path) -> str:
    with open("/proc/self/mounts") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) > 2 and fields[1] == str(path):
                return fields[2]
    return ""
