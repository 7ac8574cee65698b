"""The backends behind the service: how a template becomes a sandbox, how a sandbox is found
again after a restart, destroyed, archived, and how a marked process tree in it is killed.

Everything here blocks (Docker API calls, directory trees); the registry calls it from worker
threads.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import shutil
import stat
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from sandboxes import _kill, _scripts
from sandboxes.base import BaseSandbox
from sandboxes.server.archive import checked_path, extract_local, open_local_archive, rewrite_for_container
from sandboxes.server.errors import ServiceError
from sandboxes.server.extract import extract_through_sandbox
from sandboxes.server.settings import ServiceSettings, Template
from sandboxes.server.store import SandboxState
from sandboxes.server.streams import CHUNK, ChunkSink, Emit

logger = logging.getLogger(__name__)

LABEL_TENANT = "io.sandboxes.tenant"
LABEL_TEMPLATE = "io.sandboxes.template"
LABEL_USER_PREFIX = "io.sandboxes.label."
"""Clients' own labels, carried on the container so a restart without state recovers them."""
MARKER_ENV = _kill.MARKER_ENV
"""Set on every command the service runs, with a token of its own: all its descendants inherit
it, which is how its whole tree is found and killed, even the parts that left its process group
(the backends take the caller's marker as the command's own)."""
ORPHAN_VOLUME_GRACE = 60.0

_KILL_MARKED = _kill.KILL_MARKED_SH + 'kill_marked "$1"\n'

Adopted = tuple[SandboxState, BaseSandbox]


class Backend(abc.ABC):
    name: str

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings

    @abc.abstractmethod
    def create(
        self,
        template_name: str,
        template: Template,
        tenant: str,
        expires_at: float,
        labels: dict[str, str],
        env: dict[str, str],
    ) -> Adopted: ...

    @abc.abstractmethod
    def destroy(self, state: SandboxState, sandbox: BaseSandbox | None) -> None:
        """Remove the sandbox and everything it stored. Idempotent: gone already is fine."""

    @abc.abstractmethod
    def reconcile(self, states: list[SandboxState], now: float) -> list[Adopted]:
        """Compare ``states`` (what the service remembers) with what really exists: return the
        live sandboxes to adopt; destroy the expired and the orphaned."""

    @abc.abstractmethod
    def kill_marked(self, sandbox: BaseSandbox, token: str) -> None:
        """Kill every process of the sandbox carrying ``MARKER_ENV=token``."""

    @abc.abstractmethod
    def open_archive(self, sandbox: BaseSandbox, path: str) -> Callable[[Emit], None]:
        """Validate ``path`` and return the producer of its tar stream."""

    @abc.abstractmethod
    def put_archive(self, sandbox: BaseSandbox, path: str, archive: IO[bytes]) -> None: ...

    def check_ready(self) -> None:  # noqa: B027 - optional hook
        """Raise if the backend cannot create sandboxes right now."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; sandboxes stay (a restarted service adopts them)."""


_WRITABLE_DIR = r"""mkdir -p -- "$1" 2>/dev/null
if [ ! -d "$1" ]; then exit 3; fi
if [ ! -w "$1" ] || [ ! -x "$1" ]; then exit 4; fi
exit 0
"""

_READABLE = r"""if [ ! -e "$1" ] && [ ! -L "$1" ]; then exit 3; fi
if [ ! -r "$1" ]; then exit 4; fi
exit 0
"""


_TAR_AS_USER = r"""if tar --version 2>/dev/null | grep -q GNU; then
  tar -C "$1" -cf - --ignore-failed-read -- "$2"; s=$?
  if [ "$s" -eq 1 ]; then s=0; fi  # GNU: a file changed while it was read
  exit "$s"
fi
exec tar -C "$1" -cf - -- "$2"
"""
"""``tar`` of ``$1/$2`` to stdout; GNU tar leaves out what the user may not read, busybox's fails."""


def _make_dir(sandbox: BaseSandbox, path: str) -> None:
    """``mkdir -p`` as the sandbox user, inside the sandbox, and the directory must then be one
    the sandbox user may write: what it may not write to, an archive may not either (Docker
    extracts as root, through the read-only root's own checks)."""
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


# ---------------------------------------------------------------------- local


class LocalBackend(Backend):
    """Sandboxes as `LocalSandbox` root directories under ``data_dir/local``."""

    name = "local"

    def __init__(self, settings: ServiceSettings) -> None:
        super().__init__(settings)
        self.base = (settings.data_dir / "local").resolve()
        self.base.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base, 0o700)

    def _open(self, sandbox_id: str, template: Template, root: Path, env: dict[str, str]) -> BaseSandbox:
        from sandboxes.local import LocalSandbox, LocalSandboxConfig

        config = LocalSandboxConfig(
            root_dir=root,
            isolation=template.isolation,
            default_timeout=template.default_timeout,
            output_limit=self.settings.max_output_bytes,
            env={**template.env, **env},
            sandbox_id=sandbox_id,
            memory=template.memory_bytes,
            cpus=template.cpus,
        )
        return LocalSandbox(config=config)

    def create(
        self,
        template_name: str,
        template: Template,
        tenant: str,
        expires_at: float,
        labels: dict[str, str],
        env: dict[str, str],
    ) -> Adopted:
        sandbox_id = uuid.uuid4().hex[:16]
        root = self.base / sandbox_id
        root.mkdir(mode=0o755)
        sandbox = self._open(sandbox_id, template, root, env)
        state = SandboxState(
            id=sandbox_id,
            tenant=tenant,
            template=template_name,
            backend=self.name,
            created_at=time.time(),
            expires_at=expires_at,
            cpus=template.cpus,
            memory=template.memory_bytes,
            ref=str(root),
            workdir=str(root),
            labels=dict(labels),
            env=dict(env),
        )
        return state, sandbox

    def destroy(self, state: SandboxState, sandbox: BaseSandbox | None) -> None:
        close = getattr(sandbox, "close", None)
        if close is not None:
            close()
        _remove_tree(Path(state.ref))

    def reconcile(self, states: list[SandboxState], now: float) -> list[Adopted]:
        adopted: list[Adopted] = []
        known = set()
        for state in states:
            root = Path(state.ref)
            if root.parent != self.base:
                logger.warning("state of %s points outside %s; ignoring it", state.id, self.base)
                continue
            known.add(root.name)
            if state.deleting or state.expires_at <= now or not root.is_dir():
                logger.info("reaping local sandbox %s (deleted, expired or gone)", state.id)
                _remove_tree(root)
                continue
            template = self.settings.templates.get(state.template) or Template()
            adopted.append((state, self._open(state.id, template, root, state.env)))
        for entry in self.base.iterdir():
            if entry.name not in known:
                logger.info("reaping orphaned local sandbox directory %s", entry)
                _remove_tree(entry)
        return adopted

    def kill_marked(self, sandbox: BaseSandbox, token: str) -> None:
        # Commands share their sandbox's jail, but the host sees every jail's processes and
        # their environments (the exec helper takes the token as the command's marker).
        _kill.kill_marked(token, MARKER_ENV)

    def _root(self, sandbox: BaseSandbox) -> str:
        return str(getattr(sandbox, "root"))  # noqa: B009 - LocalSandbox's root

    def open_archive(self, sandbox: BaseSandbox, path: str) -> Callable[[Emit], None]:
        uid, gid = _local_ids(sandbox)
        return open_local_archive(self._root(sandbox), path, uid=uid, gid=gid)

    def put_archive(self, sandbox: BaseSandbox, path: str, archive: IO[bytes]) -> None:
        root = self._root(sandbox)
        extract_local(root, path, archive, **archive_limits(self.settings))
        # Extracted by the service; a root-started jail runs as another uid and must own them.
        top = checked_path(path)
        if top != root:
            top = f"{root}/{top[len(root) :].lstrip('/').split('/', 1)[0]}"
        claim = getattr(sandbox, "claim", None)
        if claim is not None:
            claim(top)


def archive_limits(settings: ServiceSettings) -> dict[str, int]:
    """The bounds on what an uploaded archive may be, as `sandboxes.server.archive` takes them."""
    return {
        "max_bytes": settings.max_archive_bytes,
        "max_members": settings.max_archive_members,
        "max_expansion": settings.max_archive_expansion,
    }


def _local_ids(sandbox: BaseSandbox) -> tuple[int, int]:
    config = getattr(sandbox, "config", None)
    return int(getattr(config, "uid", 1000)), int(getattr(config, "gid", 1000))


def _remove_tree(path: Path) -> None:
    """``rm -rf`` that also gets through directories a sandbox made unreadable (chmod 000)."""

    def unlock(function: Callable[..., Any], name: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(name), stat.S_IRWXU)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, stat.S_IRWXU)
        with contextlib.suppress(FileNotFoundError):
            if function in (os.rmdir, os.unlink):
                function(name)
            else:  # could not open or list it: retry the whole subtree now that it is ours again
                shutil.rmtree(name, ignore_errors=True)

    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        shutil.rmtree(path, onerror=unlock)


# ---------------------------------------------------------------------- docker


class DockerBackend(Backend):
    """Sandboxes as containers labelled with this service's owner id and the tenant."""

    name = "docker"

    def __init__(self, settings: ServiceSettings, client: Any = None) -> None:
        super().__init__(settings)
        self._client = client
        self._owns_client = client is None

    @property
    def client(self) -> Any:
        if self._client is None:
            import docker

            url = self.settings.docker_url
            self._client = docker.DockerClient(base_url=url) if url else docker.from_env()
        return self._client

    def _config(self, template: Template, labels: dict[str, str], ttl: float | None, env: dict[str, str]) -> Any:
        from sandboxes.docker import DockerSandboxConfig

        return DockerSandboxConfig(
            image=template.image,
            cpus=template.cpus,
            memory=template.memory,
            disk=template.disk,
            env={**template.env, **env},
            labels=labels,
            ttl=ttl,
            owner=self.settings.owner,
            default_timeout=template.default_timeout,
            output_limit=self.settings.max_output_bytes,
        )

    def create(
        self,
        template_name: str,
        template: Template,
        tenant: str,
        expires_at: float,
        labels: dict[str, str],
        env: dict[str, str],
    ) -> Adopted:
        from sandboxes.docker import LABEL_SANDBOX, DockerSandbox
        from sandboxes.docker._containers import create_container

        docker_labels = {**template.labels, LABEL_TENANT: tenant, LABEL_TEMPLATE: template_name}
        docker_labels.update({LABEL_USER_PREFIX + key: value for key, value in labels.items()})
        config = self._config(template, docker_labels, max(1.0, expires_at - time.time()), env)
        container = create_container(self.client, config)
        sandbox = DockerSandbox(container, self.client, config)
        state = SandboxState(
            id=container.labels[LABEL_SANDBOX],
            tenant=tenant,
            template=template_name,
            backend=self.name,
            created_at=time.time(),
            expires_at=expires_at,
            cpus=template.cpus,
            memory=template.memory_bytes,
            ref=str(container.id),
            workdir=config.workdir,
            labels=dict(labels),
            env=dict(env),
        )
        return state, sandbox

    def destroy(self, state: SandboxState, sandbox: BaseSandbox | None) -> None:
        from sandboxes.docker._containers import remove_sandbox

        close = getattr(sandbox, "close", None)
        if close is not None:
            close()
        remove_sandbox(self.client, state.ref)

    def reconcile(self, states: list[SandboxState], now: float) -> list[Adopted]:
        from sandboxes.docker import LABEL_MANAGED, LABEL_OWNER, LABEL_SANDBOX, DockerSandbox
        from sandboxes.docker._containers import remove_sandbox

        remembered = {state.id: state for state in states}
        selector = [f"{LABEL_MANAGED}=true", f"{LABEL_OWNER}={self.settings.owner}"]
        adopted: list[Adopted] = []
        live: set[str] = set()
        for container in self.client.containers.list(all=True, filters={"label": selector}):
            labels: dict[str, str] = container.labels or {}
            sandbox_id = labels.get(LABEL_SANDBOX, "")
            state = remembered.get(sandbox_id) or _state_from_labels(container, self.name)
            if state is None or state.deleting or state.expires_at <= now:
                logger.info("reaping container %s (deleted, expired or not a tenant's)", container.id[:12])
                remove_sandbox(self.client, container.id)
                continue
            if container.status != "running" and _workspace_in_memory(self.client, container):
                logger.warning(
                    "reaping stopped container %s: its workspace was in memory (disk limit) and is gone",
                    container.id[:12],
                )
                remove_sandbox(self.client, container.id)
                continue
            if container.status != "running":
                try:
                    container.start()
                except Exception as exc:
                    logger.warning("cannot restart container %s (%s); reaping it", container.id[:12], exc)
                    remove_sandbox(self.client, container.id)
                    continue
            template = self.settings.templates.get(state.template) or Template(backend="docker")
            config = self._config(template, {}, None, state.env)
            adopted.append((state, DockerSandbox(container, self.client, config, owned=False)))
            live.add(sandbox_id)
        self._reap_orphan_volumes(live, now)
        return adopted

    def _reap_orphan_volumes(self, live: set[str], now: float) -> None:
        from sandboxes.docker import LABEL_MANAGED, LABEL_OWNER, LABEL_SANDBOX

        selector = [f"{LABEL_MANAGED}=true", f"{LABEL_OWNER}={self.settings.owner}"]
        for volume in self.client.volumes.list(filters={"label": selector}):
            attrs = volume.attrs or {}
            if (attrs.get("Labels") or {}).get(LABEL_SANDBOX, "") in live:
                continue
            if _created(attrs.get("CreatedAt")) > now - ORPHAN_VOLUME_GRACE:
                continue  # its container may be being created right now
            with contextlib.suppress(Exception):
                volume.remove(force=True)
                logger.info("reaped orphaned workspace volume %s", volume.name)

    def kill_marked(self, sandbox: BaseSandbox, token: str) -> None:
        kill_tagged = getattr(sandbox, "kill_tagged", None)  # DockerSandbox: by what it was given
        if kill_tagged is not None:
            kill_tagged(MARKER_ENV, token)
        sandbox.execute(_scripts.command(_KILL_MARKED, token), timeout=30)

    def open_archive(self, sandbox: BaseSandbox, path: str) -> Callable[[Emit], None]:
        """The tar is made inside the container by ``tar`` running as the sandbox user, not by
        the daemon (which reads as root): the archive holds what the sandbox may read, no more
        (``/etc/shadow`` is refused; unreadable files inside a tree are left out)."""
        checked = checked_path(path)
        _check_readable(sandbox, checked)
        parent, name = os.path.split(checked)
        command = ["/bin/sh", "-c", _TAR_AS_USER, "sh", parent or "/", name or "."]
        container = getattr(sandbox, "container")  # noqa: B009
        user = getattr(sandbox, "config").user  # noqa: B009 - DockerSandboxConfig
        api = self.client.api

        def produce(emit: Emit) -> None:
            from sandboxes.docker._io import ExecSocket

            exec_id = api.exec_create(container.id, command, user=user, stdout=True, stderr=True)["Id"]
            stream = ExecSocket(api.exec_start(exec_id, socket=True))
            sink = ChunkSink(emit)
            try:
                while data := stream.recv(CHUNK):
                    sink.write(data)
                sink.flush_all()
            finally:
                stream.close()
            status = api.exec_inspect(exec_id).get("ExitCode")
            if status != 0:
                logger.warning("tar of %s exited %s: %s", checked, status, bytes(stream.stderr[:2000]))
                raise ServiceError("backend_unavailable", f"the archive of {checked} could not be completed")

        return produce

    def put_archive(self, sandbox: BaseSandbox, path: str, archive: IO[bytes]) -> None:
        """Every member is recreated by the sandbox's own user (`extract_through_sandbox`), in
        the workspace too. The engine's ``put_archive`` writes as root from outside: it cannot
        write the read-only root or see tmpfs mounts (``/tmp``), and it followed symlinks the
        sandbox had made (``/workspace/sub -> /etc``, then a clean member ``sub/evil`` wrote
        ``/etc/evil`` into the read-only root), which no check of the archive can see. As the
        sandbox's user the kernel checks every write."""
        checked = checked_path(path)
        config = getattr(sandbox, "config")  # noqa: B009 - DockerSandboxConfig
        uid, gid = config.uid_gid
        safe = rewrite_for_container(archive, uid=uid, gid=gid, **archive_limits(self.settings))
        try:
            _make_dir(sandbox, checked)
            extract_through_sandbox(sandbox, checked, safe)
        finally:
            safe.close()

    def check_ready(self) -> None:
        self.client.ping()

    def close(self) -> None:
        if self._client is not None and self._owns_client:
            with contextlib.suppress(Exception):
                self._client.close()


def _workspace_in_memory(client: Any, container: Any) -> bool:
    """Whether the container's workspace is a tmpfs volume (a template with ``disk``): stopped,
    it lost its files, and restarting it would hand its tenant an empty workspace as if nothing
    happened."""
    import docker.errors

    for mount in container.attrs.get("Mounts") or []:
        if mount.get("Type") != "volume" or not mount.get("Name"):
            continue
        try:
            options = client.volumes.get(mount["Name"]).attrs.get("Options") or {}
        except docker.errors.NotFound:  # a volume gone is no workspace to keep
            continue
        if options.get("type") == "tmpfs":
            return True
    return False


def _state_from_labels(container: Any, backend: str) -> SandboxState | None:
    """What a container says about itself, for one the state files do not know (a crash
    between its creation and the state's write)."""
    from sandboxes.docker import LABEL_EXPIRES, LABEL_SANDBOX

    labels: dict[str, str] = container.labels or {}
    tenant, sandbox_id = labels.get(LABEL_TENANT), labels.get(LABEL_SANDBOX)
    if not tenant or not sandbox_id:
        return None
    try:
        expires_at = float(labels[LABEL_EXPIRES])
    except (KeyError, ValueError):
        return None
    host = container.attrs.get("HostConfig") or {}
    return SandboxState(
        id=sandbox_id,
        tenant=tenant,
        template=labels.get(LABEL_TEMPLATE, "default"),
        backend=backend,
        created_at=_created(container.attrs.get("Created")),
        expires_at=expires_at,
        cpus=(host.get("NanoCpus") or 0) / 1e9,
        memory=int(host.get("Memory") or 0),
        ref=str(container.id),
        workdir=(container.attrs.get("Config") or {}).get("WorkingDir") or "/workspace",
        labels={k[len(LABEL_USER_PREFIX) :]: v for k, v in labels.items() if k.startswith(LABEL_USER_PREFIX)},
    )


def _created(value: Any) -> float:
    try:
        text = str(value).replace("Z", "+00:00")
        if "." in text:  # Docker gives nanoseconds; fromisoformat takes at most microseconds
            head, _, tail = text.partition(".")
            digits = "".join(ch for ch in tail if ch.isdigit())
            zone = tail[len(digits) :]
            text = f"{head}.{digits[:6]}{zone}"
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return 0.0


def make_backends(settings: ServiceSettings, docker_client: Any = None) -> dict[str, Backend]:
    """The backends the templates use (the local one always: it costs nothing)."""
    backends: dict[str, Backend] = {"local": LocalBackend(settings)}
    if any(template.backend == "docker" for template in settings.templates.values()):
        backends["docker"] = DockerBackend(settings, docker_client)
    return backends
