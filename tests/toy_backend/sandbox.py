"""A TOY sandbox and its provider, for tests: each sandbox is a temporary directory of this host,
each command a ``sh -c`` subprocess started in it. Nothing is isolated; it exists to show what a
backend must supply (`sandboxes.lifecycle.Sandbox`, `sandboxes.lifecycle.Provider`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Self

from sandboxes import protocol as p
from sandboxes.base import BaseSandbox
from sandboxes.lifecycle import CreateOptions, Sandbox, SandboxRecord, Sweep

_MARKER = ".toy.json"
"""Beside each sandbox's directory (``<id>.toy.json``): its labels and creation time."""


class ToySandbox(BaseSandbox, Sandbox):
    """A TOY sandbox: a directory, and commands run by this host's ``sh`` in it (no isolation)."""

    def __init__(
        self, directory: Path, *, env: Mapping[str, str], default_timeout: float, output_limit: int, owned: bool
    ) -> None:
        self.directory = directory
        self.env = dict(env)
        self.default_timeout = default_timeout
        self.output_limit = output_limit
        self.owned = owned

    @property
    def id(self) -> str:
        return self.directory.name

    @property
    def ref(self) -> str:
        return str(self.directory)

    @property
    def workdir(self) -> str:
        return str(self.directory)

    def execute(
        self,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int | None = None,
    ) -> p.ExecuteResponse:
        """``command`` in a subprocess; its output cut to ``output_limit`` bytes (a toy: no head
        and tail, and the output is read whole before it is cut)."""
        data = stdin.encode() if isinstance(stdin, str) else stdin
        limit = self.output_limit if output_limit is None else output_limit
        try:
            done = subprocess.run(
                ["sh", "-c", command],
                cwd=cwd or self.directory,
                input=data or b"",
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env, **(env or {})},
                timeout=timeout if timeout else self.default_timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return p.ExecuteResponse("", error=p.TIMEOUT, message=f"{command!r} timed out")
        output = done.stdout[:limit].decode("utf-8", "replace")
        return p.ExecuteResponse(output, exit_code=done.returncode, truncated=len(done.stdout) > limit)

    def close(self) -> None:
        """Nothing is held."""

    def destroy(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.with_name(self.directory.name + _MARKER).unlink(missing_ok=True)


class ToyProvider:
    """Makes and finds TOY sandboxes under ``base``; what it knows is in their marker files."""

    def __init__(self, base: Path, *, env: Mapping[str, str], default_timeout: float, output_limit: int) -> None:
        self.base = base
        self.env = dict(env)
        self.default_timeout = default_timeout
        self.output_limit = output_limit

    def _sandbox(self, directory: Path, env: object, *, owned: bool) -> ToySandbox:
        added = env if isinstance(env, dict) else {}
        return ToySandbox(
            directory,
            env={**self.env, **added},
            default_timeout=self.default_timeout,
            output_limit=self.output_limit,
            owned=owned,
        )

    def create(self, options: CreateOptions | None = None) -> ToySandbox:
        options = options or CreateOptions()
        directory = self.base / f"toy-{uuid.uuid4().hex[:12]}"
        directory.mkdir(parents=True)
        record = {"labels": options.labels, "env": options.env, "created_at": time.time()}
        directory.with_name(directory.name + _MARKER).write_text(json.dumps(record))
        return self._sandbox(directory, options.env, owned=True)

    def attach(self, ref: str) -> ToySandbox:
        directory = Path(ref)
        if directory.parent != self.base or not directory.is_dir():
            raise LookupError(f"no toy sandbox {ref!r}")
        return self._sandbox(directory, self._record(directory).get("env", {}), owned=False)

    def _record(self, directory: Path) -> dict[str, object]:
        try:
            loaded = json.loads(directory.with_name(directory.name + _MARKER).read_text())
        except (OSError, ValueError):
            return {}
        return loaded if isinstance(loaded, dict) else {}

    def list(self) -> list[SandboxRecord]:
        if not self.base.is_dir():
            return []
        found = []
        for directory in sorted(path for path in self.base.iterdir() if path.is_dir()):
            record = self._record(directory)
            labels = record.get("labels")
            created = record.get("created_at")
            found.append(
                SandboxRecord(
                    id=directory.name,
                    ref=str(directory),
                    labels=labels if isinstance(labels, dict) else {},
                    created_at=created if isinstance(created, float) else 0.0,
                )
            )
        return found

    def destroy(self, ref: str) -> None:
        directory = Path(ref)
        if directory.parent == self.base:
            shutil.rmtree(directory, ignore_errors=True)
            directory.with_name(directory.name + _MARKER).unlink(missing_ok=True)

    def sweep(self, now: float | None = None) -> Sweep:
        """No expiry of its own: the service's TTLs rule."""
        return Sweep()

    def check_ready(self) -> None:
        """Ready unless a file ``NOT_READY`` is beside its sandboxes (a test's switch)."""
        if (self.base / "NOT_READY").exists():
            raise RuntimeError("the toy backend was told it is not ready")

    def close(self) -> None:
        """Nothing is held."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
