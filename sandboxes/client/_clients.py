"""`SandboxClient` and `AsyncSandboxClient`: a connection to the service that also hands out
`RemoteSandbox` handles (``create``, ``attach``).

They sit above both `sandboxes.client._http` (the connection, which `RemoteSandbox` sends its
calls through) and `sandboxes.client.remote`, so that neither of those imports the other's
module back: the client's imports run one way (``_http`` < ``remote`` < ``_clients``, checked by
``lint-imports``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Literal

from sandboxes import api
from sandboxes.client import _ops
from sandboxes.client._http import AsyncServiceConnection, ServiceConnection
from sandboxes.client.remote import RemoteSandbox

__all__ = ["AsyncSandboxClient", "SandboxClient"]


class SandboxClient(ServiceConnection):
    """A connection pool to one sandbox service, for one API key. Thread-safe.

    ``SandboxClient(url, api_key).create("default")`` gives a `RemoteSandbox`, a backend like
    any other. Extra keyword options are `ClientConfig` fields (``connect_timeout``,
    ``backoff``, ...).
    """

    def create(
        self,
        template: str = "default",
        *,
        env: Mapping[str, str] | None = None,
        ttl: float | None = None,
        labels: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        volumes: Sequence[api.VolumeMount] = (),
        auto_resume: bool = False,
        snapshot: str | None = None,
        egress_allow: Sequence[str] | None = None,
        on_timeout: Literal["delete", "freeze", "hibernate"] = "delete",
    ) -> RemoteSandbox:
        """A new sandbox, created once however often the request is retried: every attempt
        carries the same ``Idempotency-Key`` (``idempotency_key``, else a fresh UUID for this
        call), and the service answers a retry with the sandbox the first attempt made. Pass
        your own key to make a create repeatable across processes (a job that restarts).
        ``volumes``: the tenant's volumes to mount (`create_volume`).
        ``auto_resume``: paused, an operation resumes it instead of raising `Paused`.
        ``snapshot``: restore that snapshot in it, verified (`SnapshotMismatch` if it cannot be).
        ``egress_allow``: its egress allow-list instead of its template's (``[]``: nothing);
        only a template with egress takes one (`InvalidRequest` otherwise).
        ``on_timeout``: what the end of its TTL does (``delete``; ``freeze`` or ``hibernate``
        pause it, kept paused the service's maximum TTL before it is deleted)."""
        key = idempotency_key or _new_key()
        op = _ops.create(template, env, ttl, labels, key, volumes, auto_resume, snapshot, egress_allow, on_timeout)
        info = self.call(op)
        return RemoteSandbox(info.id, self, info=info, owned=True)

    def attach(self, sandbox_id: str, *, info: api.SandboxInfo | None = None) -> RemoteSandbox:
        """A handle on an existing sandbox, without a round trip."""
        return RemoteSandbox(sandbox_id, self, info=info)


class AsyncSandboxClient(AsyncServiceConnection):
    """`SandboxClient` for asyncio programs: the same calls, awaited, on one event loop."""

    async def create(
        self,
        template: str = "default",
        *,
        env: Mapping[str, str] | None = None,
        ttl: float | None = None,
        labels: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        volumes: Sequence[api.VolumeMount] = (),
        auto_resume: bool = False,
        snapshot: str | None = None,
        egress_allow: Sequence[str] | None = None,
        on_timeout: Literal["delete", "freeze", "hibernate"] = "delete",
    ) -> RemoteSandbox:
        key = idempotency_key or _new_key()
        op = _ops.create(template, env, ttl, labels, key, volumes, auto_resume, snapshot, egress_allow, on_timeout)
        info = await self.call(op)
        return RemoteSandbox(info.id, self, info=info, owned=True)

    def attach(self, sandbox_id: str, *, info: api.SandboxInfo | None = None) -> RemoteSandbox:
        return RemoteSandbox(sandbox_id, self, info=info)


def _new_key() -> str:
    """One logical create's ``Idempotency-Key``."""
    return str(uuid.uuid4())
