"""E2B's sandbox hosts on the preview domain: without ``E2B_SANDBOX_URL``, the SDK sends a
sandbox's envd calls to ``https://49983-{id}.{domain}``, its code interpreter's to
``49999-{id}.{domain}`` and a user's to ``get_host(port)``'s ``{port}-{id}.{domain}``, the
``domain`` being the create's answer's (the service's ``preview_domain``). `E2BHosts` serves
such a request as the envd plane serves ``/e2b/envd`` with ``E2b-Sandbox-Id: {id}`` and
``E2b-Sandbox-Port: {port}`` (the one path both forms take: `sandboxes.server.e2b.envd` for
envd's port, `sandboxes.server.e2b.ports` for the others, with their access and their errors)
when it is E2B's: envd's port, or a request carrying the sandbox's E2B token
(``X-Access-Token``, ``E2B-Traffic-Access-Token``), or one with no credential at all to a
sandbox whose E2B create allowed public traffic. Every other request on a preview host stays a
preview (`sandboxes.server.preview_proxy.HostedRoute`: the tenant's key, a preview token, a
port made public), and so does every WebSocket."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from sandboxes.server.e2b.common import ENVD_PREFIX
from sandboxes.server.e2b.envd import ENVD_PORT
from sandboxes.server.previews import preview_token_of

__all__ = ["E2BHosts"]

_E2B_TOKENS = frozenset({b"x-access-token", b"e2b-traffic-access-token"})
_ROUTING = frozenset({b"e2b-sandbox-id", b"e2b-sandbox-port"})
_ENVD_PATH = ENVD_PREFIX.encode("ascii")


class E2BHosts:
    """Between `sandboxes.server.preview_proxy.PreviewHosts` (which marks a preview host's
    request with ``preview_target``) and the service: an E2B request on a preview host leaves
    it unmarked, its path under ``/e2b/envd`` and its sandbox and port in E2B's headers (those
    it came with replaced: the host names them)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = scope.get("preview_target")
        if target is not None and scope["type"] == "http" and await _is_e2b(scope, target[0], target[1]):
            scope = _on_envd_plane(scope, target[0], target[1])
        await self.app(scope, receive, send)


async def _is_e2b(scope: Scope, port: int, sandbox_id: str) -> bool:
    """Whether the request for ``port`` of ``sandbox_id`` is E2B's rather than a preview's (its
    public traffic as set through any replica sharing the data directory: `Holdings.network_of`)."""
    if str(port) == ENVD_PORT:
        return True
    names = {key for key, _ in scope["headers"]}
    if names & _E2B_TOKENS:
        return True
    if b"authorization" in names or preview_token_of(scope) is not None:
        return False
    state = await scope["app"].state.service.registry.network_of(sandbox_id)
    return state is not None and bool(state.public_ports)


def _on_envd_plane(scope: Scope, port: int, sandbox_id: str) -> Scope:
    """The request as the envd plane takes it: under ``/e2b/envd``, naming its sandbox and port."""
    raw: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
    headers = [(key, value) for key, value in scope["headers"] if key not in _ROUTING]
    headers += [(b"e2b-sandbox-id", sandbox_id.encode("latin-1")), (b"e2b-sandbox-port", str(port).encode("ascii"))]
    moved = {key: value for key, value in scope.items() if key != "preview_target"}
    moved.update(path=ENVD_PREFIX + scope["path"], raw_path=_ENVD_PATH + raw, headers=headers)
    return moved
