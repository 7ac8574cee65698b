"""`LocalProvider`: local sandboxes as root directories under one base directory.

Layout of ``base_dir`` (mode 700, so no jail's uid can enter it):

* ``<id>/``: a sandbox's root directory, the only tree its commands may write;
* ``<id>.sandbox-disk`` and ``<id>.sandbox-disk.d/``: the image holding the root's files, and
  where it is mounted, when started by root (`sandboxes.local._disk`);
* ``<id>.json``: its record (`CreateOptions` labels and environment, creation time, expiry),
  beside the root, not inside it: a sandbox cannot read or forge its own record, let alone
  another's.

A sandbox is made root first, record second (replaced atomically), and removed root first,
record second. So a crash leaves either a root without a record (listed with no labels; the
caller decides, e.g. the service reaps it as an orphan) or a record without a root (a removal
cut short: `LocalProvider.sweep` finishes it); a record never describes a root half made.
Refs are root directories (their paths); `attach` also takes the bare id.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from pydantic import Field

from sandboxes.lifecycle import CreateOptions, Mount, SandboxRecord, SandboxStartError, Sweep, VolumeInUse
from sandboxes.local._disk import release
from sandboxes.local._jail import NOBODY
from sandboxes.local._tree import remove_tree
from sandboxes.local.sandbox import LocalSandbox, LocalSandboxConfig, LocalSandboxTemplate, reclaim_left_behind

__all__ = ["LocalProvider", "LocalProviderConfig"]

logger = logging.getLogger(__name__)

_ID = re.compile(r"^[0-9a-f]{16}$")


class LocalProviderConfig(LocalSandboxTemplate):
    """Where sandboxes live, and (every `LocalSandboxTemplate` field) what they are made from."""

    base_dir: Path
    ttl: float | None = Field(default=None, gt=0)
    """Seconds until a `LocalProvider.sweep` may remove a sandbox; ``None``: never."""


class LocalProvider:
    """Creates `LocalSandbox` instances under ``base_dir``; a `sandboxes.lifecycle.Provider`.

    ``LocalProvider(config)`` or ``LocalProvider("/var/lib/sandboxes", memory=...)``. A
    `sandboxes.lifecycle.HolderBoundProvider`: a jail ends with its handle, or its holder."""

    processes_end_with_holder = True

    def __init__(self, config: LocalProviderConfig | str | Path, **options: Any) -> None:
        if not isinstance(config, LocalProviderConfig):
            config = LocalProviderConfig(base_dir=Path(config), **options)
        elif options:
            config = config.model_copy(update=options)
        self.config = config
        self.base = config.base_dir.resolve()
        self.base.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base, 0o700)
        reclaim_left_behind(Path(tempfile.gettempdir()))

    # ------------------------------------------------------------------ creating

    def create(self, options: CreateOptions | None = None) -> LocalSandbox:
        """A new sandbox, owned by the caller (``with`` destroys it, record included)."""
        options = options or CreateOptions()
        sandbox_id = uuid.uuid4().hex[:16]
        now = time.time()
        ttl = options.ttl if options.ttl is not None else self.config.ttl
        for mount in options.mounts:
            self._volume_path(mount.volume)  # ours, or LookupError
        if options.mounts and self.config.isolation != "bwrap":
            raise SandboxStartError("volumes need a jail", reason="volumes are mounted only into a bubblewrap jail")
        sandbox = _ProvidedSandbox.create(self._config(sandbox_id, options.env, options.mounts))
        sandbox.provider = self
        try:
            self._write_record(
                sandbox_id,
                {
                    "labels": options.labels,
                    "env": options.env,
                    "mounts": [mount.model_dump() for mount in options.mounts],
                    "created_at": now,
                    "expires_at": None if ttl is None else now + ttl,
                },
            )
        except BaseException:
            sandbox.destroy()
            raise
        return sandbox

    def attach(self, ref: str) -> LocalSandbox:
        """A handle on sandbox ``ref`` (its root directory or its id); ``with`` only closes it.
        `LookupError` if there is none."""
        sandbox_id = self._id_of(ref)
        root = self.base / sandbox_id
        if not root.is_dir() or root.is_symlink():
            raise LookupError(f"no local sandbox {ref!r} under {self.base}")
        record = self._read_record(sandbox_id)
        env = record.get("env")
        sandbox = _ProvidedSandbox(
            config=self._config(sandbox_id, env if isinstance(env, dict) else {}, _mounts(record.get("mounts")))
        )
        sandbox.provider = self
        return sandbox

    def list(self) -> list[SandboxRecord]:
        """Every root directory and every record under the base directory."""
        names = {entry.name for entry in self.base.iterdir() if _ID.match(entry.name) and entry.is_dir()}
        records = {entry.stem for entry in self.base.glob("*.json") if _ID.match(entry.stem)}
        return [self._record(name, name in names) for name in sorted(names | records)]

    def destroy(self, ref: str) -> None:
        """Remove the root directory (its image first), then its record; gone already is fine."""
        sandbox_id = self._id_of(ref)
        release(self.base / sandbox_id)
        remove_tree(self.base / sandbox_id)
        with contextlib.suppress(FileNotFoundError):
            (self.base / f"{sandbox_id}.json").unlink()

    def sweep(self, now: float | None = None) -> Sweep:
        """Remove the sandboxes whose expiry passed and the records whose root is gone."""
        now = time.time() if now is None else now
        report = Sweep()
        for record in self.list():
            expired = record.expires_at is not None and record.expires_at < now
            if record.running and not expired:  # not running: a record whose root is gone
                continue
            try:
                self.destroy(record.ref)
            except OSError as exc:
                report.errors.append(f"{record.ref}: {exc}")
            else:
                report.removed.append(record.ref)
        return report

    # ------------------------------------------------------------------ volumes

    @property
    def _volumes(self) -> Path:
        return self.base / ".volumes"

    def create_volume(self, name: str, labels: Mapping[str, str], size: int) -> str:
        """`sandboxes.lifecycle.VolumeProvider`: ``<base>/.volumes/<name>``, made here (never
        through a path a sandbox could change), owned by the jails' host uid."""
        if not _VOLUME.match(name):
            raise ValueError(f"not a volume name: {name!r}")
        self._volumes.mkdir(mode=0o711, exist_ok=True)
        path = self._volumes / name
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o755)
        if os.geteuid() == 0:
            uid = self.config.host_uid or NOBODY
            os.chown(path, uid, self.config.host_gid or uid, follow_symlinks=False)
        return str(path)

    def remove_volume(self, ref: str) -> None:
        """Remove the volume's directory; `VolumeInUse` while a sandbox of this provider's
        records mounts it."""
        path = self._volume_path(ref)
        for record in self.list():
            if record.running and ref in (
                mount.volume for mount in _mounts(self._read_record(record.id).get("mounts"))
            ):
                raise VolumeInUse(f"volume {path.name} is mounted by sandbox {record.id}")
        remove_tree(path)

    def _volume_path(self, ref: str) -> Path:
        path = Path(ref)
        if path.parent != self._volumes or not _VOLUME.match(path.name):
            raise LookupError(f"{ref!r} is not a volume of {self.base}")
        return path

    def check_ready(self) -> None:
        """Always ready: its sandboxes are directories of this host."""

    def close(self) -> None:
        """Nothing to release: sandboxes hold their own jails."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ records

    def _config(self, sandbox_id: str, env: dict[str, str], mounts: tuple[Mount, ...] = ()) -> LocalSandboxConfig:
        fields = {name: getattr(self.config, name) for name in LocalSandboxTemplate.model_fields}
        fields["env"] = {**self.config.env, **env}
        return LocalSandboxConfig(root_dir=self.base / sandbox_id, sandbox_id=sandbox_id, mounts=mounts, **fields)

    def _id_of(self, ref: str) -> str:
        path = Path(ref)
        if path.is_absolute():
            if path.parent != self.base:
                raise LookupError(f"{ref!r} is not a sandbox of {self.base}")
            ref = path.name
        if not _ID.match(ref):
            raise LookupError(f"{ref!r} is not a local sandbox id")
        return ref

    def _write_record(self, sandbox_id: str, record: dict[str, Any]) -> None:
        path = self.base / f"{sandbox_id}.json"
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_text(json.dumps(record), encoding="utf-8")
        os.replace(temporary, path)

    def _read_record(self, sandbox_id: str) -> dict[str, Any]:
        try:
            record = json.loads((self.base / f"{sandbox_id}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}

    def _record(self, sandbox_id: str, exists: bool) -> SandboxRecord:
        record = self._read_record(sandbox_id)
        labels, created, expires = record.get("labels"), record.get("created_at"), record.get("expires_at")
        if not isinstance(created, int | float):
            with contextlib.suppress(OSError):
                created = (self.base / sandbox_id).stat().st_mtime
        return SandboxRecord(
            id=sandbox_id,
            ref=str(self.base / sandbox_id),
            labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
            created_at=float(created) if isinstance(created, int | float) else 0.0,
            expires_at=float(expires) if isinstance(expires, int | float) else None,
            running=exists,
        )


class _ProvidedSandbox(LocalSandbox):
    """A sandbox of a `LocalProvider`: destroying it removes its record too."""

    provider: LocalProvider | None = None

    def destroy(self) -> None:
        super().destroy()
        if self.provider is not None:
            self.provider.destroy(str(self.root))


_VOLUME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def _mounts(recorded: object) -> tuple[Mount, ...]:
    """The mounts a record lists (none if it lists none, or something else)."""
    if not isinstance(recorded, list):
        return ()
    try:
        return tuple(Mount.model_validate(mount) for mount in recorded)
    except ValueError:
        return ()
