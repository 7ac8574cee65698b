"""The E2B-compatible API: programs written for the E2B SDK reach this service with
``E2B_API_URL=$SERVICE/e2b``, ``E2B_SANDBOX_URL=$SERVICE/e2b/envd`` and a tenant's API key as
``E2B_API_KEY``. `mount` adds both planes to the app."""

from __future__ import annotations

from fastapi import FastAPI

from sandboxes.server.e2b import control, envd, filesystem, process, pty, stdin, usage, watch
from sandboxes.server.e2b.common import PREFIX, E2BState
from sandboxes.server.e2b.ports import EnvdPortRoute
from sandboxes.server.e2b.tokens import E2BSettings, TokenSigner, signing_secret

__all__ = ["PREFIX", "mount"]


def mount(app: FastAPI, settings: E2BSettings | None = None) -> None:
    """Serve the control plane under `PREFIX` and the envd plane under ``PREFIX/envd``, on an
    app whose ``state.service`` is set (its data directory keeps the default token secret)."""
    settings = settings or E2BSettings()
    secret = signing_secret(settings, app.state.service.settings.data_dir)
    app.state.e2b = E2BState(settings, TokenSigner(secret))
    planes = [envd.router, filesystem.router, stdin.router, pty.router, watch.router, process.router]
    planes += [usage.router, control.router]
    app.router.routes.extend(route for plane in planes for route in plane.routes)  # no nesting
    app.router.routes.insert(0, EnvdPortRoute())  # a sandbox's other ports, whatever their paths
