"""Docker containers and volumes for sandboxes: creating one with the secure defaults,
removing one with its workspace, and reading the labels that record ownership and expiry.

The one place both `DockerSandbox` (``create``/``destroy``) and `DockerProvider` (pools and
sweeps) and the service go through, so the import graph runs one way: config < containers <
sandbox < provider."""

from __future__ import annotations

import contextlib
import logging
import math
import re
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from sandboxes.docker.config import (
    LABEL_EXPIRES,
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_SANDBOX,
    DockerSandboxConfig,
    parse_size,
)
from sandboxes.lifecycle import SandboxNameTaken, label_expiry

logger = logging.getLogger(__name__)

LABEL_POOL = "io.sandboxes.pool"
"""Id of the provider whose pool created the container (acquired ones keep it: labels are fixed)."""

VOLUME_PREFIX = "sandboxes-ws-"


def sandbox_labels(config: DockerSandboxConfig, sandbox_id: str) -> dict[str, str]:
    labels = {**config.labels, LABEL_MANAGED: "true", LABEL_OWNER: config.owner, LABEL_SANDBOX: sandbox_id}
    if config.ttl is not None:  # rounded up: a sandbox lives at least its ttl, never swept sooner
        labels[LABEL_EXPIRES] = str(math.ceil(time.time() + config.ttl))
    return labels


def slim_container(container: Any) -> Any:
    """The same container as a model holding only its id, name, labels and state, for a
    sandbox that holds it as long as it lives (its full inspection, mounts, host config and
    network settings, is not read again; `reload` fetches it whole)."""
    attrs = container.attrs
    state = attrs.get("State")
    slim = {
        "Id": attrs["Id"],
        "Name": attrs.get("Name"),
        "Config": {"Labels": (attrs.get("Config") or {}).get("Labels") or {}},
        "State": {"Status": state.get("Status")} if isinstance(state, dict) else state,
    }
    return type(container)(attrs=slim, client=container.client, collection=container.collection)


def create_container(client: Any, config: DockerSandboxConfig, name: str | None = None) -> Any:
    """Start a container with the secure defaults: no network, non-root, no capabilities,
    no-new-privileges, read-only root with a size-limited workspace volume and a tmpfs ``/tmp``,
    a bounded log, limits. ``name``: the sandbox's id, which the engine refuses twice
    (`SandboxNameTaken`); else a fresh one."""
    import docker.errors
    from docker.types import LogConfig

    sandbox_id = name or uuid.uuid4().hex[:16]
    labels = sandbox_labels(config, sandbox_id)
    volume = client.volumes.create(
        name=f"{VOLUME_PREFIX}{sandbox_id}", labels=labels, driver="local", driver_opts=workspace_options(config)
    )
    try:
        container = client.containers.create(
            config.image,
            command=["sleep", "infinity"],
            name=container_name(sandbox_id),
            detach=True,
            init=True,
            user=config.user,
            working_dir=config.workdir,
            environment=config.env,
            labels=labels,
            network_mode="bridge" if config.network else "none",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            read_only=config.read_only_root,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={config.tmp_size},mode=1777"},
            volumes={volume.name: {"bind": config.workdir, "mode": "rw"}},
            mounts=mounted(client, config),
            mem_limit=memory_limit(config),
            memswap_limit=memory_limit(config),
            nano_cpus=int(config.cpus * 1e9),
            pids_limit=config.pids,
            log_config=LogConfig(type="json-file", config={"max-size": config.log_size, "max-file": "1"}),
        )
    except docker.errors.APIError as exc:
        if name is not None and exc.status_code == 409:  # the volume is the winner's: keep it
            raise SandboxNameTaken(f"a container named {container_name(sandbox_id)!r} exists") from exc
        with contextlib.suppress(Exception):
            volume.remove(force=True)
        raise
    except Exception:
        with contextlib.suppress(Exception):
            volume.remove(force=True)
        raise
    _start_or_remove(container, volume)
    return container


def _start_or_remove(container: Any, volume: Any) -> None:
    """Start ``container``; if that fails (a runtime refusing under load, an answer lost),
    remove it and its workspace before raising: a container made but never started is no
    sandbox anyone was told about, and nothing else would ever remove it."""
    try:
        container.start()
    except BaseException:
        with contextlib.suppress(Exception):
            container.remove(force=True, v=True)
        with contextlib.suppress(Exception):
            volume.remove(force=True)
        raise


def mounted(client: Any, config: DockerSandboxConfig) -> list[Any]:
    """The engine's mounts of the config's named volumes (structured: a path may hold a colon),
    each of which must exist: the engine would make a missing one, empty and unlabelled."""
    from docker.types import Mount as EngineMount

    for mount in config.mounts:
        client.volumes.get(mount.volume)  # NotFound if it went
    return [EngineMount(m.path, m.volume, type="volume", read_only=m.read_only) for m in config.mounts]


def workspace_options(config: DockerSandboxConfig) -> dict[str, str]:
    """The workspace volume's ``local`` driver options: with ``disk``, a tmpfs of that size and
    ``disk_files`` inodes, owned by the sandbox's user; without, a plain directory on the
    engine's disk (no options).

    Why tmpfs: the engine's storage (overlay2 on ext4 here, the common case) cannot limit a
    volume's or a container's size (``--storage-opt size`` needs xfs project quotas), and a loop
    image needs root on the host. A tmpfs volume is mounted by the engine itself, so its limit
    holds for the archive API's writes too. The price: the files live in RAM, charged to the
    memory cgroup of whoever writes them (the container, hence `memory_limit`), and they are gone
    when the container stops; a service restart does not stop containers, so adopted sandboxes
    keep their files, but an engine restart or a host reboot empties their workspaces."""
    if config.disk is None:
        return {}
    uid, gid = config.uid_gid
    size = parse_size(config.disk)
    options = f"size={size},nr_inodes={config.disk_files},uid={uid},gid={gid},mode=0755,nosuid,nodev"
    return {"type": "tmpfs", "device": "tmpfs", "o": options}


def memory_limit(config: DockerSandboxConfig) -> int:
    """The container's memory cgroup: ``memory`` for its processes plus ``disk`` for a tmpfs
    workspace's files, which are charged to it (so a full workspace answers ``no_space``
    instead of the out-of-memory killer)."""
    return parse_size(config.memory) + (parse_size(config.disk) if config.disk is not None else 0)


_CHANGING = tuple(threading.RLock() for _ in range(64))


@contextlib.contextmanager
def changing(container_id: str) -> Iterator[None]:
    """Held while this process renames or removes the container of full id ``container_id``
    (reentrant: a sweep holds it from its last look to the removal): never both at once, since
    the engine, renaming a container it is removing, can keep a ghost of it listed ("Removal In
    Progress") that no call removes until the engine restarts."""
    with _CHANGING[hash(container_id) % len(_CHANGING)]:
        yield


def remove_sandbox(client: Any, container_id: str) -> None:
    """Remove a container and its workspace volume. Missing is fine; other errors surface."""
    import docker.errors

    volume_name = None
    try:
        container = client.containers.get(container_id)
        sandbox_id = (container.labels or {}).get(LABEL_SANDBOX)
        volume_name = f"{VOLUME_PREFIX}{sandbox_id}" if sandbox_id else None
        with changing(container.id):
            container.remove(force=True, v=True)
    except docker.errors.NotFound:
        pass
    if volume_name is not None:
        with contextlib.suppress(docker.errors.NotFound):
            client.volumes.get(volume_name).remove(force=True)


_RENAMED_EXPIRY = re.compile(r"\.expires-(\d{1,12})$")


def container_name(sandbox_id: str, expires_at: float | None = None) -> str:
    """``sandboxes-<id>``, and once its expiry moved, ``sandboxes-<id>.expires-<unix seconds>``:
    a container's labels are fixed at creation, its name is the one thing about it the engine
    lets us change and lists with it, so a renewed expiry lives there (`recorded_expiry`)."""
    name = f"sandboxes-{sandbox_id}"
    return name if expires_at is None else f"{name}.expires-{math.ceil(expires_at)}"


def recorded_expiry(attrs: dict[str, Any]) -> float | None:
    """A container's expiry: its name's, when renewed (`container_name`), else its label's.
    ``attrs`` from a list (``Names``) or an inspect (``Name``)."""
    names = attrs.get("Names") or [attrs.get("Name") or ""]
    for name in names:
        match = _RENAMED_EXPIRY.search(str(name))
        if match is not None:
            return float(match.group(1))
    labels: dict[str, str] = attrs.get("Labels") or (attrs.get("Config") or {}).get("Labels") or {}
    return label_expiry(labels, LABEL_EXPIRES, logger)


def expired(attrs: dict[str, Any], now: float) -> bool:
    expires_at = recorded_expiry(attrs)
    return expires_at is not None and expires_at < now


def created_at(attrs: dict[str, Any]) -> float:
    """A volume's creation time; unreadable counts as long ago (Docker refuses to remove a
    volume still mounted, so the grace is only a courtesy to a creation in progress)."""
    try:
        return datetime.fromisoformat(str(attrs["CreatedAt"]).replace("Z", "+00:00")).timestamp()
    except (KeyError, ValueError):
        return 0.0


def workspace_in_memory(client: Any, container: Any) -> bool:
    """Whether the container's workspace is a tmpfs volume (a template with ``disk``), whose
    files are gone once the container stopped."""
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
