"""Two replicas over one Docker engine, each with a data directory of its own (as the Helm
chart's pods), sharing the directory of revoked preview tokens (``revoked_previews_dir``, the
chart's on the snapshot store's volume) and the tokens' signing secret: a token revoked through
one replica is refused by the other from its next request on."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from service_harness import create, error_of, running, settings_for
from support import SESSION_OWNER

from sandboxes.docker import DockerTemplate
from sandboxes.server.previews import REVOKED_DIR

CLEANUP = {"io.sandboxes.test-session": SESSION_OWNER}
PORT = 8000
"""A port nothing listens on: a request a token lets through answers 502, one it does not 401."""


def test_a_token_revoked_through_one_replica_is_refused_by_another_with_a_data_directory_of_its_own(
    tmp_path: Path, docker_client: Any, runtime_image: str
) -> None:
    template = DockerTemplate(backend="docker", image=runtime_image, cpus=0.5, memory="256m", labels=CLEANUP)
    shared = {
        "owner": f"{SESSION_OWNER}-revoked-{uuid.uuid4().hex[:6]}",
        "templates": {"default": template},
        "preview_token_secret": SecretStr(uuid.uuid4().hex),
        "revoked_previews_dir": tmp_path / "shared" / "revoked",
        "confirm_interval": 0,
    }
    with (
        running(settings_for(tmp_path / "a", **shared), docker_client=docker_client) as a,
        running(settings_for(tmp_path / "b", **shared), docker_client=docker_client) as b,
        a.client("alice") as alice,
        b.client(None) as stranger,
    ):
        sandbox_id = create(alice, ttl=120)["id"]
        try:
            base = f"/v1/sandboxes/{sandbox_id}/ports/{PORT}"
            token = alice.post(f"{base}/tokens", json={}).json()
            headers = {"X-Preview-Token": token["token"]}
            assert stranger.get(f"{base}/", headers=headers).status_code == 502  # B lets it through
            assert alice.delete(f"{base}/tokens/{token['token_id']}").status_code == 204
            refused = stranger.get(f"{base}/", headers=headers)
            assert (refused.status_code, error_of(refused)) == (401, "unauthorized")
            assert (tmp_path / "shared" / "revoked" / token["token_id"]).is_file()
            assert not (tmp_path / "a" / REVOKED_DIR).exists()  # not in A's own data directory
        finally:
            assert alice.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204
