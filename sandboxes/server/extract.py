"""Extract an archive inside a sandbox through its command stream, for destinations the
container engine's archive API cannot write.

Docker's ``put_archive`` writes into the container's filesystem from outside: it refuses a
read-only root, and it cannot see tmpfs mounts such as ``/tmp`` at all. The small upload path
(the exec helper) works there, so the bulk path must too: each member is recreated by the
sandbox's own user, through `BaseSandbox`'s scripts, where that user may write and nowhere else.
A regular file travels in bounded chunks into a staged name beside its target and is renamed
over it once complete (`_scripts.COMMIT_STAGED`), so memory stays bounded whatever the archive's
size, and a transfer cut halfway leaves the target as it was: `sandboxes._staged`, which
`DockerSandbox`'s own big uploads use too.

The archive reaching here was already made safe by `archive.rewrite_for_container` (no absolute
or escaping names, no devices or hard links, sizes bounded).
"""

from __future__ import annotations

import tarfile
from typing import IO

from sandboxes import _parse, _scripts
from sandboxes import protocol as p
from sandboxes._staged import TIMEOUT, stage_file
from sandboxes.base import BaseSandbox, staging_name
from sandboxes.semantics import message_for
from sandboxes.server.errors import ServiceError

__all__ = ["extract_through_sandbox"]


def extract_through_sandbox(sandbox: BaseSandbox, dest: str, archive: IO[bytes]) -> None:
    """Recreate every member of the tar ``archive`` under ``dest`` as the sandbox's user, with
    its mode (`_set_modes`)."""
    modes: dict[int, list[str]] = {}
    try:
        with tarfile.open(fileobj=archive, mode="r|") as tar:
            for member in tar:
                target = dest.rstrip("/") + "/" + member.name
                if member.isdir() or member.isreg():
                    modes.setdefault(member.mode & 0o777, []).append(target)
                if member.isdir():
                    _run(
                        sandbox,
                        _scripts.command('mkdir -p -- "$1" 2>/dev/null || { why "$1"; exit "$c"; }', target),
                        target,
                    )
                elif member.issym():
                    _run(
                        sandbox,
                        _scripts.command(
                            'ln -s -- "$1" "$2" 2>/dev/null || { why "$2"; exit "$c"; }', member.linkname, target
                        ),
                        target,
                    )
                elif member.isreg():
                    content = tar.extractfile(member)
                    assert content is not None
                    _put_file(sandbox, target, content, member.size)
    except tarfile.TarError as exc:
        raise ServiceError("invalid_request", "not a readable tar stream") from exc
    _set_modes(sandbox, modes)


def _set_modes(sandbox: BaseSandbox, modes: dict[int, list[str]]) -> None:
    """``chmod`` every extracted file and directory to its member's mode, one command per mode
    (the names on stdin, NUL-separated: any byte may be in them), directories after what they
    hold was written (the archive's rewrite gave each its owner's ``rwx``)."""
    for mode, targets in sorted(modes.items()):
        names = b"\0".join(target.encode("utf-8", "surrogateescape") for target in targets)
        _run(sandbox, _scripts.command('xargs -0 chmod "$1" --', f"{mode:o}"), targets[0], stdin=names)


def _put_file(sandbox: BaseSandbox, target: str, content: IO[bytes], size: int) -> None:
    """Checked and its parents made (`_scripts.PREPARE_UPLOAD`), staged in bounded chunks by the
    sandbox's user (`sandboxes._staged`, as `DockerSandbox`'s own bulk uploads), renamed."""
    prepared = sandbox.execute(_scripts.command(_scripts.PREPARE_UPLOAD, target), timeout=TIMEOUT)
    _raise_for(prepared, target, statuses=True)
    staged = staging_name(target)
    try:
        code = stage_file(sandbox, staged, content, size)
    except EOFError as exc:
        raise ServiceError("invalid_request", "not a readable tar stream") from exc
    except _parse.ScriptFailed as exc:
        raise ServiceError(exc.code if exc.code != p.BACKEND_ERROR else "internal", exc.message) from exc
    if code is not None:
        raise ServiceError(code, message_for(code, target))
    committed = sandbox.execute(_scripts.command(_scripts.COMMIT_STAGED, staged, target, str(size)), timeout=TIMEOUT)
    _raise_for(committed, target, statuses=True)


def _run(sandbox: BaseSandbox, command: str, path: str, *, stdin: bytes | None = None) -> None:
    _raise_for(sandbox.execute(command, stdin=stdin, timeout=TIMEOUT), path, statuses=False)


def _raise_for(response: p.ExecuteResponse, path: str, *, statuses: bool) -> None:
    """A failed step as the protocol would say it; the scripts' status lines when they print them."""
    try:
        code = _parse.check(response, path)
        if code is None and statuses:
            code = _parse.code_for_status(_parse.upload_statuses(response.output, 1)[0])
    except _parse.ScriptFailed as exc:
        raise ServiceError(exc.code if exc.code != p.BACKEND_ERROR else "internal", exc.message) from exc
    if code is not None:
        raise ServiceError(code, message_for(code, path))
