"""The backends behind the service: one adapter, `ProviderBackend`, over any
`sandboxes.lifecycle.Provider` (one per template), and the service's state of a sandbox read
from its record (`state_from_record`; `sandboxes.server.reconcile` adopts what the providers
really have after a restart and reaps the rest).

What the service adds to a provider it records on the sandbox itself, as `CreateOptions` labels
(tenant, template, the service's own id, its creation and expiry, the client's labels), so a
restart that lost its state files still knows whose a sandbox is. A `SharedProvider` (Docker,
Kubernetes) also records the expiry where it can move (`SharedProvider.set_expiry`): there the
sandbox is the whole record, which every replica of the service reads (`ProviderBackend.select`)
and changes, and no state file is written. The others (local directories, SSH workspaces) are
created without a provider expiry, and a renewal lives in the state file of the one service
that can reach them.

Every sandbox is a `sandboxes.lifecycle.Sandbox` (its ``ref``, ``workdir`` and ``user_ids``),
and every provider is made by its template (`sandboxes.templates.TemplateConfig.provider`): no
backend is named here. What only some sandboxes can do is a typed capability, checked with
``isinstance``: files that are a directory on this host (`HostFiles`: archives are made and
extracted by the service itself), output streamed raw on a channel of its own (`StreamsOutput`),
and for everything else the sandbox's own commands.

Everything here blocks (provider calls, directory trees); the registry calls it from worker
threads.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import logging
import os
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

from sandboxes import _scripts
from sandboxes._helper import _archive, _kill
from sandboxes._mux._shipped import program
from sandboxes.base import BaseSandbox, KillsTagged
from sandboxes.lifecycle import CreateOptions, Mount, Provider, RecordsNetwork, Sandbox, SandboxRecord, SharedProvider
from sandboxes.server.archive import (
    Transform,
    Watch,
    checked_path,
    extract_local,
    on_pseudo_filesystem,
    open_local_archive,
    read_on_host,
    rewrite_for_container,
    write_local_archive,
)
from sandboxes.server.claims import Claims
from sandboxes.server.egress.policy import proxy_env
from sandboxes.server.errors import ServiceError
from sandboxes.server.extract import extract_through_sandbox
from sandboxes.server.logs import random_id
from sandboxes.server.network_record import allow_from_text, allow_text, read_network_record
from sandboxes.server.settings import ServiceSettings
from sandboxes.server.startup import start_template
from sandboxes.server.store import SandboxState
from sandboxes.server.streams import CHUNK, ChunkSink, Emit
from sandboxes.templates import ProviderContext, Template

logger = logging.getLogger(__name__)

LABEL_TENANT = "io.sandboxes.tenant"
LABEL_TEMPLATE = "io.sandboxes.template"
LABEL_SERVICE_ID = "io.sandboxes.service-id"
"""The service's id of the sandbox (what clients use), on the sandbox beside the provider's."""
LABEL_SERVICE_EXPIRES = "io.sandboxes.service-expires-at"
"""The expiry the sandbox was created with, for a restart that lost its state file (a
`SharedProvider` records the current one itself: `SandboxRecord.expires_at`)."""
LABEL_SERVICE_CREATED = "io.sandboxes.service-created-at"
"""When the service created it, so every replica reports the same ``created_at``."""
LABEL_IDEMPOTENCY_KEY = "io.sandboxes.idempotency-key"
"""The digest of the tenant's ``Idempotency-Key`` that created it, for a retry to find it."""
LABEL_REQUEST_DIGEST = "io.sandboxes.request-digest"
"""The digest of the create request that made it: a key reused for another request is refused."""
LABEL_AUTO_RESUME = "io.sandboxes.auto-resume"
"""Present (``true``) on a sandbox created with ``auto_resume``."""
LABEL_ON_TIMEOUT = "io.sandboxes.on-timeout"
"""On a sandbox created with an ``on_timeout`` other than ``delete``: that choice."""
LABEL_EGRESS_ALLOW = "io.sandboxes.egress-allow"
"""On a sandbox whose create gave its own egress allow-list: the list as JSON, or where labels
hold only short values (pods) `EGRESS_NOT_RECORDED`, which a replica that adopts it reads as
nothing allowed (a list that cannot be read back is never widened to the template's)."""
EGRESS_NOT_RECORDED = "own"
LABEL_POOL_MEMBER = "io.sandboxes.service-pool"
"""On a sandbox made for a warm pool, tenant-less (`sandboxes.server.pool`): the pool's id
(`sandboxes.server.claims.Claims.pool_id`); its tenant, once claimed, is in its claim."""
LABEL_USER_PREFIX = "io.sandboxes.label."
"""Clients' own labels, carried on the sandbox so a restart without state recovers them."""
MARKER_ENV = _kill.MARKER_ENV
"""Set on every command the service runs, with a token of its own: all its descendants inherit
it, which is how its whole tree is found and killed, even the parts that left its process group
(the backends take the caller's marker as the command's own)."""

_KILL_MARKED = _kill.KILL_MARKED_SH + 'kill_marked "$1"\n'

Adopted = tuple[SandboxState, BaseSandbox]
"""A sandbox the service holds: a `Sandbox` whose file operations run on its commands."""


@runtime_checkable
class HostFiles(Protocol):
    """A sandbox whose files are a directory on the service's own host (`LocalSandbox`)."""

    @property
    def root(self) -> Path: ...

    @property
    def user_ids(self) -> tuple[int, int]:
        """Who files belong to inside the sandbox (uid, gid)."""
        ...

    def claim(self, path: str | Path) -> None:
        """Hand files the service put in the root to the sandbox's host uid."""
        ...


class OutputStream(Protocol):
    def recv(self, size: int) -> bytes: ...
    def exit_code(self) -> int | None: ...
    def close(self) -> None: ...


@runtime_checkable
class StreamsOutput(Protocol):
    """A sandbox that can run a command on a channel of its own and hand its stdout over raw,
    as it comes (Docker, SSH, Kubernetes, a local jail): big output, an archive, need not fit
    `execute`'s bounded text answer."""

    def open_output_stream(self, command: str) -> OutputStream: ...


@runtime_checkable
class ScopedRecords(Protocol):
    """A shared provider that says what its `select` lists: two with the same
    ``records_scope`` list the same sandboxes."""

    @property
    def records_scope(self) -> Hashable: ...


class ProviderBackend:
    """The service's view of one template: its provider, and what the service adds to it."""

    def __init__(self, template_name: str, template: Template, provider: Provider[Sandbox], settings: ServiceSettings):
        self.template_name = template_name
        self.template = template
        self.provider = provider
        self.settings = settings
        self.name: str = template.backend
        """The backend's kind, as `SandboxInfo.backend` and the metrics say it."""
        self.claims: Claims | None = None
        """The service's claims of pooled sandboxes (`sandboxes.server.claims`), on a shared
        backend: their states, where their labels name no tenant."""

    @functools.cached_property
    def shared(self) -> bool:
        """Whether its sandboxes' records (tenant, expiry) live on the sandboxes alone, where
        every replica of the service reads and changes them (`SharedProvider`); otherwise the
        service's state files add what the provider cannot record (a renewed expiry).

        Worked out once: the registry asks on every request, and ``isinstance`` of a runtime
        protocol inspects the class's attributes each time, on the event loop."""
        return isinstance(self.provider, SharedProvider)

    @functools.cached_property
    def records_network(self) -> bool:
        """Whether its sandboxes' network set through the API is recorded on them (a pod's
        annotation, `RecordsNetwork`), where every replica reads it with their record; otherwise
        it lives in the state file of the replica that set it. Worked out once, as `shared`."""
        return self.shared and isinstance(self.provider, RecordsNetwork)

    @functools.cached_property
    def scope(self) -> Hashable:
        """What its `select` lists: backends of the same scope (templates of one engine and
        owner, `ScopedRecords`) list the same sandboxes, so one list serves them all; a provider
        that does not say is a scope of its own."""
        return self.provider.records_scope if isinstance(self.provider, ScopedRecords) else ("provider", id(self))

    def create(
        self,
        tenant: str,
        expires_at: float,
        labels: dict[str, str],
        env: dict[str, str],
        *,
        sandbox_id: str | None = None,
        keyed: tuple[str, str] | None = None,
        mounts: tuple[Mount, ...] = (),
        auto_resume: bool = False,
        egress_allow: list[str] | None = None,
        pool: str | None = None,
        on_timeout: str = "delete",
    ) -> Adopted:
        """A new sandbox; ``keyed``: the digests of its ``Idempotency-Key`` and request, whose
        key also names it on the backend (`backend_name`): `SandboxNameTaken` if it is made.
        ``egress_allow``: its own egress allow-list, recorded on it (`LABEL_EGRESS_ALLOW`).
        ``pool``: made for the warm pool of that id, labelled with no tenant (``tenant`` unused)."""
        sandbox_id = sandbox_id or new_sandbox_id()
        created_at = float(f"{time.time():.6f}")  # as its label says it, to every replica
        recorded = {
            LABEL_TENANT: tenant,
            LABEL_TEMPLATE: self.template_name,
            LABEL_SERVICE_ID: sandbox_id,
            LABEL_SERVICE_EXPIRES: str(int(expires_at)),
            LABEL_SERVICE_CREATED: f"{created_at:.6f}",
        }
        if keyed is not None:
            recorded[LABEL_IDEMPOTENCY_KEY], recorded[LABEL_REQUEST_DIGEST] = keyed
        if pool is not None:
            del recorded[LABEL_TENANT]
            recorded[LABEL_POOL_MEMBER] = pool
        if auto_resume:
            recorded[LABEL_AUTO_RESUME] = "true"
        if on_timeout != "delete":
            recorded[LABEL_ON_TIMEOUT] = on_timeout
        if egress_allow is not None:
            short = self.template.label_values_only
            recorded[LABEL_EGRESS_ALLOW] = EGRESS_NOT_RECORDED if short else allow_text(egress_allow)
        recorded.update({LABEL_USER_PREFIX + key: value for key, value in labels.items()})
        name = None if keyed is None else backend_name(self.settings.owner, keyed[0])
        if self.template.egress:  # every command's proxy: the helper's listener (`sandboxes.server.egress`)
            env = {**proxy_env(self.template.egress_port), **env}
        expires = expires_at if self.shared else None
        options = CreateOptions(labels=recorded, env=env, expires_at=expires, name=name, mounts=mounts)
        made = self.provider.create(options)
        sandbox = _held(made)
        try:
            start_template(sandbox, self.template)
        except BaseException:
            made.destroy()
            raise
        state = SandboxState(
            id=sandbox_id,
            tenant=tenant,
            template=self.template_name,
            backend=self.name,
            created_at=created_at,
            expires_at=expires_at,
            cpus=self.template.cpus,
            memory=self.template.memory_bytes,
            ref=made.ref,
            workdir=made.workdir,
            labels=dict(labels),
            env=dict(env),
            auto_resume=auto_resume,
            on_timeout=on_timeout,
            egress_allow=None if egress_allow is None else list(egress_allow),
        )
        if keyed is not None:
            state.idempotency_key, state.request_digest = keyed
        return state, sandbox

    def renew(self, state: SandboxState, expires_at: float) -> None:
        """Record the new expiry on the sandbox, for every replica (a shared provider's only;
        the others' renewals live in the service's state files), its claim's first (what this
        service reads). `LookupError` if it is gone, or its claim records it deleted."""
        if self.claims is not None and not self.claims.renew(state.id, expires_at):
            raise LookupError(f"sandbox {state.id} was deleted")
        if isinstance(self.provider, SharedProvider):
            self.provider.set_expiry(state.ref, expires_at)

    def select(self, **labels: str) -> list[SandboxState]:
        """The service's sandboxes of a shared provider whose service labels match, e.g.
        ``select(tenant="a")`` or ``select(sandbox_id="...")``, as their records say."""
        if not isinstance(self.provider, SharedProvider):
            return []
        keys = {"tenant": LABEL_TENANT, "sandbox_id": LABEL_SERVICE_ID, "idempotency_key": LABEL_IDEMPOTENCY_KEY}
        records = self.provider.select({keys[name]: value for name, value in labels.items()})
        states = [state for record in records if (state := self.state_of(record)) is not None]
        if self.claims is not None and labels and "sandbox_id" not in labels:  # no label names their tenant
            states += self.claims.matching(self.name, labels.get("tenant"), labels.get("idempotency_key"))
        return states

    def state_of(self, record: SandboxRecord) -> SandboxState | None:
        """The service's state of a sandbox, from its record alone; ``None`` for a sandbox of
        this owner that is no tenant's (an orphan), or one still being made."""
        if record.starting:
            return None
        return state_from_record(record, self)

    def attach(self, state: SandboxState) -> BaseSandbox:
        return _held(self.provider.attach(state.ref))

    def destroy(self, state: SandboxState, sandbox: BaseSandbox | None) -> None:
        """Remove the sandbox and everything it stored. Idempotent: gone already is fine."""
        if sandbox is not None:
            _as_sandbox(sandbox).close()
        self.provider.destroy(state.ref)
        if self.claims is not None:
            self.claims.drop(state.id)

    def kill_marked(self, sandbox: BaseSandbox, token: str) -> None:
        """Kill every process of the sandbox carrying ``MARKER_ENV=token``."""
        if isinstance(sandbox, HostFiles):
            _kill_marked_on_host(token)
            return
        if isinstance(sandbox, KillsTagged) and sandbox.kill_tagged(MARKER_ENV, token):
            return  # done by the exec helper, with no process started: works in a full sandbox
        sandbox.execute(_scripts.command(_KILL_MARKED, token), timeout=30)

    def open_archive(self, sandbox: BaseSandbox, path: str) -> Callable[[Emit], None]:
        """Validate ``path`` and return the producer of its tar stream."""
        limit = self.settings.max_archive_file_bytes
        if isinstance(sandbox, HostFiles) and read_on_host(sandbox, str(sandbox.root), path):
            uid, gid = sandbox.user_ids
            return open_local_archive(str(sandbox.root), path, uid=uid, gid=gid, limit=limit)
        if isinstance(sandbox, StreamsOutput):  # a local jail's /proc, /sys and /tmp too
            return _open_streamed_archive(sandbox, path, limit)
        return _open_archive_by_command(sandbox, path, self.settings.max_output_bytes)

    def host_files(self, sandbox: BaseSandbox) -> bool:
        """Whether the service reads and writes the sandbox's files itself (`HostFiles`): then
        `write_archive` and `put_archive`'s ``watch`` serve."""
        return isinstance(sandbox, HostFiles)

    def write_archive(self, sandbox: BaseSandbox, path: str, out: IO[bytes], transform: Transform) -> None:
        """The tar of ``path`` written into ``out``, every member through ``transform``, by the
        service itself: for a sandbox whose files are on this host (`host_files`) only."""
        if not isinstance(sandbox, HostFiles):
            raise TypeError(f"{type(sandbox).__name__}'s files are not on this host")
        uid, gid = sandbox.user_ids
        write_local_archive(str(sandbox.root), path, out, uid=uid, gid=gid, transform=transform)

    def put_archive(self, sandbox: BaseSandbox, path: str, archive: IO[bytes], *, watch: Watch | None = None) -> None:
        """Extract the tar ``archive`` under ``path``; ``watch`` sees every member as it is
        written, for a sandbox whose files are on this host (`host_files`) only."""
        if isinstance(sandbox, HostFiles):
            _put_host_archive(sandbox, path, archive, self.settings, watch)
            return
        if watch is not None:
            raise TypeError(f"{type(sandbox).__name__}'s files are not on this host: no member can be watched")
        uid, gid = _as_sandbox(sandbox).user_ids
        _put_archive_through_sandbox(sandbox, path, archive, self.settings, uid, gid)

    def check_ready(self) -> None:
        """Raise if the backend cannot create sandboxes right now."""
        self.provider.check_ready()

    def close(self) -> None:
        """Release connections; sandboxes stay (a restarted service adopts them)."""
        self.provider.close()


def backend_name(owner: str, key: str) -> str:
    """The backend's name of the sandbox an ``Idempotency-Key`` (its digest ``key``) makes: the
    same on every replica, another for another owner (names are the engine's, not an owner's)."""
    return hashlib.sha256(f"{owner}\0{key}".encode()).hexdigest()[:32]


def new_sandbox_id() -> str:
    """16 random hex digits (`sandboxes.server.logs.random_id`)."""
    return random_id()


def _held(sandbox: Sandbox) -> BaseSandbox:
    """A provider's sandbox as the service holds it: one whose file operations and commands
    are `BaseSandbox`'s, as every backend's are."""
    if not isinstance(sandbox, BaseSandbox):
        raise TypeError(f"{type(sandbox).__name__} is not a BaseSandbox: the service cannot serve it")
    return sandbox


def _as_sandbox(sandbox: BaseSandbox) -> Sandbox:
    """A held sandbox as the lifecycle contract's `Sandbox`, which every provider's sandbox is."""
    if not isinstance(sandbox, Sandbox):
        raise TypeError(f"{type(sandbox).__name__} is not a Sandbox: no provider made it")
    return sandbox


def workdir_of(sandbox: BaseSandbox) -> str:
    """The sandbox's working directory, as its backend says it (`Sandbox.workdir`)."""
    return _as_sandbox(sandbox).workdir


# ---------------------------------------------------------------------- records


def state_from_record(record: SandboxRecord, backend: ProviderBackend) -> SandboxState | None:
    """What a sandbox says about itself: all there is of a shared provider's, and for the
    others' one the state files do not know (a crash between its creation and the state's
    write)."""
    labels = record.labels
    tenant, sandbox_id = labels.get(LABEL_TENANT), labels.get(LABEL_SERVICE_ID)
    if not tenant and sandbox_id and labels.get(LABEL_POOL_MEMBER):
        return _claimed(record, backend, sandbox_id)
    if not tenant or not sandbox_id:
        return None
    expires_at = record.expires_at  # a shared provider's, renewed; else the service's label
    if expires_at is None:
        try:
            expires_at = float(labels[LABEL_SERVICE_EXPIRES])
        except (KeyError, ValueError):
            return None
    try:
        created_at = float(labels[LABEL_SERVICE_CREATED])
    except (KeyError, ValueError):
        created_at = record.created_at
    state = SandboxState(
        id=sandbox_id,
        tenant=tenant,
        template=labels.get(LABEL_TEMPLATE, "default"),
        backend=backend.name,
        created_at=created_at,
        expires_at=expires_at,
        cpus=backend.template.cpus,
        memory=backend.template.memory_bytes,
        ref=record.ref,
        workdir="",
        labels={k[len(LABEL_USER_PREFIX) :]: v for k, v in labels.items() if k.startswith(LABEL_USER_PREFIX)},
        idempotency_key=labels.get(LABEL_IDEMPOTENCY_KEY, ""),
        request_digest=labels.get(LABEL_REQUEST_DIGEST, ""),
        paused="keep" if record.frozen else "",
        auto_resume=labels.get(LABEL_AUTO_RESUME) == "true",
        on_timeout=labels.get(LABEL_ON_TIMEOUT, "delete"),
        egress_allow=allow_from_text(labels.get(LABEL_EGRESS_ALLOW)),
    )
    if record.network is not None:  # set through the API since its create, by whichever replica
        read_network_record(state, record.network)
    return state


def _claimed(record: SandboxRecord, backend: ProviderBackend, sandbox_id: str) -> SandboxState | None:
    """A pooled sandbox's state: its claim's (`sandboxes.server.claims`); ``None`` while it is
    unclaimed, or another service's pool's."""
    claims = backend.claims
    if claims is None or record.labels.get(LABEL_POOL_MEMBER) != claims.pool_id:
        return None
    state = claims.get(sandbox_id)
    if state is None or state.ref != record.ref:
        return None
    state.paused = "keep" if record.frozen else ""
    if record.network is not None:
        read_network_record(state, record.network)
    return state


def pooled_elsewhere(record: SandboxRecord, backend: ProviderBackend) -> bool:
    """Whether ``record`` is a sandbox another service pooled (not this one's to claim or reap)."""
    pool = record.labels.get(LABEL_POOL_MEMBER)
    return bool(pool) and (backend.claims is None or pool != backend.claims.pool_id)


# ---------------------------------------------------------------------- processes


def _kill_marked_on_host(token: str) -> None:
    """Commands of a local sandbox share its jail, but the host sees every jail's processes and
    their environments (the exec helper takes the token as the command's marker)."""
    _kill.kill_marked(token, MARKER_ENV)


# ---------------------------------------------------------------------- archives


_WRITABLE_DIR = r"""mkdir -p -- "$1" 2>/dev/null
if [ ! -d "$1" ]; then exit 3; fi
if [ ! -w "$1" ] || [ ! -x "$1" ]; then exit 4; fi
exit 0
"""

_READABLE = r"""if [ ! -e "$1" ] && [ ! -L "$1" ]; then exit 3; fi
if [ ! -r "$1" ]; then exit 4; fi
exit 0
"""

_TAR_AS_USER = r"""cd -- "$1" || exit 2
if tar --version 2>/dev/null | grep -q GNU; then
  tar -cf - --ignore-failed-read -- "$2"; s=$?
  if [ "$s" -eq 1 ]; then s=0; fi  # GNU: a file changed while it was read
  exit "$s"
fi
exec tar -cf - -- "$2"
"""
"""``tar`` of ``$1/$2`` to stdout; GNU tar leaves out what the user may not read, busybox's fails.
From inside ``$1``, not ``tar -C``: GNU tar opens a ``-C`` directory for reading, which a parent
the user may only search (SSH's workspace root) refuses."""

_ARCHIVE_AS_USER = (
    'if command -v python3 >/dev/null 2>&1; then exec python3 -I -S -c "$4" "$1" "$2" "$3"; fi\n' + _TAR_AS_USER
)
"""The tar of ``$1/$2`` with no file over ``$3`` bytes by the helper's program ``$4``
(`sandboxes._helper._archive`: a pseudo-file is what a read gives); ``tar`` where no python3 is."""


def archive_limits(settings: ServiceSettings) -> dict[str, int]:
    """The bounds on what an uploaded archive may be, as `sandboxes.server.archive` takes them."""
    return {
        "max_bytes": settings.max_archive_bytes,
        "max_members": settings.max_archive_members,
        "max_expansion": settings.max_archive_expansion,
    }


def _put_host_archive(
    sandbox: HostFiles, path: str, archive: IO[bytes], settings: ServiceSettings, watch: Watch | None
) -> None:
    root = str(sandbox.root)
    extract_local(root, path, archive, **archive_limits(settings), watch=watch)
    # Extracted by the service; a root-started jail runs as another uid and must own them.
    top = checked_path(path)
    if top != root:
        top = f"{root}/{top[len(root) :].lstrip('/').split('/', 1)[0]}"
    sandbox.claim(top)


def _put_archive_through_sandbox(
    sandbox: BaseSandbox, path: str, archive: IO[bytes], settings: ServiceSettings, uid: int, gid: int
) -> None:
    """Every member is recreated by the sandbox's own user (`extract_through_sandbox`). An
    engine's ``put_archive`` writes as root from outside: it cannot write a read-only root or
    see tmpfs mounts (``/tmp``), and it follows symlinks the sandbox made
    (``/workspace/sub -> /etc``), which no check of the archive can see. As the sandbox's user
    the kernel checks every write."""
    checked = checked_path(path)
    safe = rewrite_for_container(archive, uid=uid, gid=gid, **archive_limits(settings))
    try:
        _make_dir(sandbox, checked)
        extract_through_sandbox(sandbox, checked, safe)
    finally:
        safe.close()


def _open_streamed_archive(sandbox: StreamsOutput, path: str, limit: int) -> Callable[[Emit], None]:
    """The tar is made inside the sandbox by ``tar`` (in /proc and /sys by `_ARCHIVE_AS_USER`'s
    program: a pseudo-file as a read gives it) as the sandbox user, not by an engine reading as
    root: it holds what the sandbox may read, no more (``/etc/shadow`` is refused; unreadable
    files in a tree are left out). It streams raw on a channel of its own, bounded by nothing
    but the sandbox's files; a pseudo-file over ``limit`` ends it with ``too_large``."""
    assert isinstance(sandbox, BaseSandbox)
    checked = checked_path(path)
    _check_readable(sandbox, checked)
    parent, name = os.path.split(checked)
    if on_pseudo_filesystem(checked):
        command = _scripts.command(_ARCHIVE_AS_USER, parent or "/", name or ".", str(limit), program("_archive"))
    else:  # GNU tar elsewhere: the faster on trees of small files, and right where sizes are
        command = _scripts.command(_TAR_AS_USER, parent or "/", name or ".")

    def produce(emit: Emit) -> None:
        stream = sandbox.open_output_stream(command)
        sink = ChunkSink(emit)
        try:
            while data := stream.recv(CHUNK):
                sink.write(data)
        finally:
            stream.close()
        status = stream.exit_code()
        if status == _archive.TOO_LARGE:  # a file over the bound, said by its header alone
            sink.flush_all()  # which the bound (`bounded_members`) refuses with its size
            raise ServiceError("too_large", f"the archive of {checked} holds a file over {limit} bytes")
        if status != 0:
            logger.warning("tar of %s exited %s: %s", checked, status, bytes(getattr(stream, "stderr", b""))[:2000])
            raise ServiceError("backend_unavailable", f"the archive of {checked} could not be completed")
        sink.flush_all()

    return produce


def _open_archive_by_command(sandbox: BaseSandbox, path: str, limit: int) -> Callable[[Emit], None]:
    """``tar`` as the sandbox user through the sandbox's own commands, base64 on the way (the
    protocol's output is text): bounded by the service's output ceiling, so an archive larger
    than about three quarters of it answers ``too_large``."""
    checked = checked_path(path)
    _check_readable(sandbox, checked)
    parent, name = os.path.split(checked)
    script = _TAR_AS_USER.replace("exec tar", "tar").replace('-cf - -- "$2"', '-cf - -- "$2" | base64')
    script = script.replace('--ignore-failed-read -- "$2"; s=$?', '--ignore-failed-read -- "$2" | base64; s=$?')
    done = sandbox.execute(_scripts.command(script, parent or "/", name or "."), timeout=300, output_limit=limit)
    _check_answered(done)
    if done.truncated:
        raise ServiceError("too_large", f"the archive of {checked} is larger than this backend can send")
    if done.exit_code != 0:
        logger.warning("tar of %s exited %s", checked, done.exit_code)
        raise ServiceError("backend_unavailable", f"the archive of {checked} could not be completed")
    try:
        data = base64.b64decode(done.output, validate=False)
    except (binascii.Error, ValueError) as exc:
        raise ServiceError("backend_unavailable", f"the archive of {checked} came back garbled") from exc

    def produce(emit: Emit) -> None:
        sink = ChunkSink(emit)
        sink.write(data)
        sink.flush_all()

    return produce


def _make_dir(sandbox: BaseSandbox, path: str) -> None:
    """``mkdir -p`` as the sandbox user, inside the sandbox, and the directory must then be one
    the sandbox user may write: what it may not write to, an archive may not either."""
    made = sandbox.execute(_scripts.command(_WRITABLE_DIR, path), timeout=30)
    _check_answered(made)
    if made.exit_code == 3:
        raise ServiceError("not_a_directory", f"cannot create directory {path}")
    if made.exit_code != 0:
        raise ServiceError("permission_denied", f"{path}: the sandbox may not write there")


def _check_answered(response: Any) -> None:
    """A check that never ran (the sandbox's backend failed) says nothing about the path."""
    if response.exit_code is None:
        logger.warning("a path check did not run: %s %s", response.error, response.message)
        raise ServiceError("backend_unavailable", "the sandbox did not answer; the service log has the request id")


def _check_readable(sandbox: BaseSandbox, path: str) -> None:
    """``path`` exists and the sandbox user may read it."""
    checked = sandbox.execute(_scripts.command(_READABLE, path), timeout=30)
    _check_answered(checked)
    if checked.exit_code == 3:
        raise ServiceError("file_not_found", f"{path}: no such file or directory")
    if checked.exit_code != 0:
        raise ServiceError("permission_denied", f"{path}: the sandbox may not read it")


# ---------------------------------------------------------------------- providers


def provider_for(
    template: Template, settings: ServiceSettings, shared: dict[str, Any] | None = None
) -> Provider[Sandbox]:
    """The provider of one template, as the template makes it. ``shared``: the clients the
    providers of one service share (`ProviderContext.shared`)."""
    context = ProviderContext(
        data_dir=settings.data_dir,
        owner=settings.owner,
        output_limit=settings.max_output_bytes,
        options={"docker_url": settings.docker_url},
        shared={} if shared is None else shared,
    )
    return template.provider(context)


def make_backends(settings: ServiceSettings, docker_client: Any = None) -> dict[str, ProviderBackend]:
    """One backend per template, keyed by the template's name; ``docker_client``: the Docker
    client the templates that need one share (else the first of them makes it)."""
    shared: dict[str, Any] = {} if docker_client is None else {"docker": docker_client}
    return {
        name: ProviderBackend(name, template, provider_for(template, settings, shared), settings)
        for name, template in settings.templates.items()
    }
