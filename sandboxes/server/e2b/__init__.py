"""The E2B-compatible API: programs written for the E2B SDK reach this service with
``E2B_API_URL=$SERVICE/e2b``, ``E2B_SANDBOX_URL=$SERVICE/e2b/envd`` and a tenant's API key as
``E2B_API_KEY``; or, where the service has a wildcard ``preview_domain``, without
``E2B_SANDBOX_URL``: the answers name that domain and its sandbox hosts are the envd plane's
(`sandboxes.server.e2b.hosts`). `mount` adds both planes to the app."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from sandboxes.server.e2b import control, envd, filesystem, process, pty, snapshots, stdin, usage, watch
from sandboxes.server.e2b.common import ENVD_PREFIX, PREFIX, E2BState
from sandboxes.server.e2b.ports import EnvdPortRoute
from sandboxes.server.e2b.tokens import E2BSettings, TokenSigner, signing_secret

__all__ = ["HOT_PATHS", "PREFIX", "mount"]

HOT_PATHS = frozenset(
    f"{ENVD_PREFIX}{path}"
    for path in ("/files", "/process.Process/Start", "/filesystem.Filesystem/ListDir", "/filesystem.Filesystem/Stat")
)
"""The envd routes nearly every SDK call goes through (commands, reads and writes, listings)."""


def mount(app: FastAPI, settings: E2BSettings | None = None) -> None:
    """Serve the control plane under `PREFIX` and the envd plane under ``PREFIX/envd``, on an
    app whose ``state.service`` is set (its data directory keeps the default token secret)."""
    settings = settings or E2BSettings()
    secret = signing_secret(settings, app.state.service.settings.data_dir)
    app.state.e2b = E2BState(settings, TokenSigner(secret))
    planes = [envd.router, filesystem.router, stdin.router, pty.router, watch.router, process.router]
    planes += [usage.router, snapshots.router, control.router, envd.signed_router]
    app.router.routes.extend(route for plane in planes for route in plane.routes)  # no nesting
    _hot_first(app.router.routes)
    app.router.routes.insert(0, EnvdPortRoute())  # a sandbox's other ports, whatever their paths


def _hot_first(table: list[BaseRoute]) -> None:
    """The `HOT_PATHS` routes moved in front of the documented routes (behind the service's own
    fast paths, which are not `APIRoute`s), in their order: a request is matched against the
    table's routes one by one, and these would otherwise come after all of the service's. No
    other route matches their paths, so what each request reaches is unchanged."""
    hot = [route for route in table if isinstance(route, APIRoute) and route.path in HOT_PATHS]
    rest = [route for route in table if not any(route is moved for moved in hot)]
    front = next((i for i, route in enumerate(rest) if isinstance(route, APIRoute)), len(rest))
    table[:] = [*rest[:front], *hot, *rest[front:]]
