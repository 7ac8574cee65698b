"""`DockerProvider`: creates Docker sandboxes from a template, and removes them by label.

Every container and workspace volume carries ``io.sandboxes.*`` labels (managed, owner,
sandbox id, expiry), so whatever a crash leaves behind can be found and reaped later.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from typing import Any

from sandboxes.docker import (
    LABEL_EXPIRES,
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_SANDBOX,
    DockerSandbox,
    DockerSandboxConfig,
)

logger = logging.getLogger(__name__)


def sandbox_labels(config: DockerSandboxConfig, sandbox_id: str) -> dict[str, str]:
    labels = {**config.labels, LABEL_MANAGED: "true", LABEL_OWNER: config.owner, LABEL_SANDBOX: sandbox_id}
    if config.ttl is not None:
        labels[LABEL_EXPIRES] = str(int(time.time() + config.ttl))
    return labels


def create_container(client: Any, config: DockerSandboxConfig) -> Any:
    """Start a container with the secure defaults: no network, non-root, no capabilities,
    no-new-privileges, read-only root with a workspace volume and a tmpfs ``/tmp``, limits."""
    sandbox_id = uuid.uuid4().hex[:16]
    labels = sandbox_labels(config, sandbox_id)
    volume = client.volumes.create(name=f"sandboxes-ws-{sandbox_id}", labels=labels)
    try:
        return client.containers.run(
            config.image,
            command=["sleep", "infinity"],
            name=f"sandboxes-{sandbox_id}",
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
            mem_limit=config.memory,
            memswap_limit=config.memory,
            nano_cpus=int(config.cpus * 1e9),
            pids_limit=config.pids,
        )
    except Exception:
        with contextlib.suppress(Exception):
            volume.remove(force=True)
        raise


def remove_sandbox(client: Any, container_id: str) -> None:
    """Remove a container and its workspace volume. Missing is fine; other errors surface."""
    import docker.errors

    volume_name = None
    try:
        container = client.containers.get(container_id)
        sandbox_id = (container.labels or {}).get(LABEL_SANDBOX)
        volume_name = f"sandboxes-ws-{sandbox_id}" if sandbox_id else None
        container.remove(force=True, v=True)
    except docker.errors.NotFound:
        pass
    if volume_name is not None:
        with contextlib.suppress(docker.errors.NotFound):
            client.volumes.get(volume_name).remove(force=True)


class DockerProvider:
    """Creates `DockerSandbox` instances from one template."""

    def __init__(self, template: DockerSandboxConfig | None = None, *, client: Any = None) -> None:
        import docker

        self.template = template or DockerSandboxConfig()
        self.client = client or docker.from_env()

    def create(self) -> DockerSandbox:
        container = create_container(self.client, self.template)
        return DockerSandbox(container, self.client, self.template)

    def attach(self, container_id: str) -> DockerSandbox:
        return DockerSandbox(self.client.containers.get(container_id), self.client, self.template, owned=False)
