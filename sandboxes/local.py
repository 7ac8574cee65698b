"""`LocalSandbox`: a sandbox on this machine, for machines without Docker.

Each ``execute`` runs ``sh -c`` under bubblewrap when ``bwrap`` is installed: fresh user, pid,
network, IPC and UTS namespaces (no network at all), uid 1000, no capabilities, the system
directories read-only, and only the sandbox's root directory plus a private ``/tmp`` writable.
The root directory appears at the same absolute path inside and outside, so paths mean the same
thing to the file operations, to commands, and to the caller.

Without bwrap the command runs as the calling user with no isolation: the sandbox says so with
a warning at creation and in `isolated`. That mode exists for development on laptops; never
give it untrusted code.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sandboxes import protocol as p
from sandboxes._output import DEFAULT_OUTPUT_LIMIT, execute_response
from sandboxes._process import run_process
from sandboxes.base import StreamingSandbox
from sandboxes.paths import is_within, relative_to
from sandboxes.semantics import message_for

logger = logging.getLogger(__name__)

_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc")
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"


class NotIsolatedWarning(UserWarning):
    """Commands of this sandbox run with the caller's full privileges."""


class LocalSandboxConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    root_dir: Path
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
    """More host paths visible read-only inside (at the same path), e.g. an interpreter."""
    sandbox_id: str | None = None


class LocalSandbox(StreamingSandbox):
    def __init__(self, root_dir: str | Path | None = None, config: LocalSandboxConfig | None = None) -> None:
        if config is None:
            if root_dir is None:
                raise ValueError("LocalSandbox needs a root_dir or a config")
            config = LocalSandboxConfig(root_dir=Path(root_dir))
        self.config = config
        self.root = config.root_dir.resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._id = config.sandbox_id or f"local-{uuid.uuid4().hex[:12]}"
        self._bwrap = self._find_bwrap()
        self._tmp = Path(tempfile.mkdtemp(prefix="sandboxes-tmp-")) if self._bwrap else None
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

    @property
    def id(self) -> str:
        return self._id

    @property
    def isolated(self) -> bool:
        return self._bwrap is not None

    def close(self) -> None:
        """Remove the private /tmp; the root directory belongs to the caller and stays."""
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> LocalSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ execute

    def execute_streaming(
        self,
        command: str,
        on_output: Callable[[bytes], None] | None,
        *,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int | None = None,
    ) -> p.ExecuteResponse:
        workdir = cwd or str(self.root)
        environment = {
            "PATH": _DEFAULT_PATH,
            "HOME": str(self.root),
            "LANG": "C.UTF-8",
            **self.config.env,
            **(env or {}),
        }
        if not self._host_view(workdir).is_dir():
            return p.ExecuteResponse(
                "", error=p.FILE_NOT_FOUND, message=message_for(p.FILE_NOT_FOUND, workdir, "no such cwd")
            )
        marker = ("SANDBOXES_EXEC_ID", uuid.uuid4().hex)
        if self._bwrap is None:
            argv = ["/bin/sh", "-c", command]
            environment[marker[0]] = marker[1]
            process_env = environment
            process_cwd: str | None = workdir
        else:
            argv = [*self._bwrap_argv(environment, workdir), "/bin/sh", "-c", command]
            process_env = {"PATH": _DEFAULT_PATH, marker[0]: marker[1]}
            process_cwd = None
        result = run_process(
            argv,
            env=process_env,
            cwd=process_cwd,
            stdin=stdin.encode("utf-8") if isinstance(stdin, str) else stdin,
            timeout=self.config.default_timeout if timeout is None else timeout,
            output_limit=self.config.output_limit if output_limit is None else output_limit,
            marker=marker,
            on_output=on_output,
        )
        return execute_response(
            result.output,
            result.exit_code,
            timed_out=result.timed_out,
            timeout=self.config.default_timeout if timeout is None else timeout,
            duration_ms=result.duration_ms,
        )

    def _host_view(self, path: str) -> Path:
        """Where a path inside the sandbox lives on the host (the private /tmp is elsewhere)."""
        if self._tmp is not None and is_within(path, "/tmp") and not is_within(path, str(self.root)):
            return self._tmp / relative_to(path, "/tmp") if path != "/tmp" else self._tmp
        return Path(path)

    def _bwrap_argv(self, environment: Mapping[str, str], workdir: str) -> list[str]:
        assert self._bwrap is not None
        assert self._tmp is not None
        argv = [self._bwrap, "--die-with-parent", "--new-session", "--unshare-all"]
        if self.config.network:
            argv.append("--share-net")
        for directory in _SYSTEM_DIRS:
            path = Path(directory)
            if path.is_symlink():
                argv += ["--symlink", os.readlink(path), directory]
            elif path.is_dir():
                argv += ["--ro-bind", directory, directory]
        for extra in self.config.extra_ro_binds:
            argv += ["--ro-bind", str(extra), str(extra)]
        argv += ["--proc", "/proc", "--dev", "/dev", "--bind", str(self._tmp), "/tmp"]
        argv += ["--bind", str(self.root), str(self.root)]
        # bwrap's / is a tmpfs that vanishes with the jail: a write there would answer success
        # and be lost. Read-only, it answers permission_denied like any read-only system dir.
        argv += ["--remount-ro", "/"]
        argv += ["--uid", str(self.config.uid), "--gid", str(self.config.gid), "--chdir", workdir]
        argv.append("--clearenv")
        for name, value in environment.items():
            argv += ["--setenv", name, value]
        return argv
