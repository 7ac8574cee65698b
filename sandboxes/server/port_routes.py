"""The routes of a sandbox's ports (`sandboxes.api`): making one public, minting and revoking
preview tokens, and the preview plane's own (`sandboxes.server.preview_proxy`) after them, for
the service's one route table (`sandboxes.server.app`). Authenticated as every ``/v1`` route
(`sandboxes.server.routes`); a sandbox of another tenant is not found."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Path, Request, Response

from sandboxes import api
from sandboxes.server.preview_proxy import Previews, preview_routes
from sandboxes.server.previews import TOKEN_ID
from sandboxes.server.routes import Authed, Service, _entry, api_router

__all__ = ["ports"]

ports = api_router()


def _previews(svc: Service) -> Previews:
    assert svc.previews is not None  # set by the app
    return svc.previews


Port = Annotated[int, Path(ge=1, le=65535, description="A TCP port inside the sandbox")]
TokenId = Annotated[str, Path(pattern=TOKEN_ID, description="A preview token's id (its mint's `token_id`)")]


@ports.put("/sandboxes/{sandbox_id}/ports/{port}", response_model=api.PortInfo)
async def set_port_access(
    request: Request, sandbox_id: str, port: Port, body: api.PortAccess, tenant: Authed
) -> api.PortInfo:
    """Make the port's preview URL public (anyone may reach it, no key nor token) or not, kept
    in the sandbox's state (`SandboxState.preview_public`)."""
    svc, entry = await _entry(request, tenant, sandbox_id)
    entry.state.set_preview_public(port, body.public)
    await svc.registry.record_network(entry)  # in its state file: a restart and a fork keep it
    return api.PortInfo(sandbox_id=sandbox_id, port=port, public=body.public)


@ports.post("/sandboxes/{sandbox_id}/ports/{port}/tokens", status_code=201, response_model=api.PreviewToken)
async def mint_preview_token(
    request: Request, sandbox_id: str, port: Port, body: api.PreviewTokenRequest, tenant: Authed
) -> api.PreviewToken:
    """A token granting the port's preview URL alone, until it expires or is revoked."""
    svc, _ = await _entry(request, tenant, sandbox_id)
    minted = _previews(svc).access.mint(tenant.id, sandbox_id, port, body.ttl)
    url = f"{api.API_PREFIX}/sandboxes/{sandbox_id}/ports/{port}/?preview_token={minted.token}"
    return api.PreviewToken(
        token=minted.token,
        token_id=minted.token_id,
        sandbox_id=sandbox_id,
        port=port,
        expires_at=minted.expires_at,
        url=url,
    )


@ports.delete("/sandboxes/{sandbox_id}/ports/{port}/tokens/{token_id}", status_code=204, response_class=Response)
async def revoke_preview_token(
    request: Request, sandbox_id: str, port: Port, token_id: TokenId, tenant: Authed
) -> Response:
    """Revoke a preview token of the sandbox: it grants nothing from now on, on any replica
    sharing the data directory (recorded before the answer: see `sandboxes.server.previews`)."""
    svc, _ = await _entry(request, tenant, sandbox_id)
    await asyncio.to_thread(_previews(svc).access.revoke, token_id)
    return Response(status_code=204)


ports.routes.extend(preview_routes(api.API_PREFIX))  # after the routes above: they come first
