"""The FAKE API server's PersistentVolumeClaims (core/v1): created Bound at once, read, listed,
deleted; each claim's storage is one Docker named volume of the fake node, made when a pod
first mounts it and removed with the claim (`docker_volume`). A test double only."""

from __future__ import annotations

import contextlib
import copy
import json
import re
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .store import ApiError, now

__all__ = ["Claims", "docker_volume"]

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def docker_volume(ns: str, claim: str) -> str:
    return f"fake-k8s-pvc-{ns}-{claim}"


class Claims:
    """Claims by (namespace, name); `removed` is called with each deleted one's Docker volume."""

    def __init__(self, namespaces: set[str], docker: Any) -> None:
        self.namespaces, self.docker = namespaces, docker
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}

    def _key(self, request: Request, name: str | None = None) -> tuple[str, str]:
        ns = request.path_params["namespace"]
        if ns not in self.namespaces:
            raise ApiError.not_found(ns, "namespaces")
        return ns, name if name is not None else request.path_params["name"]

    def bound(self, ns: str, name: str) -> bool:
        return (ns, name) in self.objects

    async def create(self, request: Request) -> Response:
        claim = await request.json()
        meta = claim.setdefault("metadata", {})
        key = self._key(request, meta.get("name", ""))
        if not _NAME.match(key[1]) or len(key[1]) > 253:
            raise ApiError(422, "Invalid", f'PersistentVolumeClaim "{key[1]}" is invalid: metadata.name')
        if key in self.objects:
            raise ApiError(409, "AlreadyExists", f'persistentvolumeclaims "{key[1]}" already exists')
        meta.update(namespace=key[0], uid=str(uuid.uuid4()), creationTimestamp=now(), resourceVersion="1")
        claim.update(kind="PersistentVolumeClaim", apiVersion="v1", status={"phase": "Bound"})
        self.objects[key] = claim
        return JSONResponse(copy.deepcopy(claim), status_code=201)

    async def get(self, request: Request) -> Response:
        key = self._key(request)
        if key not in self.objects:
            raise ApiError.not_found(key[1], "persistentvolumeclaims")
        return JSONResponse(copy.deepcopy(self.objects[key]))

    async def list(self, request: Request) -> Response:
        ns = request.path_params["namespace"]
        items = [copy.deepcopy(claim) for (n, _), claim in sorted(self.objects.items()) if n == ns]
        return JSONResponse({"kind": "PersistentVolumeClaimList", "apiVersion": "v1", "metadata": {}, "items": items})

    async def delete(self, request: Request) -> Response:
        key = self._key(request)
        claim = self.objects.pop(key, None)
        if claim is None:
            raise ApiError.not_found(key[1], "persistentvolumeclaims")
        json.loads(await request.body() or b"{}")
        with contextlib.suppress(Exception):  # never mounted (no volume), or already gone
            self.docker.volumes.get(docker_volume(*key)).remove(force=True)
        return JSONResponse(claim)
