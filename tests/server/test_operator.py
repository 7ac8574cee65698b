"""What a tenant learns of the service beside its sandboxes: the templates, and for an
operator's key only, every tenant's usage (`sandboxes.server.operator`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from service_harness import Running, create, running, settings_for


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with running(settings_for(tmp_path_factory.mktemp("operator"), operators=["alice"])) as svc:
        yield svc


def test_every_tenant_sees_the_templates(service: Running) -> None:
    with service.client("bob") as bob:
        templates = bob.get("/v1/templates").json()["templates"]
    assert {item["name"]: item["backend"] for item in templates} == {"default": "local", "big": "local"}
    assert next(item for item in templates if item["name"] == "big")["cpus"] == 4


def test_only_an_operator_sees_every_tenants_usage(service: Running) -> None:
    with service.client("bob") as bob, service.client("alice") as alice:
        refused = bob.get("/v1/operator/overview")
        assert refused.status_code == 403
        assert refused.json()["error"] == "permission_denied"
        made = create(bob)
        try:
            overview = alice.get("/v1/operator/overview").json()
        finally:
            bob.delete(f"/v1/sandboxes/{made['id']}")
    usage = {item["tenant"]: item for item in overview["tenants"]}
    assert usage["bob"]["sandboxes"] == 1
    assert usage["alice"]["sandboxes"] == 0
    assert usage["bob"]["max_sandboxes"] == 10
    assert overview["health"]["status"] == "ready"
