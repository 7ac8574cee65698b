"""The FAKE API server's object store: pods by namespace and name, a global resourceVersion, a
bounded event history for watches, and metav1.Status errors shaped as the real API server's.
A test double only; everything runs on the server's one event loop, so no locks."""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections import deque
from datetime import UTC, datetime
from typing import Any

__all__ = ["ApiError", "Store", "WatchEvent", "now"]


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    """An error the API answers with a metav1.Status of this code and reason."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body

    @classmethod
    def not_found(cls, name: str, kind: str = "pods") -> ApiError:
        return cls(404, "NotFound", f'{kind} "{name}" not found', {"name": name, "kind": kind})


class WatchEvent:
    def __init__(self, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        self.type, self.obj, self.old = kind, obj, old
        self.rv = int(obj["metadata"]["resourceVersion"])


class Store:
    def __init__(self, history: int = 1000) -> None:
        self.rv = 1
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.history: deque[WatchEvent] = deque(maxlen=history)
        self.compacted = 1
        self.watchers: set[asyncio.Queue[WatchEvent]] = set()

    def _emit(self, event: WatchEvent) -> None:
        if self.history.maxlen and len(self.history) == self.history.maxlen:
            self.compacted = self.history[0].rv
        self.history.append(event)
        for queue in self.watchers:
            queue.put_nowait(event)

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(obj)

    def get(self, ns: str, name: str) -> dict[str, Any]:
        try:
            return copy.deepcopy(self.objects[ns, name])
        except KeyError:
            raise ApiError.not_found(name) from None

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        if key in self.objects:
            raise ApiError(409, "AlreadyExists", f'pods "{key[1]}" already exists', {"name": key[1], "kind": "pods"})
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now())
        self.objects[key] = obj
        snapshot = self._stamp(obj)
        self._emit(WatchEvent("ADDED", snapshot, None))
        return copy.deepcopy(snapshot)

    def update(self, ns: str, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        old = self.get(ns, name)
        obj["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if obj == old:
            return old
        self.objects[ns, name] = obj
        snapshot = self._stamp(obj)
        self._emit(WatchEvent("MODIFIED", snapshot, old))
        return copy.deepcopy(snapshot)

    def delete(self, ns: str, name: str) -> dict[str, Any]:
        old = self.get(ns, name)
        obj = self.objects.pop((ns, name))
        snapshot = self._stamp(obj)
        self._emit(WatchEvent("DELETED", snapshot, old))
        return copy.deepcopy(snapshot)

    def items(self, ns: str | None) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for (n, _), o in sorted(self.objects.items()) if ns is None or n == ns]

    def events_since(self, rv: int) -> list[WatchEvent]:
        """Events after ``rv``; 410 Expired when the history no longer reaches back that far."""
        if rv < self.compacted:
            raise ApiError(410, "Expired", f"too old resource version: {rv} ({self.compacted})")
        return [e for e in self.history if e.rv > rv]

    def compact(self) -> None:
        """Forget every past event, as etcd compaction does: older watches get 410 Gone."""
        self.history.clear()
        self.compacted = self.rv
