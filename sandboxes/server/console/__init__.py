"""The web console (``/console``): the built single-page app of ``console/`` in the repository
(`console/build.sh` puts it in this package's ``static/``), served as static files by the
service when `ServiceSettings.console` is on. It calls the public API with the key the user
types, like any client: it has no access of its own. Every asset is served from here (no CDN),
under a content security policy that allows nothing but this origin."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["STATIC", "mount"]

STATIC = Path(__file__).parent / "static"
PREFIX = "/console"
POLICY = (
    "default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data: blob:; "
    "style-src 'self' 'unsafe-inline'; script-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'"
)
"""The page may load and call this origin only (xterm.js sets inline styles, nothing else)."""
_HEADERS = [
    (b"content-security-policy", POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),
]


class _Guarded:
    """The static files, each answer with the console's security headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_HEADERS]
            await send(message)

        await self.app(scope, receive, guarded)


def mount(app: FastAPI, static: Path = STATIC) -> None:
    """Serve the console's build from ``static`` under ``/console``; `RuntimeError` if it was
    not built (the service refuses to start rather than serve a blank page)."""
    if not (static / "index.html").is_file():
        raise RuntimeError(f"the console is on but not built ({static} has no index.html): run console/build.sh")

    async def to_console() -> RedirectResponse:
        return RedirectResponse(f"{PREFIX}/")

    app.add_api_route(PREFIX, to_console, include_in_schema=False)
    app.mount(PREFIX, _Guarded(StaticFiles(directory=static, html=True)), name="console")
