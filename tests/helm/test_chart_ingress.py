"""The chart's optional Ingress (`ingress.*`), rendered by the real `helm`: off by default; on,
one Ingress to the Service for the API's hosts and, with `ingress.previews.domain`, a
`*.<domain>` rule for preview URLs by Host, which the service routes itself once its
`preview_domain` is that domain (set from the same value). Every object validates against the
Kubernetes API schemas; a misspelt domain or a second, different preview domain fails at render
time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from chart_support import CHART, FULLNAME, KUBERNETES, NAMESPACE, RELEASE, Render, one, run_helm

from sandboxes.server.settings import ServiceSettings

DOMAIN = "preview.example.com"
ON: dict[str, Any] = {
    "ingress.enabled": True,
    "ingress.className": "nginx",
    "ingress.hosts": ["api.example.com"],
    "ingress.tls": [{"hosts": ["api.example.com"], "secretName": "api-tls"}],
    "ingress.annotations": {"nginx.ingress.kubernetes.io/proxy-buffering": "off"},
    "ingress.previews.domain": DOMAIN,
    "ingress.previews.tlsSecretName": "preview-wildcard-tls",
}


def _backends(ingress: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (rule.get("host", ""), path["backend"]["service"])
        for rule in ingress["spec"]["rules"]
        for path in rule["http"]["paths"]
        if path["path"] == "/" and path["pathType"] == "Prefix"
    ]


def test_there_is_no_ingress_by_default(render: Render) -> None:
    objects = render()
    assert not [o for o in objects if o["kind"] == "Ingress"]
    assert "preview_domain" not in json.loads(one(objects, "ConfigMap", FULLNAME)["data"]["config.json"])


def test_the_ingress_routes_the_api_and_the_preview_domain_to_the_service(render: Render) -> None:
    objects = render(values=ON)
    ingress = one(objects, "Ingress", FULLNAME)
    assert kubernetes_validate.validate(ingress, KUBERNETES, strict=True) == "1.31"
    assert kubernetes_validate.validate(ingress, "1.25.0", strict=True) == "1.25"
    service = one(objects, "Service", FULLNAME)
    assert [port["name"] for port in service["spec"]["ports"]] == ["http"]
    to_service = {"name": FULLNAME, "port": {"name": "http"}}
    assert _backends(ingress) == [("api.example.com", to_service), (f"*.{DOMAIN}", to_service)]
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["metadata"]["annotations"] == ON["ingress.annotations"]
    assert ingress["spec"]["tls"] == [
        {"hosts": ["api.example.com"], "secretName": "api-tls"},
        {"hosts": [f"*.{DOMAIN}"], "secretName": "preview-wildcard-tls"},
    ]
    config = json.loads(one(objects, "ConfigMap", FULLNAME)["data"]["config.json"])
    assert config["preview_domain"] == DOMAIN  # the Host the service routes previews by
    assert ServiceSettings.model_validate({"preview_domain": config["preview_domain"]}).preview_domain == DOMAIN


def test_an_ingress_without_hosts_takes_any_host_and_no_preview_rule(render: Render) -> None:
    objects = render(values={"ingress.enabled": True})
    ingress = one(objects, "Ingress", FULLNAME)
    assert kubernetes_validate.validate(ingress, KUBERNETES, strict=True) == "1.31"
    assert _backends(ingress) == [("", {"name": FULLNAME, "port": {"name": "http"}})]
    assert {"tls", "ingressClassName"}.isdisjoint(ingress["spec"])
    assert "preview_domain" not in json.loads(one(objects, "ConfigMap", FULLNAME)["data"]["config.json"])


def test_helm_lint_strict_passes_with_the_ingress(helm: Path) -> None:
    args = [arg for key, value in ON.items() for arg in ("--set-json", f"{key}={json.dumps(value)}")]
    done = run_helm(helm, "lint", "--strict", str(CHART), *args)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"ingress.previews.domain": "*.preview.example.com"}, "ingress.previews.domain"),
        ({"ingress.previews.domain": "Preview.Example"}, "ingress.previews.domain"),
        ({"ingress.hosts": ["api example"]}, "ingress.hosts"),
        ({"ingress.tls": [{"hosts": ["a.example"]}]}, "secretName"),
        ({"ingress.previews.domain": DOMAIN, "config.preview_domain": "other.example"}, "differs from"),
    ],
)
def test_bad_ingress_values_fail_naming_them(helm: Path, values: dict[str, Any], message: str) -> None:
    args = ["--set", "ingress.enabled=true"]
    args += [arg for key, value in values.items() for arg in ("--set-json", f"{key}={json.dumps(value)}")]
    done = run_helm(helm, "template", RELEASE, str(CHART), "-n", NAMESPACE, *args)
    assert done.returncode != 0, done.stdout[:2000]
    assert message in done.stderr
