"""The chart's snapshot store (`snapshots.persistence`), rendered by the real `helm`: by default a
PersistentVolumeClaim of the cluster's default StorageClass, kept by `helm uninstall`, mounted
read-write at a path of its own whose `store` subdirectory is the service's `snapshot_dir`; a
claim of the user's instead; an emptyDir when persistence is off; and more than one replica only
on a store every replica mounts. Every object validates against the Kubernetes API schemas. That
the service starts on such a volume and a snapshot outlives its pod: test_chart_docker.py."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
from chart_support import FULLNAME, HARDENED, KUBERNETES, NAMESPACE, Render, fail_message, one, render_notes

MOUNT = "/var/lib/sandboxes-snapshots"
CLAIM = f"{FULLNAME}-snapshots"


def _validated(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for obj in objects:
        if obj["kind"] != "ServiceMonitor":  # a CRD: no schema here
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    return objects


def _claims(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == "PersistentVolumeClaim"]


def _pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(objects, "Deployment")["spec"]["template"]["spec"]
    return spec


def _store_volume(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The volume mounted at the store's path, checked to be mounted there read-write, and the
    config's `snapshot_dir` a subdirectory of it."""
    pod = _pod(objects)
    (container,) = pod["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == MOUNT]
    assert not mount.get("readOnly")
    assert "subPath" not in mount
    config = json.loads(one(objects, "ConfigMap", FULLNAME)["data"]["config.json"])
    # a subdirectory the service makes and owns: it sets its store to 0700, which it may not do
    # to a volume's root (root's), and a volume's lost+found is no tenant's directory
    assert PurePosixPath(config["snapshot_dir"]).parent == PurePosixPath(MOUNT)
    assert config["revoked_previews_dir"] == f"{MOUNT}/revoked-previews"  # every replica refuses a revoked token
    assert config["data_dir"] == "/var/lib/sandboxes"
    env = {e["name"] for e in container["env"]}
    assert "SANDBOXES_SNAPSHOT_DIR" not in env  # the config file's is the one
    volume: dict[str, Any] = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    return volume


def _strategy(objects: list[dict[str, Any]]) -> str:
    return str(one(objects, "Deployment")["spec"]["strategy"]["type"])


def test_by_default_the_store_is_a_kept_claim_of_the_default_storage_class(render: Render) -> None:
    objects = _validated(render())
    (claim,) = _claims(objects)
    assert claim["metadata"]["name"] == CLAIM
    assert claim["metadata"]["namespace"] == NAMESPACE
    assert claim["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}  # outlives an uninstall
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}}
    assert "storageClassName" not in claim["spec"]  # the cluster's default class provisions it
    assert _store_volume(objects) == {"name": "snapshots", "persistentVolumeClaim": {"claimName": CLAIM}}
    # the pod's security context is the chart's as before: fsGroup makes the volume the service's
    pod = _pod(objects)
    assert pod["securityContext"]["fsGroup"] == pod["containers"][0]["securityContext"]["runAsGroup"] == 10001
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert "initContainers" not in pod  # nothing runs as root to prepare the volume
    # one replica on a ReadWriteOnce claim: the old pod goes before the new one mounts it
    assert _strategy(objects) == "Recreate"


def test_storage_class_size_and_keep_come_from_values(render: Render) -> None:
    args = ("--set", "snapshots.persistence.storageClassName=fast-ssd", "--set", "snapshots.persistence.size=50Gi")
    (claim,) = _claims(_validated(render(*args, "--set", "snapshots.persistence.keep=false")))
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert "annotations" not in claim["metadata"]  # goes with the release
    # "-": no class at all, for a PersistentVolume made by hand
    (static,) = _claims(_validated(render("--set", "snapshots.persistence.storageClassName=-")))
    assert static["spec"]["storageClassName"] == ""


def test_an_existing_claim_is_mounted_and_none_is_made(render: Render) -> None:
    objects = _validated(render("--set", "snapshots.persistence.existingClaim=team-snapshots"))
    assert not _claims(objects)
    assert _store_volume(objects)["persistentVolumeClaim"] == {"claimName": "team-snapshots"}
    assert _strategy(objects) == "Recreate"  # one replica: its access mode is not known to be RWX
    # the user's claim is taken to be one every replica mounts
    several = _validated(
        render("--set", "snapshots.persistence.existingClaim=team-snapshots", "--set", "replicaCount=3")
    )
    assert one(several, "Deployment")["spec"]["replicas"] == 3
    assert _store_volume(several)["persistentVolumeClaim"] == {"claimName": "team-snapshots"}
    assert _strategy(several) == "RollingUpdate"


def test_without_persistence_the_store_is_an_emptydir_as_before(render: Render) -> None:
    objects = _validated(
        render("--set", "snapshots.persistence.enabled=false", "--set", "snapshots.persistence.size=3Gi")
    )
    assert not _claims(objects)
    assert _store_volume(objects) == {"name": "snapshots", "emptyDir": {"sizeLimit": "3Gi"}}
    assert _strategy(objects) == "RollingUpdate"
    # a replica each: allowed, as before (each keeps its own snapshots, documented)
    assert one(render("--set", "snapshots.persistence.enabled=false", "--set", "replicaCount=2"), "Deployment")


def test_several_replicas_share_a_read_write_many_claim(render: Render) -> None:
    args = ("--set", "replicaCount=2", "--set-json", 'snapshots.persistence.accessModes=["ReadWriteMany"]')
    objects = _validated(render(*args))
    (claim,) = _claims(objects)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert _store_volume(objects)["persistentVolumeClaim"] == {"claimName": CLAIM}
    assert _strategy(objects) == "RollingUpdate"
    hardened = _validated(render("-f", str(HARDENED)))
    (claim,) = _claims(hardened)
    assert (claim["spec"]["storageClassName"], claim["spec"]["accessModes"]) == ("nfs-client", ["ReadWriteMany"])
    # one replica on an RWX claim keeps rolling updates
    single = render("--set-json", 'snapshots.persistence.accessModes=["ReadWriteMany"]')
    assert _strategy(single) == "RollingUpdate"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--set", "replicaCount=2"),
            "replicaCount > 1 needs a snapshot store every replica mounts, and "
            'snapshots.persistence.accessModes is ["ReadWriteOnce"]: set it to [ReadWriteMany]',
        ),
        (
            ("--set", "replicaCount=3", "--set-json", 'snapshots.persistence.accessModes=["ReadWriteOncePod"]'),
            "or set snapshots.persistence.existingClaim to a claim every replica can mount",
        ),
        (("--set", "config.snapshot_dir=/tmp/s"), "config.snapshot_dir is the chart's to set"),
        (("--set", "config.revoked_previews_dir=/tmp/r"), "config.revoked_previews_dir is the chart's to set"),
        (
            ("--set-json", 'snapshots.persistence.accessModes=["ReadOnlyMany"]'),
            "snapshots.persistence.accessModes.0 must be one of the following",
        ),
        (("--set-json", "snapshots.persistence.accessModes=[]"), "accessModes: Array must have at least 1 items"),
        (("--set", "snapshots.persistence.size=lots"), "snapshots.persistence.size"),
        (("--set", "snapshots.persistence.existingClaim=Not_A_Claim"), "existingClaim: Does not match pattern"),
        (("--set", "snapshots.persistence.enable=true"), "Additional property enable is not allowed"),
    ],
)
def test_bad_snapshot_values_fail_with_a_clear_message(helm: Path, args: tuple[str, ...], message: str) -> None:
    assert message in fail_message(helm, *args)


def test_notes_say_where_snapshots_are_kept(helm: Path, tmp_path: Path) -> None:
    kept = render_notes(helm, tmp_path / "default")
    assert f"kept on the claim {CLAIM}, which\nhelm uninstall leaves: kubectl -n {NAMESPACE} delete pvc {CLAIM}" in kept
    theirs = render_notes(helm, tmp_path / "theirs", "--set", "snapshots.persistence.existingClaim=team-snapshots")
    assert "kept on the claim team-snapshots.\n" in theirs
    assert "delete pvc" not in theirs
    lost = render_notes(helm, tmp_path / "off", "--set", "snapshots.persistence.enabled=false")
    assert "WARNING: snapshots.persistence.enabled is false: snapshots and hibernated sandboxes are lost" in lost
    assert "WARNING: snapshots" not in kept
