"""The chart's signing secrets (`signingSecrets`), rendered by the real `helm`: one Secret of
random secrets that every replica's preview and E2B tokens are signed with (so a token one pod
signed is accepted by every other and by the pods that replace it), or a Secret of the user's."""

from __future__ import annotations

import base64
from typing import Any

import kubernetes_validate
from chart_support import FULLNAME, KUBERNETES, NAMESPACE, Render, one

SECRET = f"{FULLNAME}-signing"
KEYS = {"SANDBOXES_PREVIEW_TOKEN_SECRET": "preview-token-secret", "SANDBOXES_E2B_TOKEN_SECRET": "e2b-token-secret"}


def _env(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in container["env"]}


def _referenced(objects: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """Each signing variable's Secret and key."""
    env = _env(objects)
    return {name: (ref["name"], ref["key"]) for name in KEYS for ref in [env[name]["valueFrom"]["secretKeyRef"]]}


def test_every_replica_signs_with_the_charts_one_secret(render: Render) -> None:
    objects = render("--set", "replicaCount=1")
    secret = one(objects, "Secret", SECRET)
    kubernetes_validate.validate(secret, KUBERNETES, strict=True)
    assert secret["metadata"]["namespace"] == NAMESPACE
    values = {key: base64.b64decode(secret["data"][key]).decode() for key in KEYS.values()}
    assert all(len(value) == 64 and value.isalnum() for value in values.values())
    assert values["preview-token-secret"] != values["e2b-token-secret"]
    assert _referenced(objects) == {name: (SECRET, key) for name, key in KEYS.items()}


def test_each_install_gets_secrets_of_its_own(render: Render) -> None:
    first, second = (one(render(), "Secret", SECRET)["data"] for _ in range(2))
    assert first != second  # random, not a value shipped in the chart


def test_a_secret_of_the_users_replaces_the_charts(render: Render) -> None:
    objects = render("--set", "signingSecrets.existingSecret=my-signing")
    assert not [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == SECRET]
    assert _referenced(objects) == {name: ("my-signing", key) for name, key in KEYS.items()}
