"""Tenants' volumes on Docker (`sandboxes.lifecycle.VolumeProvider`): named volumes of the
``local`` driver, on the engine's disk, labelled as the provider's containers are (managed,
owner, the template's labels), handed to the sandboxes' user once at creation by a one-shot
container (a new named volume is root's), and mounted by `create_container`. The engine
refuses to remove a volume a container still uses: `VolumeInUse`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandboxes.docker.config import LABEL_MANAGED, LABEL_OWNER, DockerSandboxConfig
from sandboxes.lifecycle import VolumeInUse

__all__ = ["VOLUME_PREFIX", "create_volume", "remove_volume"]

VOLUME_PREFIX = "sandboxes-vol-"


def create_volume(client: Any, template: DockerSandboxConfig, name: str, labels: Mapping[str, str]) -> str:
    """The named volume ``VOLUME_PREFIX + name``, made if missing, owned by the sandboxes' user."""
    import docker.errors

    ref = VOLUME_PREFIX + name
    mine = {**template.labels, **labels, LABEL_MANAGED: "true", LABEL_OWNER: template.owner}
    try:
        volume = client.volumes.get(ref)
    except docker.errors.NotFound:
        volume = client.volumes.create(name=ref, labels=mine, driver="local")
    if (volume.attrs.get("Labels") or {}).get(LABEL_OWNER) != template.owner:
        raise RuntimeError(f"docker volume {ref!r} exists and is not this owner's")
    uid, gid = template.uid_gid
    client.containers.run(
        template.image,
        ["chown", f"{uid}:{gid}", "/volume"],
        user="0:0",
        remove=True,
        network_mode="none",
        cap_drop=["ALL"],
        cap_add=["CHOWN"],
        security_opt=["no-new-privileges"],
        labels=dict(template.labels),
        volumes={ref: {"bind": "/volume", "mode": "rw"}},
    )
    return str(ref)


def remove_volume(client: Any, template: DockerSandboxConfig, ref: str) -> None:
    """Remove this owner's volume ``ref``; gone is fine; `VolumeInUse` while a container has it."""
    import docker.errors

    try:
        volume = client.volumes.get(ref)
    except docker.errors.NotFound:
        return
    if (volume.attrs.get("Labels") or {}).get(LABEL_OWNER) != template.owner:
        raise LookupError(f"docker volume {ref!r} is not this owner's")
    try:
        volume.remove()
    except docker.errors.NotFound:
        return
    except docker.errors.APIError as exc:
        if exc.status_code == 409:
            raise VolumeInUse(f"docker volume {ref!r} is in use") from exc
        raise
