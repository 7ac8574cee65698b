"""`VirtualRoot`: a sandbox whose directory on this host is shown to the model as ``/workspace``.

A local sandbox's files are a host directory (``~/.local/state/sandboxes-agent/local/<id>``),
at the same path inside its jail. Other backends put the model in ``/workspace``; this view
does too: a path under the virtual root in an argument (a file operation's path, a command's
``cwd``, a path word in a command's text) means the same path under the real one, and the real
root in anything that comes back (paths, messages, a command's output) reads as the virtual one.
Paths elsewhere pass unchanged both ways. The real root must be a plain path (letters, digits,
``_ . / -``), so that substituting it into a command's text cannot change the command's syntax.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, TypeVar

from sandboxes import protocol as p
from sandboxes.paths import is_within

__all__ = ["VIRTUAL_ROOT", "VirtualRoot", "plain_path"]

VIRTUAL_ROOT = "/workspace"

R = TypeVar("R")

_PLAIN = re.compile(r"/[\w./-]*")
_WORD_END = r"(?=$|/|[^\w.-])"
"""The end of a path word: the root is not the prefix of a longer name."""


def plain_path(path: str) -> bool:
    """Whether ``path`` is absolute and made only of characters no shell treats specially."""
    return _PLAIN.fullmatch(path) is not None and "//" not in path


class VirtualRoot(p.SandboxBackendProtocol):
    """``sandbox`` with its directory ``real`` shown as ``virtual``; ``workspace`` is ``virtual``."""

    def __init__(self, sandbox: p.SandboxBackendProtocol, real: str, virtual: str = VIRTUAL_ROOT) -> None:
        if not (plain_path(real) and plain_path(virtual)) or real == "/" or virtual == "/":
            raise ValueError(f"cannot show {real!r} as {virtual!r}: both must be plain absolute paths below /")
        self.sandbox = sandbox
        self.real = real.rstrip("/")
        self.workspace = virtual.rstrip("/")
        self._real_word = re.compile(re.escape(self.real) + _WORD_END)
        self._virtual_word = re.compile(r"(?<![\w./-])" + re.escape(self.workspace) + _WORD_END)

    # ------------------------------------------------------------------ mapping

    def inward(self, path: str) -> str:
        """The real path of a path the model wrote."""
        return self.real + path[len(self.workspace) :] if is_within(path, self.workspace) else path

    def outward(self, text: str) -> str:
        """``text`` with the real root written as the virtual one."""
        return self._real_word.sub(self.workspace, text) if self.real in text else text

    def _command(self, command: str) -> str:
        return self._virtual_word.sub(self.real, command) if self.workspace in command else command

    def _out(self, result: R) -> R:
        """A result with every path and message it carries shown outward (file content untouched)."""
        if isinstance(result, list):
            return [self._out(item) for item in result]  # type: ignore[return-value]
        if not dataclasses.is_dataclass(result) or isinstance(result, type):
            return result
        changes: dict[str, Any] = {}
        for field in dataclasses.fields(result):
            value = getattr(result, field.name)
            if field.name in ("path", "message", "output") and isinstance(value, str):
                changes[field.name] = self.outward(value)
            elif field.name in ("entries", "matches") and isinstance(value, list):
                changes[field.name] = self._out(value)
        return dataclasses.replace(result, **changes)

    # ------------------------------------------------------------------ protocol

    @property
    def id(self) -> str:
        return self.sandbox.id

    def close(self) -> None:
        close = getattr(self.sandbox, "close", None)
        if callable(close):
            close()

    def ls(self, path: str) -> p.LsResult:
        return self._out(self.sandbox.ls(self.inward(path)))

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> p.ReadResult:
        return self._out(self.sandbox.read(self.inward(file_path), offset, limit))

    def write(self, file_path: str, content: str) -> p.WriteResult:
        return self._out(self.sandbox.write(self.inward(file_path), content))

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> p.EditResult:
        return self._out(self.sandbox.edit(self.inward(file_path), old_string, new_string, replace_all))

    def delete(self, file_path: str) -> p.DeleteResult:
        return self._out(self.sandbox.delete(self.inward(file_path)))

    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> p.GrepResult:
        root = None if path is None else self.inward(path)
        return self._out(self.sandbox.grep(pattern, root, glob, max_count=max_count))

    def glob(self, pattern: str, path: str | None = None) -> p.GlobResult:
        return self._out(self.sandbox.glob(pattern, None if path is None else self.inward(path)))

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[p.FileUploadResponse]:
        answers = self.sandbox.upload_files([(self.inward(path), data) for path, data in files])
        return [dataclasses.replace(self._out(a), path=path) for a, (path, _) in zip(answers, files, strict=True)]

    def download_files(self, paths: list[str]) -> list[p.FileDownloadResponse]:
        answers = self.sandbox.download_files([self.inward(path) for path in paths])
        return [dataclasses.replace(self._out(a), path=path) for a, path in zip(answers, paths, strict=True)]

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
        response = self.sandbox.execute(
            self._command(command),
            timeout=timeout,
            stdin=stdin,
            env=env,
            cwd=self.real if cwd is None else self.inward(cwd),
            output_limit=output_limit,
        )
        return self._out(response)
