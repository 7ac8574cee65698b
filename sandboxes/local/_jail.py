"""The bubblewrap jail of a `LocalSandbox`: what it sees, who it runs as, what it may call.

Kept apart from `sandboxes.local` so that module holds the sandbox (execute, the exec helper,
lifecycle) and this one the isolation policy, which both ways of running commands share.

Who the jail's processes are on the host matters as much as who they are inside. bwrap maps
the uid inside (1000) to the uid that ran bwrap; run by root, that is uid 0, and every
root-only file a bind exposes is readable. So a root caller runs bwrap as an unprivileged host
uid (`Jail.host_ids`, ``nobody`` unless configured), through util-linux: ``unshare --mount``
gives the launch a private mount namespace in which the root directory (and every extra bind)
is bind-mounted on a path that uid can reach (bwrap resolves bind sources by path as the uid it runs as, and the
caller's root may sit below directories only root may enter, e.g. ``/root``), then ``setpriv``
drops to the uid with no groups and no capabilities, and bwrap starts. The mount vanishes with
the namespace. The root directory is chowned to that uid, so the jail can write there, and the
caller, being root, still reads and writes everything in it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandboxes.lifecycle import Mount
from sandboxes.local import _seccomp
from sandboxes.local._tree import remove_tree

__all__ = ["ETC_ALLOWED", "Jail", "SpawnSpec", "claim"]

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
ETC_ALLOWED = (
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "gai.conf",
    "host.conf",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "localtime",
    "magic",
    "magic.mime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "perl",
    "profile",
    "protocols",
    "python3*",
    "services",
    "shells",
    "ssl",
    "terminfo",
    "timezone",
)
"""The parts of the host's ``/etc`` a shell and the usual interpreters need; nothing with
secrets (shadow, ssh host keys, docker's key, the package manager's credentials) and nothing
naming the host's users: ``passwd``, ``group`` and ``hosts`` are written for the jail."""

NOBODY = 65534

_AS_JAIL_USER = r"""uid=$1 gid=$2 n=$3
shift 3
while [ "$n" -gt 0 ]; do mount --bind -- "$1" "$2" || exit 125; n=$((n - 1)); shift 2; done
n=$1
shift
while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; n=$((n - 1)); shift; done
exec setpriv --reuid="$uid" --regid="$gid" --clear-groups --inh-caps=-all --bounding-set=-all -- "$@"
"""
"""Run by root in a private mount namespace: ``uid gid N (source alias)*N M (cgroup.procs)*M
command...``. Each source (the root, the extra binds) appears at its alias, a path the jail uid
reaches; the shell joins the cgroups; the command (bwrap ...) runs as uid, gid."""


@dataclass(frozen=True, slots=True)
class SpawnSpec:
    """How to start one bwrap: its argv and what `subprocess.Popen` must do for it."""

    argv: list[str]
    pass_fds: tuple[int, ...]
    close_after_spawn: tuple[int, ...]
    """Descriptors made for this spawn only (the seccomp pipe): the parent closes them once
    the child has them."""


class Jail:
    """The per-sandbox host state of a jail: its private /tmp and /etc files.

    ``tmp_parent``: where the private /tmp is made when not in the state dir (a sandbox disk's,
    `sandboxes.local._disk`): a directory per jail, named as its state dir and removed with it,
    so two handles on one sandbox never share a /tmp, and one whose state is gone is removed."""

    def __init__(
        self,
        bwrap: str,
        root: Path,
        *,
        uid: int,
        gid: int,
        host_ids: tuple[int, int] | None,
        network: bool,
        seccomp: bool,
        extra_ro_binds: Sequence[Path],
        mounts: Sequence[Mount] = (),
        tmp_parent: Path | None = None,
    ) -> None:
        self.bwrap = bwrap
        self.root = root
        self.uid, self.gid = uid, gid
        self.network = network
        self.extra_ro_binds = tuple(extra_ro_binds)
        self.mounts = tuple(mounts)
        self.as_root = os.geteuid() == 0
        if self.as_root:
            self.host_ids = host_ids or (NOBODY, NOBODY)
        else:
            self.host_ids = (os.getuid(), os.getgid())
        self._seccomp = _seccomp.filter_program() if seccomp else None
        # Started by root, bwrap reaches the state as the jail uid: not under $TMPDIR, which may
        # be a root-only directory; /tmp is always open to every uid.
        self.state = Path(tempfile.mkdtemp(prefix=STATE_PREFIX, dir=state_parent(self.as_root)))
        os.chmod(self.state, 0o755)  # noqa: S103 - the jail uid passes through to tmp and etc, nothing secret here
        (self.state / OWNER_FILE).write_text(process_identity(os.getpid()) or "")
        self.tmp = self.state / "tmp" if tmp_parent is None else self._fresh_tmp(tmp_parent)
        self.tmp.mkdir(mode=0o700)
        self._write_etc()
        volumes = [Path(mount.volume) for mount in self.mounts]
        self._sources = {path: path for path in (self.root, *self.extra_ro_binds, *volumes)}
        """host path -> where bwrap finds it (started by root: an alias in the state dir)."""
        if tmp_parent is not None:  # the state dir's /tmp is open to the jail uid; this one may not be
            self._sources[self.tmp] = self.tmp
        if self.as_root:
            self._sources = {path: self._alias(index, path) for index, path in enumerate(self._sources)}
            os.chown(self.tmp, *self.host_ids)
            claim(self.root, self.host_ids)
        self.closed = False

    def close(self) -> None:
        self.closed = True
        shutil.rmtree(self.state, ignore_errors=True)
        if not self.tmp.is_relative_to(self.state):
            with contextlib.suppress(OSError):
                remove_tree(self.tmp)

    def _fresh_tmp(self, parent: Path) -> Path:
        """This jail's /tmp under ``parent``, the ones of jails whose state dir is gone removed."""
        with contextlib.suppress(OSError):
            for entry in parent.iterdir():
                if not (self.state.parent / entry.name).exists():
                    remove_tree(entry)
        return parent / self.state.name

    def _alias(self, index: int, source: Path) -> Path:
        """An empty directory or file in the state dir that ``source`` is mounted on at launch."""
        alias = self.state / f"bind-{index}"
        if source.is_dir():
            alias.mkdir()
        else:
            alias.touch()
        return alias

    def _write_etc(self) -> None:
        etc = self.state / "etc"
        etc.mkdir()
        home = str(self.root)
        (etc / "passwd").write_text(
            f"root:x:0:0:root:/root:/bin/sh\nsandbox:x:{self.uid}:{self.gid}:sandbox:{home}:/bin/sh\n"
            f"nobody:x:{NOBODY}:{NOBODY}:nobody:/nonexistent:/usr/sbin/nologin\n"
        )
        (etc / "group").write_text(f"root:x:0:\nsandbox:x:{self.gid}:\nnogroup:x:{NOBODY}:\n")
        (etc / "hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
        (etc / "hostname").write_text("sandbox\n")
        for name in os.listdir(etc):
            os.chmod(etc / name, 0o644)

    def spawn(
        self,
        command: Sequence[str],
        environment: Mapping[str, str],
        workdir: str,
        *,
        cgroups: Sequence[str] = (),
        ro_binds: Sequence[tuple[str, str]] = (),
    ) -> SpawnSpec:
        """bwrap running ``command`` in the jail; every fd it needs is open in the result.
        Started by root, the launch joins the ``cgroups`` (``cgroup.procs`` files) itself."""
        assert not self.closed, "jail closed"
        argv = [self.bwrap, "--die-with-parent", "--new-session", "--unshare-all", "--unshare-user"]
        argv += ["--disable-userns", "--assert-userns-disabled", "--hostname", "sandbox"]
        if self.network:
            argv.append("--share-net")
        argv += self._system_binds
        argv += ["--proc", "/proc", "--dev", "/dev", "--bind", str(self._sources.get(self.tmp, self.tmp)), "/tmp"]
        argv += ["--bind", str(self._sources[self.root]), str(self.root)]
        for extra in self.extra_ro_binds:  # after /tmp, so an extra under /tmp is not hidden by it
            argv += ["--ro-bind", str(self._sources[extra]), str(extra)]
        for source, target in ro_binds:
            argv += ["--ro-bind", source, target]
        for mount in self.mounts:  # last: nothing above hides a volume
            argv += ["--ro-bind" if mount.read_only else "--bind", str(self._sources[Path(mount.volume)]), mount.path]
        # bwrap's / is a tmpfs that vanishes with the jail: a write there would answer success
        # and be lost. Read-only, it answers permission_denied like any read-only system dir.
        argv += ["--remount-ro", "/"]
        argv += ["--uid", str(self.uid), "--gid", str(self.gid), "--chdir", workdir, "--cap-drop", "ALL"]
        pass_fds: list[int] = []
        fresh: list[int] = []
        if self._seccomp is not None:
            fd = _pipe_with(self._seccomp)
            argv += ["--seccomp", str(fd)]
            pass_fds.append(fd)
            fresh.append(fd)
        argv.append("--clearenv")
        for name, value in environment.items():
            argv += ["--setenv", name, value]
        argv += ["--", *command]
        if self.as_root:
            uid, gid = self.host_ids
            launch = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", _AS_JAIL_USER, "sh"]
            binds = [str(path) for pair in self._sources.items() for path in pair]
            joins = [str(len(cgroups)), *cgroups]
            argv = [*launch, str(uid), str(gid), str(len(self._sources)), *binds, *joins, *argv]
        return SpawnSpec(argv, tuple(pass_fds), tuple(fresh))

    @functools.cached_property
    def _system_binds(self) -> list[str]:
        """What of the host's system the jail sees, read once per sandbox and reused by every
        spawn of its jail."""
        argv: list[str] = []
        for directory in SYSTEM_DIRS:
            path = Path(directory)
            if path.is_symlink():
                argv += ["--symlink", os.readlink(path), directory]
            elif path.is_dir():
                argv += ["--ro-bind", directory, directory]
        argv += ["--dir", "/etc"]
        for name in sorted(os.listdir("/etc")):
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in ETC_ALLOWED):
                argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        if self.network and os.path.exists("/etc/resolv.conf"):
            argv += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
        for name in ("passwd", "group", "hosts", "hostname"):
            argv += ["--ro-bind", str(self.state / "etc" / name), f"/etc/{name}"]
        return argv


def claim(top: Path, ids: tuple[int, int]) -> None:
    """Give ``top`` and everything under it to ``ids`` (the jail's host uid), e.g. a root dir
    the caller filled as root, or files the service extracted there.

    Walks by directory descriptor and never follows a symlink: the tree may be the sandbox's
    own work, and a directory swapped for a link mid-walk must not redirect a chown."""
    uid, gid = ids
    os.chown(top, uid, gid, follow_symlinks=False)
    for _path, dirs, files, dir_fd in os.fwalk(top, follow_symlinks=False):
        for name in [*dirs, *files]:
            with contextlib.suppress(FileNotFoundError):
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if (info.st_uid, info.st_gid) != ids:
                    os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)


def _pipe_with(data: bytes) -> int:
    """A pipe's read end already holding ``data`` (small: it must fit the pipe's buffer)."""
    read, write = os.pipe()
    try:
        os.write(write, data)
    finally:
        os.close(write)
    return read


STATE_PREFIX = "sandboxes-local-"
OWNER_FILE = "owner"
"""In a state dir: which process made it (pid and start time), so another can tell it was left
behind by one killed without closing its sandboxes (kill -9, a crash) and remove it."""


def state_parent(as_root: bool) -> str | None:
    return "/tmp" if as_root else None


def process_identity(pid: int) -> str | None:
    """``pid:start-time``: a pid alone may be reused by an unrelated process after the owner died."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return f"{pid}:{fields[19].decode()}" if len(fields) > 19 else None


def stale_states(as_root: bool) -> list[Path]:
    """The state dirs of this host's jails whose owning process is gone (this user's, in the
    directory this process's jails use)."""
    parent = Path(state_parent(as_root) or tempfile.gettempdir())
    stale = []
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            if not entry.name.startswith(STATE_PREFIX) or entry.is_symlink() or not entry.is_dir():
                continue
            try:
                if entry.stat().st_uid != os.geteuid():
                    continue
                owner = (entry / OWNER_FILE).read_text().strip()
            except OSError:
                continue  # being made right now, or not one of ours
            pid, _, _ = owner.partition(":")
            if owner and pid.isdigit() and process_identity(int(pid)) != owner:
                stale.append(entry)
    return stale
