"""The FAKE API server's HTTP routes (Starlette): core/v1 pods, watch, exec, discovery. A test
double only: it speaks the wire protocol the official ``kubernetes`` client uses, no more."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from .exec_bridge import serve_exec
from .kubelet import Kubelet, quantity
from .selectors import field_selector, label_selector
from .store import ApiError, Store, WatchEvent

__all__ = ["build_app"]

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_RESTART = ("Always", "OnFailure", "Never")


def _invalid(name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    text = ", ".join(f"{field}: {message}" for _, field, message in causes)
    details = {"name": name, "kind": "Pod", "causes": [{"reason": r, "message": m, "field": f} for r, f, m in causes]}
    return ApiError(422, "Invalid", f'Pod "{name}" is invalid: {text}', details)


def _validate(pod: dict[str, Any]) -> None:
    """The checks a real API server makes that a sandbox backend can trip over (a subset), and
    refusals of what this fake does not run (more than one container, non-emptyDir volumes)."""
    name, spec, causes = pod["metadata"]["name"], pod.get("spec") or {}, []
    if len(name) > 253 or not _NAME.match(name):
        causes.append(
            (
                "FieldValueInvalid",
                "metadata.name",
                f'Invalid value: "{name}": a lowercase RFC 1123 '
                "subdomain must consist of lower case alphanumeric characters, '-' or '.'",
            )
        )
    containers = spec.get("containers") or []
    if not containers:
        causes.append(("FieldValueRequired", "spec.containers", "Required value"))
    elif len(containers) > 1 or spec.get("initContainers"):
        causes.append(("FieldValueNotSupported", "spec.containers", "the fake API server runs one container per pod"))
    for i, c in enumerate(containers):
        if not _LABEL.match(c.get("name") or ""):
            causes.append(("FieldValueRequired", f"spec.containers[{i}].name", "Required value"))
        if not c.get("image"):
            causes.append(("FieldValueRequired", f"spec.containers[{i}].image", "Required value"))
        for kind in ("limits", "requests"):
            for res, value in ((c.get("resources") or {}).get(kind) or {}).items():
                try:
                    quantity(value)
                except ValueError:
                    causes.append(
                        (
                            "FieldValueInvalid",
                            f"spec.containers[{i}].resources.{kind}[{res}]",
                            f'Invalid value: "{value}": quantities must match the regular expression',
                        )
                    )
    if spec.get("restartPolicy", "Always") not in _RESTART:
        causes.append(("FieldValueNotSupported", "spec.restartPolicy", f'Unsupported value: "{spec["restartPolicy"]}"'))
    for i, v in enumerate(spec.get("volumes") or []):
        if set(v) - {"name", "emptyDir"} and set(v) != {"name", "persistentVolumeClaim"}:
            causes.append(
                (
                    "FieldValueNotSupported",
                    f"spec.volumes[{i}]",
                    "the fake API server supports emptyDir and persistentVolumeClaim only",
                )
            )
    if causes:
        raise _invalid(name, causes)


class Api:
    def __init__(self, store: Store, kubelet: Kubelet, namespaces: set[str], requests: Counter[str]) -> None:
        self.store, self.kubelet, self.namespaces, self.requests = store, kubelet, namespaces, requests

    def _namespace(self, request: Request) -> str:
        ns: str = request.path_params["namespace"]
        if ns not in self.namespaces:
            raise ApiError.not_found(ns, "namespaces")
        return ns

    async def create(self, request: Request) -> Response:
        self.requests["create"] += 1
        ns = self._namespace(request)
        pod = await request.json()
        meta = pod.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        meta.setdefault("name", "")
        meta["namespace"] = ns
        pod.update(kind="Pod", apiVersion="v1")
        _validate(pod)
        spec = pod["spec"]
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        pod["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        created = self.store.create(pod)
        self.kubelet.start(created)
        return JSONResponse(created, status_code=201)

    async def get(self, request: Request) -> Response:
        self.requests["get"] += 1
        return JSONResponse(self.store.get(self._namespace(request), request.path_params["name"]))

    async def list(self, request: Request) -> Response:
        ns = self._namespace(request) if "namespace" in request.path_params else None
        q = request.query_params
        labels, fields = label_selector(q.get("labelSelector")), field_selector(q.get("fieldSelector"))

        def matches(obj: dict[str, Any]) -> bool:
            return (ns is None or obj["metadata"]["namespace"] == ns) and labels(obj) and fields(obj)

        watching = q.get("watch") in ("true", "1", "True")
        self.requests["watch" if watching else "list"] += 1
        if watching:
            return StreamingResponse(
                self._watch(matches, q.get("resourceVersion"), q.get("timeoutSeconds")), media_type="application/json"
            )
        items = []
        for item in self.store.items(ns):
            if matches(item):
                item.pop("kind", None)
                item.pop("apiVersion", None)
                items.append(item)
        body = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.store.rv)}}
        return JSONResponse({**body, "items": items})

    async def _watch(
        self, matches: Callable[[dict[str, Any]], bool], rv: str | None, seconds: str | None
    ) -> AsyncIterator[bytes]:
        queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
        self.store.watchers.add(queue)
        try:
            if rv in (None, "", "0"):
                backlog = [WatchEvent("ADDED", o, None) for o in self.store.items(None)]
            else:
                try:
                    backlog = self.store.events_since(int(rv))
                except ApiError as error:
                    yield json.dumps({"type": "ERROR", "object": error.status()}).encode() + b"\n"
                    return
            last = 0 if rv in (None, "", "0") else int(rv)
            deadline = asyncio.get_running_loop().time() + float(seconds or 1800)
            for event in backlog:
                if line := _event_line(event, matches):
                    yield line
                last = max(last, event.rv)
            while True:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    return
                try:
                    event = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    return
                if event.rv > last and (line := _event_line(event, matches)):
                    yield line
        finally:
            self.store.watchers.discard(queue)

    async def delete(self, request: Request) -> Response:
        self.requests["delete"] += 1
        ns, name = self._namespace(request), request.path_params["name"]
        pod = self.store.get(ns, name)
        body = json.loads(await request.body() or b"{}")
        grace = request.query_params.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
        grace = int(grace) if grace is not None else pod["spec"].get("terminationGracePeriodSeconds", 30)
        if not pod["spec"].get("nodeName"):
            grace = 0
        if grace == 0 and not pod["metadata"].get("finalizers"):
            pod = self.store.delete(ns, name)  # never bound, or forced: gone at once
            self.kubelet.background(self.kubelet.terminate(ns, name, 0))
            return JSONResponse(pod)
        if not pod["metadata"].get("deletionTimestamp"):
            from .store import now

            pod["metadata"].update(deletionTimestamp=now(), deletionGracePeriodSeconds=grace)
            pod = self.store.update(ns, name, pod)
            self.kubelet.background(self.kubelet.terminate(ns, name, grace))
        return JSONResponse(pod)

    async def patch(self, request: Request) -> Response:
        self.requests["patch"] += 1
        ns, name = self._namespace(request), request.path_params["name"]
        kind = request.headers.get("content-type", "").split(";")[0]
        pod, patch = self.store.get(ns, name), await request.json()
        wanted = (patch.get("metadata") or {}).get("resourceVersion") if isinstance(patch, dict) else None
        if wanted is not None and wanted != pod["metadata"]["resourceVersion"]:  # a precondition
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
            )
        if kind == "application/json-patch+json":
            new = _json_patch(pod, patch)
        elif kind in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            new = _merge(pod, patch)
        else:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - "
                "accepted media types include: application/json-patch+json, application/merge-patch+json",
            )
        if {k: v for k, v in new["spec"].items() if k != "activeDeadlineSeconds"} != {
            k: v for k, v in pod["spec"].items() if k != "activeDeadlineSeconds"
        }:
            raise _invalid(
                name,
                [
                    (
                        "FieldValueForbidden",
                        "spec",
                        "Forbidden: pod updates may not change fields "
                        "other than `spec.containers[*].image`, `spec.activeDeadlineSeconds`, ...",
                    )
                ],
            )
        new["status"] = pod["status"]
        updated = self.store.update(ns, name, new)
        self.kubelet.release(ns, name)  # the last finalizer gone: a pod being deleted goes
        return JSONResponse(updated)


def _event_line(event: WatchEvent, matches: Callable[[dict[str, Any]], bool]) -> bytes | None:
    """As the real watch cache does: an object leaving the selection is DELETED for this
    watcher, one entering it ADDED."""
    now_in = matches(event.obj)
    was_in = event.old is not None and matches(event.old)
    kind = event.type
    if kind == "MODIFIED":
        kind = "MODIFIED" if now_in and was_in else "ADDED" if now_in else "DELETED" if was_in else ""
    elif kind == "DELETED":
        kind = "DELETED" if was_in or now_in else ""
    elif not now_in:
        kind = ""
    return json.dumps({"type": kind, "object": event.obj}).encode() + b"\n" if kind else None


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


def _json_patch(target: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    result = copy.deepcopy(target)
    for op in ops:
        *parents, leaf = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        node = result
        for part in parents:
            node = node.setdefault(part, {}) if op["op"] == "add" else node[part]
        if op["op"] in ("add", "replace"):
            node[leaf] = op["value"]
        elif op["op"] == "remove":
            node.pop(leaf)
        else:
            raise ApiError(422, "Invalid", f"the fake does not support json-patch op {op['op']!r}")
    return result


def build_app(
    store: Store, kubelet: Kubelet, namespaces: set[str], protocols: tuple[str, ...], requests: Counter[str]
) -> Starlette:
    """The routes; ``protocols`` are the exec subprotocols served, ``requests`` counts what
    each request asked for (``create``, ``get``, ``list``, ``watch``, ``patch``, ``delete`` of
    pods; ``exec`` for each exec stream opened)."""
    api = Api(store, kubelet, namespaces, requests)

    def guarded(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)  # type: ignore[no-any-return]
            except ApiError as error:
                return JSONResponse(error.status(), status_code=error.code)

        return endpoint

    async def version(_: Request) -> Response:
        return JSONResponse(
            {
                "major": "1",
                "minor": "31",
                "gitVersion": "v1.31.0-fake",
                "gitCommit": "fake",
                "gitTreeState": "clean",
                "buildDate": "2024-08-13T07:28:49Z",
                "goVersion": "go1.22.5",
                "compiler": "gc",
                "platform": "linux/amd64",
            }
        )

    async def api_versions(_: Request) -> Response:
        return JSONResponse({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})

    async def exec_without_upgrade(_: Request) -> Response:
        return JSONResponse(ApiError(400, "BadRequest", "Upgrade request required").status(), status_code=400)

    async def exec_ws(websocket: WebSocket) -> None:
        await serve_exec(websocket, kubelet, protocols, requests)

    pods = "/api/v1/namespaces/{namespace}/pods"
    claims, claim_routes = kubelet.claims, "/api/v1/namespaces/{namespace}/persistentvolumeclaims"
    return Starlette(
        routes=[
            Route(claim_routes, guarded(claims.list), methods=["GET"]),
            Route(claim_routes, guarded(claims.create), methods=["POST"]),
            Route(claim_routes + "/{name}", guarded(claims.get), methods=["GET"]),
            Route(claim_routes + "/{name}", guarded(claims.delete), methods=["DELETE"]),
            Route("/version", version),
            Route("/api", api_versions),
            Route(pods, guarded(api.list), methods=["GET"]),
            Route(pods, guarded(api.create), methods=["POST"]),
            Route("/api/v1/pods", guarded(api.list), methods=["GET"]),
            Route(pods + "/{name}", guarded(api.get), methods=["GET"]),
            Route(pods + "/{name}", guarded(api.delete), methods=["DELETE"]),
            Route(pods + "/{name}", guarded(api.patch), methods=["PATCH"]),
            WebSocketRoute(pods + "/{name}/exec", exec_ws),
            Route(pods + "/{name}/exec", exec_without_upgrade, methods=["GET", "POST"]),
        ]
    )
