"""`LocalSandbox`: a sandbox on this machine, for machines without Docker.

Commands run ``sh -c`` under bubblewrap when ``bwrap`` is installed, started by the exec helper
in one long-lived jail per sandbox (`sandboxes.local._helper`; one jail per command when the
helper cannot run). The jail has fresh user, pid, network, IPC and UTS namespaces (no network
at all), uid 1000, no capabilities, no nested user namespaces, a seccomp filter, the system
directories and a few files of ``/etc`` read-only, and only the sandbox's root directory plus a
private ``/tmp`` writable (`sandboxes.local._jail`), under memory, CPU, process and disk limits
(`sandboxes.local._limits`, `sandboxes.local._disk`). Started by root, the jail runs as an
unprivileged host uid, never as root. The root directory appears at the same absolute path
inside and outside, so paths mean the same thing to the file operations, to commands, and to
the caller.

Without bwrap the command runs as the calling user with no isolation: the sandbox says so with
a warning at creation and in `isolated`. That mode exists for development on laptops; never
give it untrusted code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from sandboxes import protocol as p
from sandboxes._helper._kill import MARKER_ENV
from sandboxes._mux import (
    Command,
    DrivenSandbox,
    GivenDefaults,
    HelperDriver,
    MuxBroken,
    MuxClient,
    SpooledOutput,
    TransportWords,
    has_python_sh,
    python_missing,
)
from sandboxes._output import DEFAULT_OUTPUT_LIMIT, OutputHook, execute_response
from sandboxes.base import Operation
from sandboxes.lifecycle import Mount, Sandbox
from sandboxes.local import _disk
from sandboxes.local._freezer import freeze_jail, kill_jail, thaw_jail
from sandboxes.local._helper import HELPER_COMMAND, HelperProcess
from sandboxes.local._jail import Jail, claim, stale_states
from sandboxes.local._limits import Cgroup, UsageCount, disk_usage, launch_limits, tasks_of
from sandboxes.local._process import run_process
from sandboxes.local._tree import remove_tree
from sandboxes.paths import InvalidPathError, is_within, normalize_path, relative_to
from sandboxes.protocol import NotIsolatedWarning as NotIsolatedWarning  # re-exported: its old home
from sandboxes.semantics import message_for

logger = logging.getLogger(__name__)

_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"

_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandboxes-jail-spawner")
"""The one thread that starts long-lived jails. bwrap's ``--die-with-parent`` is
PR_SET_PDEATHSIG, which the kernel fires when the THREAD that forked the jail exits, not the
process: a jail started by whichever pool worker needed it first (an agent's tool call) died
with that worker, and the next command with it. This thread lives as long as the interpreter."""


class LocalSandboxTemplate(BaseModel):
    """Everything a local sandbox is made from except its directory and id: what
    `LocalProviderConfig` applies to every sandbox it makes (it extends this class)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    isolation: Literal["auto", "bwrap", "none"] = "auto"
    """``auto``: bwrap when installed, else none (with a warning). ``bwrap``: fail without it."""
    network: bool = False
    uid: int = 1000
    gid: int = 1000
    default_timeout: float = Field(default=120.0, ge=0)
    """Seconds before a command's process tree is killed; 0 means never."""
    output_limit: int = Field(default=DEFAULT_OUTPUT_LIMIT, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    extra_ro_binds: tuple[Path, ...] = ()
    """More host paths visible read-only inside (at the same path), e.g. an interpreter. Started
    by root, what is in them is read as ``host_uid``: a root-only file there stays closed."""
    host_uid: int | None = Field(default=None, gt=0)
    """Started by root: the unprivileged host uid the jail runs as (and that owns the root
    directory's files on the host). ``None``: 65534 (nobody). Ignored when not root: the jail
    then runs as the caller. Never 0: uid 1000 inside would be root outside."""
    host_gid: int | None = Field(default=None, gt=0)
    seccomp: bool = True
    """Load the deny-list seccomp filter (`sandboxes.local._seccomp`) into every jail."""
    memory: int = Field(default=512 << 20, gt=0)
    """Bytes of memory (no swap) for everything the sandbox runs at once; past it the kernel
    kills a process and the command answers ``out_of_memory``."""
    cpus: float = Field(default=1.0, gt=0)
    """CPU bandwidth (cgroups only)."""
    pids: int = Field(default=256, gt=0)
    """Processes and threads at once; a fork bomb stops here."""
    use_exec_helper: bool = True
    """Run commands through one long-lived jail with the exec helper in it (`sandboxes.local._helper`)
    rather than one bwrap per command. Falls back to the latter when the helper cannot start."""
    helper_python: str = "python3"
    """The interpreter that runs the helper inside the jail (the host's own, seen read-only)."""
    disk: int = Field(default=4 << 30, gt=0)
    """Bytes the root directory and the private /tmp may hold. File operations that would pass
    it answer ``no_space``. Commands: started by root in a root directory the sandbox made, an
    image of this size holds both, so writes past it fail with ``No space left on device``
    (`sandboxes.local._disk`); elsewhere a command cannot write a file larger than it
    (``RLIMIT_FSIZE``), and once the sandbox holds more, file operations answer ``no_space``
    (what commands wrote counted at most a second late, `sandboxes.local._limits.UsageCount`)."""


class LocalSandboxConfig(LocalSandboxTemplate):
    root_dir: Path
    sandbox_id: str | None = None
    mounts: tuple[Mount, ...] = ()
    """Host directories (`Mount.volume`: a path the caller made, never one a sandbox could
    have replaced with a link) bound into the jail at `Mount.path`."""


class LocalSandbox(DrivenSandbox, Sandbox):
    """A sandbox whose files are ``root_dir`` on this host; its commands and file ops go through
    the exec helper it holds (`helper_driver`), to which it is the `sandboxes._mux.HelperTransport`
    (its helper: the long-lived jail's; a command alone: a jail of its own).

    ``LocalSandbox(root_dir)`` attaches to a directory the caller owns: ``with`` only closes
    (stops the jail); `destroy` removes the directory. `LocalSandbox.create` (and
    `sandboxes.local.provider.LocalProvider`) make one the caller owns: ``with`` destroys it."""

    _frozen = False

    def __init__(
        self, root_dir: str | Path | None = None, config: LocalSandboxConfig | None = None, *, owned: bool = False
    ) -> None:
        if config is None:
            if root_dir is None:
                raise ValueError("LocalSandbox needs a root_dir or a config")
            config = LocalSandboxConfig(root_dir=Path(root_dir))
        self.owned = owned
        self._owner: _disk.Owner | None = None
        self.config = config
        self.root = config.root_dir.resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._id = config.sandbox_id or f"local-{uuid.uuid4().hex[:12]}"
        self._bwrap = self._find_bwrap()
        self._disk = self._open_disk() if self._bwrap else None
        self._usage = UsageCount(self._walk_usage)
        self._jail = self._make_jail(self._bwrap) if self._bwrap else None
        self._cgroup = None
        if self._jail is not None:
            self._cgroup = Cgroup.create(self._id, memory=config.memory, cpus=config.cpus, pids=config.pids)
            if self._cgroup is not None:
                (self._jail.state / CGROUP_FILE).write_text(self._id)
        self._started: HelperProcess | None = None
        self._oom_seen = 0
        defaults = GivenDefaults(config.default_timeout, config.output_limit, self._helper_env(), str(self.root))
        self.helper_driver = HelperDriver(
            self,
            self._words(),
            defaults,
            enabled=self._jail is not None and config.use_exec_helper,
            start_failures=(MuxBroken, OSError),
            refuse=self._refused,
        )
        if self._bwrap is None:
            warnings.warn(
                f"LocalSandbox {self._id} is NOT isolated (bubblewrap not found): commands run as "
                f"{os.getuid()} with full access to this machine. Install bubblewrap.",
                NotIsolatedWarning,
                stacklevel=2,
            )

    def _find_bwrap(self) -> str | None:
        if self.config.isolation == "none":
            return None
        found = shutil.which("bwrap")
        if found is None and self.config.isolation == "bwrap":
            raise RuntimeError("isolation='bwrap' but bubblewrap (bwrap) is not installed")
        return found

    def _open_disk(self) -> _disk.Disk | None:
        """The sandbox's image (`sandboxes.local._disk`): made for a root directory it owns
        (empty, just made), found again for one it made earlier; ``None``: the per-file bound."""
        found = _disk.Disk.existing(self.root) if _disk.available() is None else None
        if found is not None or not self.owned:
            return found
        reason = _disk.available()
        if reason is None and any(self.root.iterdir()):
            reason = f"{self.root} is not empty"
        if reason is None:
            try:
                return _disk.Disk.create(self.root, self.config.disk)
            except OSError as exc:
                reason = str(exc)
        _disk.warn_fallback(reason)
        return None

    def _make_jail(self, bwrap: str) -> Jail:
        reap_leftovers()
        host_ids = None
        if self.config.host_uid is not None:
            host_ids = (self.config.host_uid, self.config.host_gid or self.config.host_uid)
        return Jail(
            bwrap,
            self.root,
            uid=self.config.uid,
            gid=self.config.gid,
            host_ids=host_ids,
            network=self.config.network,
            seccomp=self.config.seccomp,
            extra_ro_binds=self.config.extra_ro_binds,
            mounts=self.config.mounts,
            tmp_parent=self._disk.tmp if self._disk is not None else None,
        )

    @property
    def id(self) -> str:
        return self._id

    @property
    def ref(self) -> str:
        return str(self.root)

    @property
    def workdir(self) -> str:
        return str(self.root)

    @property
    def host_ids(self) -> tuple[int, int]:
        """Who the jail's processes and files are on the host (uid, gid)."""
        return self._jail.host_ids if self._jail is not None else (os.getuid(), os.getgid())

    @property
    def user_ids(self) -> tuple[int, int]:
        """Who the sandbox's files belong to inside it (uid, gid)."""
        return self.config.uid, self.config.gid

    def claim(self, path: str | Path) -> None:
        """Give files the caller put in the root as root (an extracted archive) to the jail's
        host uid, so commands can change them. A no-op unless the sandbox was started by root."""
        if self._jail is not None and self._jail.as_root and is_within(str(path), str(self.root)):
            claim(Path(path), self._jail.host_ids)

    @property
    def isolated(self) -> bool:
        return self._bwrap is not None

    def close(self) -> None:
        """Stop the jail and remove the private /tmp; the root directory belongs to the caller
        and stays."""
        if self._frozen:  # killed where it stopped, then let go: a frozen process dies only once thawed
            with self.helper_driver.lock:
                process = self._helper_process
                kill_jail(self._cgroup, None if process is None else process.process.pid)
            self.thaw()
        self.helper_driver.close()  # closing its client kills the jail (`HelperProcess.close`)
        if self._jail is not None:
            self._jail.close()
        if self._cgroup is not None:
            self._cgroup.remove()
            self._cgroup = None

    def freeze(self) -> None:
        """Stop the jail's every process, its exec helper's included (`freeze_jail`)."""
        with self.helper_driver.lock:
            process = self._helper_process
            self._frozen = True
            freeze_jail(self._cgroup, None if process is None else process.process.pid)

    def thaw(self) -> None:
        with self.helper_driver.lock:
            process = self._helper_process
            thaw_jail(self._cgroup, None if process is None else process.process.pid)
            self._frozen = False

    @classmethod
    def create(cls, config: LocalSandboxConfig | None = None) -> Self:
        """A new sandbox the caller owns (``with`` destroys it): in ``config.root_dir``, which
        must not exist yet, or in a fresh temporary directory."""
        if config is not None:
            config.root_dir.mkdir(mode=0o755, parents=True)
            return cls(config=config, owned=True)
        temp = Path(tempfile.gettempdir())
        reclaim_left_behind(temp)
        root = Path(tempfile.mkdtemp(prefix=_disk.TEMP_PREFIX, dir=temp))
        owner = _disk.Owner(root)  # before its image: an image whose lock is free was left behind
        try:
            sandbox = cls(config=LocalSandboxConfig(root_dir=root), owned=True)
        except BaseException:
            with contextlib.suppress(OSError):
                _disk.release(root)
            remove_tree(root)
            owner.release()
            raise
        sandbox._owner = owner
        return sandbox

    def destroy(self) -> None:
        """Close, then remove the root directory and everything in it, its image first (idempotent)."""
        self.close()
        _disk.release(self.root)
        remove_tree(self.root)
        if self._owner is not None:
            self._owner.release()

    # ------------------------------------------------------------------ its transport

    def _words(self) -> TransportWords:
        return TransportWords(
            logger,
            subject=self._id,
            fallback="one jail per command",
            restart="restarting it",
            command_lost="the sandbox's jail died during the command",
            file_op_lost="the sandbox's jail died during the file operation",
        )

    def _refused(self, command: Command) -> p.ExecuteResponse | None:
        """`sandboxes._mux.Refusal`: ``unavailable`` once closed; ``file_not_found`` for a
        working directory that is not there."""
        if self._jail is not None and self._jail.closed:
            return p.ExecuteResponse("", error=p.UNAVAILABLE, message=f"sandbox {self._id} is closed")
        if not self._host_view(command.workdir).is_dir():
            return p.ExecuteResponse(
                "", error=p.FILE_NOT_FOUND, message=message_for(p.FILE_NOT_FOUND, command.workdir, "no such cwd")
            )
        return None

    @property
    def memory_limit(self) -> str:
        """`sandboxes._mux.HelperTransport`: the config's, for everything the sandbox runs."""
        return f"{self.config.memory} bytes"

    def oom_killed(self) -> bool:
        """`sandboxes._mux.HelperTransport`: whether the sandbox's cgroup counted an out-of-memory
        kill since the last look (none without a cgroup)."""
        if self._cgroup is None:
            return False
        count = self._cgroup.oom_kills()
        previous, self._oom_seen = self._oom_seen, count
        return count > previous

    def start_helper(self) -> MuxClient | None:
        """`sandboxes._mux.HelperTransport`: a long-lived jail with the helper in it, started on
        the spawner thread (`_SPAWNER`); ``None`` once closed."""
        if self._jail is None or self._jail.closed:
            return None
        process = _SPAWNER.submit(self._start_jail).result()
        self._started = process
        return process.client

    @property
    def _helper_process(self) -> HelperProcess | None:
        """The jail whose helper the driver holds now, alive or not; ``None``: none."""
        process, mux = self._started, self.helper_driver.mux
        return process if process is not None and mux is not None and process.client is mux else None

    def open_output_stream(self, command: str) -> SpooledOutput:
        """``command`` (``sh``) run in the jail by its exec helper as the sandbox's user, its
        stdout read as it comes, spooled at most the sandbox's disk bound ahead of its reader
        (`sandboxes._mux.SpooledOutput`): the service's archives of what the root directory does
        not hold (the jail's ``/proc``, ``/sys``, ``/tmp``), made as a container's are.
        `MuxBroken` if the sandbox runs no exec helper."""
        mux = self.exec_helper()
        if mux is None:
            raise MuxBroken("the sandbox runs no exec helper", may_resend=True)
        return SpooledOutput(mux, command, limit=self.config.disk, timeout=_STREAM_TIMEOUT)

    def python_missing(self) -> bool:
        """`sandboxes._mux.HelperTransport`: whether a jail of its own says the helper's python is
        not there: the jail sees only the system's directories, so a python elsewhere on this
        machine (a virtualenv's, say) is missing in it; a question that failed cannot tell."""
        try:
            probe = has_python_sh(self.config.helper_python)
            answer = self.run_alone(Command(probe, 10, 4096, env=self._helper_env(), cwd=str(self.root)), None)
        except Exception:
            return False
        return python_missing(answer.output)

    def answer(self, error: Exception) -> p.ExecuteResponse | None:
        """`sandboxes._mux.HelperTransport`: nothing of its own to answer (a jail that did not
        start is one of the driver's ``start_failures``)."""
        return None

    def run_alone(self, run: Command, on_output: OutputHook | None) -> p.ExecuteResponse:
        """`sandboxes._mux.HelperTransport`: one process (one bwrap, when isolated) for this
        command alone."""
        command, timeout, stdin, workdir, limit = run.command, run.timeout, run.stdin, run.workdir, run.output_limit
        environment = dict(run.env)
        marker = (MARKER_ENV, environment.get(MARKER_ENV) or uuid.uuid4().hex)  # the caller's own, if given
        pass_fds: tuple[int, ...] = ()
        fresh: tuple[int, ...] = ()
        if self._jail is None:
            argv = ["/bin/sh", "-c", command]
            environment[marker[0]] = marker[1]
            process_env = environment
            process_cwd: str | None = workdir
        else:
            cgroups = self._cgroup.procs_files if self._cgroup is not None and self._jail.as_root else []
            spec = self._jail.spawn(["/bin/sh", "-c", command], environment, workdir, cgroups=cgroups)
            argv, pass_fds, fresh = spec.argv, spec.pass_fds, spec.close_after_spawn
            process_env = {"PATH": _DEFAULT_PATH, marker[0]: marker[1]}
            process_cwd = None
        try:
            result = run_process(
                argv,
                env=process_env,
                cwd=process_cwd,
                stdin=stdin,
                timeout=timeout,
                output_limit=limit,
                marker=marker,
                on_output=on_output,
                pass_fds=pass_fds,
                preexec_fn=self._launch_limits() if self._jail is not None else None,
            )
        finally:
            for fd in fresh:
                os.close(fd)
        return execute_response(
            result.output,
            result.exit_code,
            timed_out=result.timed_out,
            timeout=timeout,
            duration_ms=result.duration_ms,
        )

    def _helper_env(self) -> dict[str, str]:
        """The environment the jail's helper starts with, and its python is looked for in."""
        return {"PATH": _DEFAULT_PATH, "HOME": str(self.root), "LANG": "C.UTF-8", **self.config.env}

    def _start_jail(self) -> HelperProcess:
        assert self._jail is not None
        environment = self._helper_env()
        cgroup = self._cgroup
        spec = self._jail.spawn(
            [self.config.helper_python, *HELPER_COMMAND[1:], "--reap-init"],  # the jail's init has no other child
            environment,
            str(self.root),
            cgroups=cgroup.procs_files if cgroup is not None and self._jail.as_root else [],
            ro_binds=[cgroup.pids_view] if cgroup is not None else [],
        )
        try:
            return HelperProcess(
                spec.argv, env={"PATH": _DEFAULT_PATH}, pass_fds=spec.pass_fds, preexec_fn=self._launch_limits()
            )
        finally:
            for fd in spec.close_after_spawn:
                os.close(fd)

    def _launch_limits(self) -> Callable[[], None]:
        """rlimits (and, not started by root, joining the cgroup) for a jail's launch process;
        without a cgroup, rlimits stand in for the memory and process limits."""
        cgroup = self._cgroup
        assert self._jail is not None
        join = cgroup.procs_files if cgroup is not None and not self._jail.as_root else []
        return launch_limits(
            file_size=self.config.disk,
            memory=None if cgroup is not None else self.config.memory,
            # RLIMIT_NPROC counts every task of the host uid, the caller's own (not root) or
            # other jails' (root) included: the sandbox may add `pids` to what runs already.
            pids=None if cgroup is not None else self.config.pids + tasks_of(self._jail.host_ids[0]),
            join=join,
        )

    # ------------------------------------------------------------------ disk bound

    def _write(self, file_path: str, content: str) -> Operation[p.WriteResult]:
        if self._over_disk_bound([(file_path, len(content.encode("utf-8")))]) == [True]:
            return p.WriteResult(p.NO_SPACE, message_for(p.NO_SPACE, file_path, self._disk_note()))
        return (yield from super()._write(file_path, content))

    def _upload(self, files: list[tuple[str, bytes]]) -> Operation[list[p.FileUploadResponse]]:
        refused = self._over_disk_bound([(path, len(content)) for path, content in files])
        if not any(refused):
            return (yield from super()._upload(files))
        accepted = [item for item, over in zip(files, refused, strict=True) if not over]
        done = iter((yield from super()._upload(accepted)) if accepted else [])
        note = self._disk_note()
        return [
            p.FileUploadResponse(path, p.NO_SPACE, message_for(p.NO_SPACE, path, note)) if over else next(done)
            for (path, _), over in zip(files, refused, strict=True)
        ]

    def _over_disk_bound(self, sizes: list[tuple[str, int]]) -> list[bool]:
        """For each (path, size) in order, whether writing it would take the sandbox past its
        disk bound (a file it replaces frees its own size). A sandbox on its own image is bounded
        by its filesystem (a write past it fails with ``ENOSPC``, answered `p.NO_SPACE`); any
        other counts what it holds with `UsageCount` (a walk of its trees at most once a second)."""
        if self._jail is None or self._disk is not None:
            return [False] * len(sizes)
        used = start = self._usage.used()
        over = []
        for raw, size in sizes:
            try:
                path = normalize_path(raw)
            except InvalidPathError:  # refused by the operation itself
                over.append(False)
                continue
            with contextlib.suppress(OSError):
                size -= self._host_view(path).lstat().st_size
            fits = used + max(size, 0) <= self.config.disk
            used += max(size, 0) if fits else 0
            over.append(not fits)
        self._usage.add(used - start)
        return over

    def _walk_usage(self) -> int:
        assert self._jail is not None
        return disk_usage(self.root, self._jail.tmp)

    def _disk_note(self) -> str:
        return f"the sandbox may hold {self.config.disk} bytes (root directory and /tmp)"

    def _host_view(self, path: str) -> Path:
        """Where a path inside the sandbox lives on the host (the private /tmp is elsewhere)."""
        if self._jail is not None and is_within(path, "/tmp") and not is_within(path, str(self.root)):
            tmp = self._jail.tmp
            return tmp / relative_to(path, "/tmp") if path != "/tmp" else tmp
        return Path(path)


_STREAM_TIMEOUT = 3600.0
"""Seconds a command whose output is streamed (`LocalSandbox.open_output_stream`) may run."""

CGROUP_FILE = "cgroup"
"""In a jail's state dir: the name of the sandbox's cgroup, removed with it if its owner died."""

_reaped = threading.Event()


def reclaim_left_behind(top: Path) -> None:
    """Release the images of the temporary sandboxes under ``top`` (`LocalSandbox.create`
    without a config) whose process died without destroying them (`_disk.reclaim_orphans`),
    where images are made at all: at each such create, and at each `LocalProvider`'s start."""
    if _disk.available() is None:
        _disk.reclaim_orphans(top)


def reap_leftovers() -> None:
    """Remove what sandboxes of processes killed without closing them left behind: their state
    dirs (private ``/tmp``, ``/etc`` files) and their cgroups. Once per process, at its first jail.
    A sandbox's root directory is its caller's and is never touched here."""
    if _reaped.is_set():
        return
    _reaped.set()
    for state in stale_states(os.geteuid() == 0):
        with contextlib.suppress(OSError):
            name = (state / CGROUP_FILE).read_text().strip()
            cgroup = Cgroup.existing(name) if name and "/" not in name and name not in (".", "..") else None
            if cgroup is not None:
                cgroup.remove()
        shutil.rmtree(state, ignore_errors=True)
        logger.info("removed %s, left by a process that did not close its sandbox", state)
