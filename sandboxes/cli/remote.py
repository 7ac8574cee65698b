"""The subcommands that talk to a sandbox service: the lifecycle (create, list, rm), copies in
and out (cp), and the opening of a remote sandbox for the protocol subcommands.

Imported only in remote mode: it needs the ``server`` extra (httpx), which a local-only
install does not have.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from sandboxes import api
from sandboxes import protocol as p
from sandboxes.cli._common import EXIT_ERROR, Failed, Session, Usage, emit_json, note, out
from sandboxes.cli._fast import KEY_ENV, list_lines, service_url, when
from sandboxes.client import NotFound, SandboxClient, SandboxServiceError
from sandboxes.paths import InvalidPathError, normalize_path, parent


@contextlib.contextmanager
def connect(args: argparse.Namespace) -> Iterator[SandboxClient]:
    """A client for the service. Few retries: a person at a terminal would rather hear at once
    that the service is down than wait through a long backoff."""
    client = SandboxClient(service_url(args), args.api_key or os.environ.get(KEY_ENV) or None, retries=1)
    try:
        yield client
    except SandboxServiceError as exc:
        # str() adds the HTTP status and request id (to find the request in the service's log).
        raise Failed(exc.code, str(exc).removeprefix(f"{exc.code}: ")) from exc
    finally:
        client.close()


@contextlib.contextmanager
def open_sandbox(args: argparse.Namespace, sandbox_id: str) -> Iterator[Session]:
    """A remote sandbox as a `Session`, its workdir as the base of relative paths. Asking for
    the workdir also tells a wrong id or key here, before anything runs."""
    with connect(args) as client:
        sandbox = client.attach(sandbox_id)
        info = sandbox.refresh()
        yield Session(sandbox, info.workdir or "/", remote=True)


# ---------------------------------------------------------------------- lifecycle


def cmd_create(args: argparse.Namespace, client: SandboxClient) -> int:
    sandbox = client.create(
        args.template,
        env=dict(args.env),
        ttl=args.ttl,
        labels=dict(args.label),
        idempotency_key=args.idempotency_key,
        volumes=[_mount(text) for text in args.volume],
        snapshot=args.snapshot,
        egress_allow=[] if args.no_egress else args.egress,
    )
    if args.json:
        emit_json(sandbox.info)
    else:
        out(sandbox.id + "\n")
    return 0


def cmd_list(args: argparse.Namespace, client: SandboxClient) -> int:
    sandboxes = client.list()
    if args.json:
        emit_json(sandboxes)
        return 0
    out(list_lines(sandboxes, long=args.long))
    return 0


def cmd_rm(args: argparse.Namespace, client: SandboxClient) -> int:
    """Every id is tried; the exit status says whether all of them went."""
    status = 0
    for sandbox_id in args.ids:
        try:
            client.delete(sandbox_id)
        except NotFound as exc:
            if not args.force:
                note(f"error: {exc.code}: {exc.message}")
                status = EXIT_ERROR
    return status


def cmd_metrics(args: argparse.Namespace, client: SandboxClient) -> int:
    """The latest sample in a line (``-`` where a value is unknown); every one with --json."""
    metrics = client.metrics(args.id)
    if args.json:
        emit_json(metrics)
        return 0
    latest = metrics.latest
    if latest is None:
        out(f"{args.id}: no sample yet (taken every {metrics.interval:g} s while the sandbox's helper runs)\n")
        return 0
    cpu = "-" if latest.cpu_percent is None else f"{latest.cpu_percent:.1f}%"
    memory = f"{_size(latest.memory_used)}/{_size(latest.memory_limit)}"
    disk = f"{_size(latest.disk_used)}/{_size(latest.disk_total)}"
    out(f"{args.id}  cpu {cpu}  memory {memory}  disk {disk}  at {when(latest.timestamp)} ({latest.source})\n")
    return 0


def _mount(text: str) -> api.VolumeMount:
    name, _, rest = text.partition(":")
    path, _, mode = rest.partition(":")
    if not name or not path.startswith("/") or mode not in ("", "ro", "rw"):
        raise Usage(f"--volume {text!r}: NAME:PATH or NAME:PATH:ro, PATH absolute")
    return api.VolumeMount(name=name, path=path, read_only=mode == "ro")


def cmd_volume(args: argparse.Namespace, client: SandboxClient) -> int:
    """create NAME (one), ls, rm NAME... (every name tried)."""
    if args.action == "ls":
        volumes = client.volumes()
        if args.json:
            emit_json(volumes)
        for volume in [] if args.json else volumes:
            mounted = ",".join(volume.mounted_by) or "-"
            size = _size(volume.size_limit)
            out(f"{volume.name}  {volume.template}  {volume.backend}  {size}  mounted by {mounted}\n")
        return 0
    if args.action == "create":
        if len(args.names) != 1:
            raise Usage("volume create: one NAME")
        volume = client.create_volume(args.names[0], size_limit=args.size, template=args.template)
        if args.json:
            emit_json(volume)
        else:
            out(volume.name + "\n")
        return 0
    if not args.names:
        raise Usage("volume rm: which NAME?")
    status = 0
    for name in args.names:
        try:
            client.delete_volume(name)
        except SandboxServiceError as exc:
            note(f"error: {exc.code}: {exc.message}")
            status = EXIT_ERROR
    return status


def _size(count: int | None) -> str:
    if count is None:
        return "-"
    return f"{count / (1 << 20):.1f}MiB"


# ---------------------------------------------------------------------- ports


def cmd_ports_forward(args: argparse.Namespace) -> int:
    """``ports forward SANDBOX PORT``: 127.0.0.1:LOCAL forwarded to PORT in the sandbox until
    interrupted (as ``kubectl port-forward``); the local port is PORT unless taken or given."""
    port = args.ports_port
    if not 0 < port < 65536:
        raise Usage(f"ports forward: a port is 1 to 65535, not {port}")
    with connect(args) as client:
        sandbox = client.attach(args.ports_sandbox)
        sandbox.refresh()  # a wrong id or key is said here, before anything listens
        try:
            forward = sandbox.forward_port(port, port if args.local_port is None else args.local_port)
        except OSError:
            if args.local_port is not None:
                raise Failed(p.UNAVAILABLE, f"127.0.0.1:{args.local_port} is taken") from None
            forward = sandbox.forward_port(port, 0)
        with forward:
            out(f"Forwarding from 127.0.0.1:{forward.local_port} -> {port}\n")
            sys.stdout.flush()
            forward.wait()
    return 0


# ---------------------------------------------------------------------- cp


def split_remote(text: str) -> tuple[str, str] | None:
    """``ID:PATH`` -> ``(ID, PATH)``; a local path -> ``None``. As with ``docker cp``, a local
    path with a colon is written ``./a:b``."""
    head, sep, tail = text.partition(":")
    if not sep or not head or "/" in head or head in (".", ".."):
        return None
    return head, tail


def cmd_cp(args: argparse.Namespace) -> int:
    source, target = split_remote(args.source), split_remote(args.target)
    if (source is None) == (target is None):
        raise Usage("cp: exactly one of SOURCE and TARGET is SANDBOX_ID:PATH")
    if target is not None:
        with open_sandbox(args, target[0]) as session:
            _upload(args.source, session, target[1])
        return 0
    assert source is not None
    with open_sandbox(args, source[0]) as session:
        _download(session, source[1], args.target)
    return 0


def _remote_path(session: Session, raw: str) -> str:
    try:
        return normalize_path(session.path(raw or "."))
    except InvalidPathError as exc:
        raise Failed(p.INVALID_PATH, str(exc)) from exc


def _upload(local: str, session: Session, raw_target: str) -> None:
    """Like ``docker cp``: into the target if it is a directory (or ends with ``/``), else to
    the target's name. ``-`` reads a tar stream from stdin and extracts it into the target."""
    sandbox = session.backend
    target = _remote_path(session, raw_target)
    upload = sandbox.upload_archive  # type: ignore[attr-defined]
    if local == "-":
        upload(target, sys.stdin.buffer)
        return
    path = Path(local)
    if not path.exists() and not path.is_symlink():
        raise Failed(p.FILE_NOT_FOUND, f"{local}: no such file or directory")
    listing = sandbox.ls(target)
    if raw_target.endswith("/") or listing.error is None:
        directory, name = target, path.resolve().name if path.name in ("", ".", "..") else path.name
    elif listing.error in (p.NOT_A_DIRECTORY, p.FILE_NOT_FOUND):
        directory, name = parent(target), target.rsplit("/", 1)[-1]
    else:
        raise Failed(listing.error, listing.message or listing.error)
    from sandboxes.cli import _transfer  # tarfile: only for cp

    with _transfer.tar_stream(path, name) as stream:
        upload(directory, stream)


def _download(session: Session, raw_source: str, local: str) -> None:
    """Like ``docker cp``: into the local target if it is a directory, else to its name; ``-``
    writes the tar stream itself to stdout."""
    source = _remote_path(session, raw_source)
    if source == "/":
        raise Failed(p.INVALID_PATH, "cp: copy a directory of the sandbox, not its whole root")
    chunks = session.backend.download_archive(source)  # type: ignore[attr-defined]
    if local == "-":
        for chunk in chunks:
            sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
        return
    destination = Path(local)
    if destination.is_dir():
        into, name = destination, None
    else:
        into, name = destination.parent, destination.name
        if not into.is_dir():
            raise Failed(p.FILE_NOT_FOUND, f"{into}: no such directory")
    from sandboxes.cli import _transfer

    _transfer.extract(chunks, into, rename=name)


# ---------------------------------------------------------------------- MCP


def cmd_mcp(args: argparse.Namespace) -> int:
    """Serve MCP on stdio until stdin ends, as the key's tenant of the service at ``--url``."""
    url = service_url(args)
    try:
        from sandboxes.mcp import run_stdio
    except ImportError as exc:
        raise Failed(
            p.BACKEND_ERROR, f"the MCP server needs the mcp extra (pip install 'sandboxes[mcp]'): {exc}"
        ) from exc
    run_stdio(url, args.api_key or os.environ.get(KEY_ENV) or None, sandbox_id=args.sandbox)
    return 0
