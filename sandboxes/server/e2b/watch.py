"""envd's file watches over Connect (JSON codec), on the service's own (`sandboxes.server.watches`,
the sandbox's exec helper): ``filesystem.Filesystem/WatchDir`` (server stream: ``start``, then
``filesystem`` events of envd's ``EventType`` names, ``keepalive`` while quiet; its deadline the
call's ``Connect-Timeout-Ms``), and the polled ``CreateWatcher``, ``GetWatcherEvents``,
``RemoveWatcher``. They count against the tenant's ``max_watchers``; a polled watcher not asked
for its events for the service's ``watcher_idle`` seconds is removed. Events are named relative
to the watched directory; an ``overflow`` (events lost) has no envd equivalent and is not sent.
A relative path is under the sandbox's workdir, as the other filesystem calls resolve it. The
service's atomic writes are reported as envd's in-place ones (`Landings`). Unlike envd, a
directory on a network mount (NFS, CIFS, FUSE) is watched without ``allowNetworkMounts``."""

from __future__ import annotations

import posixpath
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from sandboxes import api
from sandboxes.server.e2b.common import ENVD_PREFIX, E2BRoute, e2b_state, service
from sandboxes.server.e2b.connect import (
    STREAM_MEDIA_TYPE,
    ConnectError,
    end_of_stream,
    envelope,
    read_envelope,
    unary_message,
)
from sandboxes.server.e2b.envd import access
from sandboxes.server.e2b.filesystem import _error, _path, entry_info
from sandboxes.server.e2b.landing import Landings
from sandboxes.server.errors import ServiceError
from sandboxes.server.registry import Entry

__all__ = ["EVENT_TYPES", "router"]

router = APIRouter(prefix=ENVD_PREFIX, route_class=E2BRoute, include_in_schema=False)

EVENT_TYPES = {
    "create": "EVENT_TYPE_CREATE",
    "write": "EVENT_TYPE_WRITE",
    "remove": "EVENT_TYPE_REMOVE",
    "rename": "EVENT_TYPE_RENAME",
    "chmod": "EVENT_TYPE_CHMOD",
}
"""Our event kinds -> envd's ``filesystem.EventType`` names (proto3 JSON)."""
KEEPALIVE_CEILING = 50.0
"""The longest quiet (seconds) between two messages of a stream, whatever the client asks."""
_CODES = {
    "file_not_found": "not_found",
    "not_a_directory": "invalid_argument",
    "invalid_path": "invalid_argument",
    "permission_denied": "permission_denied",
    "rate_limited": "resource_exhausted",
    "unavailable": "unavailable",
    "timeout": "deadline_exceeded",
}


def _refused(exc: ServiceError) -> ConnectError:
    """A watch the service refused, as Connect's error."""
    return ConnectError(_CODES.get(exc.code, "unavailable"), exc.message)


def _events(landings: Landings, event: api.WatchEvent) -> list[dict[str, Any]]:
    """envd's ``FilesystemEvent``s for an event (none for a kind envd does not have)."""
    if event.type not in EVENT_TYPES:
        return []
    return [{"name": name, "type": EVENT_TYPES[kind]} for kind, name in landings.feed(event.type, event.name or "")]


async def _with_entries(
    request: Request, entry: Entry, landings: Landings, messages: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``messages``, each with its file's ``entry`` where the watch asked for it and the file is
    there (envd's best effort; a path is looked at once per call)."""
    if not landings.include_entry:
        return messages
    seen: dict[str, dict[str, Any] | None] = {}
    for message in messages:
        path = posixpath.join(landings.root, message["name"])
        if message["type"] != "EVENT_TYPE_REMOVE" and path not in seen:
            try:
                seen[path] = await entry_info(request, entry, path)
            except ConnectError:  # gone meanwhile, or the sandbox did not answer
                seen[path] = None
        if seen.get(path) is not None:
            message["entry"] = seen[path]
    return messages


def _watched(entry: Entry, message: dict[str, Any]) -> tuple[str, bool, bool]:
    """The watch's path, ``recursive`` and ``includeEntry``; ``allowNetworkMounts`` (envd 0.6.4)
    is checked and let through: a network mount is watched whether asked or not."""
    flags = [message.get(name, False) for name in ("recursive", "includeEntry", "allowNetworkMounts")]
    if not all(isinstance(flag, bool) for flag in flags):
        raise ConnectError("invalid_argument", "recursive, includeEntry and allowNetworkMounts must be booleans")
    return _path(entry, message), flags[0], flags[1]


@router.post("/filesystem.Filesystem/WatchDir")
async def watch_dir(request: Request) -> Response:
    entry = await access(request)
    svc = service(request)
    tenant = entry.state.tenant
    try:
        path, recursive, include_entry = _watched(entry, read_envelope(await request.body()))
        events = await svc.watches.follow(
            tenant,
            svc.settings.policy_for(tenant).max_watchers,
            entry.sandbox,
            path,
            recursive,
            _keepalive(request.headers.get("keepalive-ping-interval")),
            _deadline(request.headers.get("connect-timeout-ms")),
        )
    except ServiceError as exc:
        return StreamingResponse(_once(end_of_stream(_refused(exc))), media_type=STREAM_MEDIA_TYPE)
    except ConnectError as exc:
        return StreamingResponse(_once(end_of_stream(exc)), media_type=STREAM_MEDIA_TYPE)
    landings = Landings(path, include_entry)
    return StreamingResponse(_stream(request, entry, landings, events), media_type=STREAM_MEDIA_TYPE)


async def _stream(
    request: Request, entry: Entry, landings: Landings, events: AsyncGenerator[api.WatchEvent]
) -> AsyncIterator[bytes]:
    """The watch's messages on one connection; leaving it ends the watch."""
    try:
        async for event in events:
            if event.type == "start":
                yield envelope({"start": {}})
            elif event.type == "keepalive":
                yield envelope({"keepalive": {}})
            elif event.type == "end":
                yield _ending(event)
                return
            else:
                for message in await _with_entries(request, entry, landings, _events(landings, event)):
                    yield envelope({"filesystem": message})
    finally:
        await events.aclose()


def _ending(event: api.WatchEvent) -> bytes:
    if event.error is None:
        return end_of_stream()
    code = "deadline_exceeded" if event.error == "timeout" else "unavailable"
    return end_of_stream(ConnectError(code, event.message or event.error))


@router.post("/filesystem.Filesystem/CreateWatcher")
async def create_watcher(request: Request) -> Response:
    entry = await access(request)
    svc = service(request)
    tenant = entry.state.tenant
    try:
        path, recursive, include_entry = _watched(entry, await unary_message(request))
        body = api.CreateWatcher(path=path, recursive=recursive)
        cap = svc.settings.policy_for(tenant).max_watchers
        created = await svc.watches.create(tenant, cap, entry.state.id, entry.sandbox, body, svc.settings.watcher_idle)
    except ServiceError as exc:
        return _error(_refused(exc))
    except ConnectError as exc:
        return _error(exc)
    landings = e2b_state(request).landings(entry.state.id, created.id)
    landings.root, landings.include_entry = path, include_entry
    return JSONResponse({"watcherId": created.id})


@router.post("/filesystem.Filesystem/GetWatcherEvents")
async def get_watcher_events(request: Request) -> Response:
    """What the watcher queued since the last call (envd's kinds only)."""
    entry = await access(request)
    svc = service(request)
    try:
        ident = _watcher_id(await unary_message(request))
        drained = svc.watches.drain(entry.state.tenant, entry.state.id, ident, svc.settings.watcher_idle)
    except ServiceError as exc:
        return _error(ConnectError("not_found", exc.message))
    except ConnectError as exc:
        return _error(exc)
    landings = e2b_state(request).landings(entry.state.id, ident)
    messages = [message for event in drained.events for message in _events(landings, event)]
    return JSONResponse({"events": await _with_entries(request, entry, landings, messages)})


@router.post("/filesystem.Filesystem/RemoveWatcher")
async def remove_watcher(request: Request) -> Response:
    entry = await access(request)
    svc = service(request)
    try:
        ident = _watcher_id(await unary_message(request))
        e2b_state(request).forget_landings(entry.state.id, ident)
        svc.watches.remove(entry.state.tenant, entry.state.id, ident)
    except ServiceError as exc:
        return _error(ConnectError("not_found", exc.message))
    except ConnectError as exc:
        return _error(exc)
    return JSONResponse({})


def _watcher_id(message: dict[str, Any]) -> str:
    ident = message.get("watcherId")
    if not isinstance(ident, str) or not ident:
        raise ConnectError("invalid_argument", "watcherId is required")
    return ident


def _keepalive(header: str | None) -> float:
    if header is not None and header.isdigit() and int(header) > 0:
        return min(float(header), KEEPALIVE_CEILING)
    return KEEPALIVE_CEILING


def _deadline(header: str | None) -> float | None:
    """The watch's lifetime from ``Connect-Timeout-Ms`` (none, or 0: until the client leaves)."""
    if header is not None and header.isdigit() and int(header) > 0:
        return int(header) / 1000
    return None


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data
