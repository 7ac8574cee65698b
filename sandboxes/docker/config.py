"""`DockerSandboxConfig`: what a Docker sandbox is made from, and the labels that record it.

Kept apart from the sandbox and the provider, which both need it (the provider creates
containers from it; the sandbox reads its limits), so neither imports the other for it."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sandboxes._output import DEFAULT_OUTPUT_LIMIT
from sandboxes.lifecycle import Mount

__all__ = [
    "LABEL_EXPIRES",
    "LABEL_MANAGED",
    "LABEL_OWNER",
    "LABEL_SANDBOX",
    "DockerSandboxConfig",
    "parse_size",
]

LABEL_MANAGED = "io.sandboxes.managed"
LABEL_OWNER = "io.sandboxes.owner"
LABEL_EXPIRES = "io.sandboxes.expires-at"
LABEL_SANDBOX = "io.sandboxes.sandbox-id"

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)\s*$", re.IGNORECASE)


def parse_size(value: str) -> int:
    """Bytes in a Docker-style size (``512m``, ``1g``, ``1048576``); ValueError otherwise."""
    match = _SIZE.match(value)
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"not a size: {value!r} (e.g. 512m, 1g)")
    number, unit = match.groups()
    return int(float(number) * (1 << (10 * "bkmgt".index(unit.lower() or "b"))))


class DockerSandboxConfig(BaseModel):
    """A sandbox template. The defaults are the secure ones; loosen them deliberately."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str = "sandboxes/runtime:latest"
    cpus: float = Field(default=1.0, gt=0)
    memory: str = "512m"
    pids: int = Field(default=256, gt=0)
    tmp_size: str = "256m"
    disk: str | None = "1g"
    """Size of the workspace (``workdir``): a tmpfs volume, so writes past it fail with
    ``no_space`` and never reach the engine's disk. Its files live in RAM: the container's memory
    cgroup is ``memory + disk``, and the workspace does not survive the container stopping (see
    `sandboxes.docker.provider`). ``None``: a volume on the engine's disk, persistent, unbounded."""
    disk_files: int = Field(default=100_000, gt=0)
    """Files and directories the workspace may hold (the tmpfs's inodes) when ``disk`` is set."""
    log_size: str = "1m"
    """The container's log (what its init writes, which a command can reach through
    ``/proc/1/fd/1``) is capped at this size, one file, on the engine's disk."""
    workdir: str = "/workspace"
    user: str = "1000:1000"
    env: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    ttl: float | None = Field(default=3600.0, gt=0)
    """Seconds until the sandbox may be reaped by a sweep; ``None``: never."""
    owner: str = "sandboxes"
    """Label value identifying who created the sandbox, so sweeps only reap their own."""
    network: bool = False
    read_only_root: bool = True
    default_timeout: float = Field(default=120.0, ge=0)
    output_limit: int = Field(default=DEFAULT_OUTPUT_LIMIT, gt=0)
    use_exec_helper: bool = True
    mounts: tuple[Mount, ...] = ()
    """Named volumes (`sandboxes.docker._volumes`) mounted in the container."""

    @field_validator("memory", "tmp_size", "disk", "log_size")
    @classmethod
    def _size_parses(cls, value: str | None) -> str | None:
        if value is not None:
            parse_size(value)
        return value

    @property
    def uid_gid(self) -> tuple[int, int]:
        uid, _, gid = self.user.partition(":")
        return int(uid), int(gid or uid)
