"""Tenants' volumes through the service with a ``kubernetes`` template: each volume a
PersistentVolumeClaim of the fake API server (a FAKE, `fake_apiserver`: a claim's storage is a
Docker volume of its node), mounted into pods; the same tests as the local jail's and Docker's
(`tests/server/test_service_volumes.py`)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
from fake_cluster import fake_template
from service_harness import Running, running, settings_for
from test_service_volumes import (  # the same tests, against this module's service
    test_a_mounted_volume_is_not_deleted_and_the_quota_holds,
    test_another_tenant_can_neither_see_nor_mount_nor_delete_it,
    test_files_outlive_the_sandbox_that_wrote_them,
    test_two_sandboxes_share_one_volume_and_a_read_only_mount_refuses_writes,
)

from sandboxes.kubernetes import KubernetesTemplate

__all__ = [
    "test_a_mounted_volume_is_not_deleted_and_the_quota_holds",
    "test_another_tenant_can_neither_see_nor_mount_nor_delete_it",
    "test_files_outlive_the_sandbox_that_wrote_them",
    "test_two_sandboxes_share_one_volume_and_a_read_only_mount_refuses_writes",
]


@pytest.fixture(scope="module")
def service(fake_kubeconfig: Path, runtime_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    template = KubernetesTemplate.model_validate(fake_template(fake_kubeconfig, runtime_image, default_timeout=30))
    owner = f"k8s-vol-{uuid.uuid4().hex[:6]}"
    with running(
        settings_for(tmp_path_factory.mktemp("k8s-volumes"), owner=owner, templates={"default": template})
    ) as svc:
        yield svc
