"""Over real HTTP: the hot routes' fast path (`sandboxes.server.routes.hot_routes`) answers
exactly as the documented FastAPI route does.

One service, two sandboxes of one tenant: every request is sent once with the fast path in place
(to sandbox A) and once with it off (to sandbox B, every request to FastAPI's handler), and the
two answers must agree (status, JSON body, the headers that carry meaning, the metrics counted),
once each sandbox's id and directory are written as placeholders. Each request also says who
must serve it: the fast path (ordinary requests, and failures it raises to the exception
handlers: the rate limit, an unknown or foreign sandbox, a body over the limit), FastAPI's
handler (everything the fast path leaves to it: bodies that do not parse or validate, another
content type), or neither (the request middleware's refusals, and what no route matches).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from service_harness import Running, create, error_of, running, settings_for
from starlette.routing import Host, Mount, Route, Router

from sandboxes.server import routes
from sandboxes.server.auth import Authenticator
from sandboxes.server.settings import TenantPolicy

LIMIT = 64 * 1024


@dataclass
class _Switch:
    """Turns the hot routes' fast path off (each request goes straight to its documented route)
    and on, and counts the requests the fast path leaves to the documented route."""

    routes: list[Route]
    calls: int = 0

    def use_hot_path(self, on: bool) -> None:
        for route in self.routes:
            fast = route.endpoint
            assert isinstance(fast, routes._Fast)
            route.app = fast if on else fast.route.handle


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    settings = settings_for(
        tmp_path_factory.mktemp("hot"),
        max_body_bytes=LIMIT,
        tenants={"alice": TenantPolicy(rate=1000, burst=1000), "slow": TenantPolicy(rate=0.5, burst=2)},
    )
    with running(settings) as svc:
        yield svc


@pytest.fixture(scope="module")
def switch(service: Running) -> Iterator[_Switch]:
    hot = [r for r in service.app.routes if isinstance(r, Route) and isinstance(r.endpoint, routes._Fast)]
    assert len(hot) == 11  # one sandbox's record, execute, nine file operations
    made = _Switch(hot)
    served = routes._served

    async def counted(fast: Any, request: Any) -> bytes | None:
        answer = await served(fast, request)
        made.calls += answer is None
        return answer

    routes._served = counted  # type: ignore[assignment]
    yield made
    routes._served = served  # type: ignore[assignment]
    made.use_hot_path(True)


@dataclass
class _Sandboxes:
    ids: dict[bool, str]
    workdirs: dict[bool, str]
    foreign: dict[bool, str] = field(default_factory=dict)


@pytest.fixture(scope="module")
def sandboxes(service: Running) -> Iterator[_Sandboxes]:
    with service.client("alice") as alice, service.client("bob") as bob:
        made = {hot: create(alice) for hot in (True, False)}
        foreign = {hot: create(bob)["id"] for hot in (True, False)}
        yield _Sandboxes({h: s["id"] for h, s in made.items()}, {h: s["workdir"] for h, s in made.items()}, foreign)
        for sandbox in made.values():
            alice.delete(f"/v1/sandboxes/{sandbox['id']}")
        for sandbox_id in foreign.values():
            bob.delete(f"/v1/sandboxes/{sandbox_id}")


def _chunked_oversized() -> Iterator[bytes]:
    yield b'{"command": "'
    for _ in range(LIMIT // 10_000 + 2):
        yield b"y" * 10_000
    yield b'"}'


HOT, FASTAPI, MIDDLEWARE = "fast path", "FastAPI's handler", "no route handler"
JSON = {"Content-Type": "application/json"}
# (name, who must answer it, method, path after /v1/sandboxes/<ID>, request options). "<WORKDIR>"
# in a body stands for the sandbox's directory; a path starting with "/v1/" is the whole path.
# The request middleware refuses a bad key and a declared oversized body before any route sees
# them; the router answers what no route matches.
CASES: list[tuple[str, str, str, str, dict[str, Any]]] = [
    ("get", HOT, "GET", "", {}),
    ("execute", HOT, "POST", "/execute", {"json": {"command": "echo out; echo err >&2; exit 3"}}),
    ("execute stdin env cwd", HOT, "POST", "/execute",
     {"json": {"command": 'cat; echo "$X"; pwd', "stdin_b64": "aW4K", "env": {"X": "x"}, "cwd": "<WORKDIR>"}}),
    ("execute output limit", HOT, "POST", "/execute", {"json": {"command": "seq 1000", "output_limit": 50}}),
    ("execute missing cwd", HOT, "POST", "/execute", {"json": {"command": "true", "cwd": "<WORKDIR>/nope"}}),
    ("execute bad stdin", FASTAPI, "POST", "/execute", {"json": {"command": "cat", "stdin_b64": "%%%"}}),
    ("execute bad env", FASTAPI, "POST", "/execute", {"json": {"command": "true", "env": {"A=B": "x"}}}),
    ("write", HOT, "POST", "/files/write", {"json": {"file_path": "<WORKDIR>/f.txt", "content": "a\nb\nüñí\n"}}),
    ("write again", HOT, "POST", "/files/write", {"json": {"file_path": "<WORKDIR>/f.txt", "content": "x"}}),
    ("read", HOT, "POST", "/files/read", {"json": {"file_path": "<WORKDIR>/f.txt", "offset": 1, "limit": 1}}),
    ("read missing", HOT, "POST", "/files/read", {"json": {"file_path": "<WORKDIR>/missing"}}),
    ("edit", HOT, "POST", "/files/edit",
     {"json": {"file_path": "<WORKDIR>/f.txt", "old_string": "b", "new_string": "c"}}),
    ("ls", HOT, "POST", "/files/ls", {"json": {"path": "<WORKDIR>"}}),
    ("grep", HOT, "POST", "/files/grep", {"json": {"pattern": "c", "path": "<WORKDIR>"}}),
    ("glob", HOT, "POST", "/files/glob", {"json": {"pattern": "*.txt", "path": "<WORKDIR>"}}),
    ("upload", HOT, "POST", "/files/upload", {"json": {"files": [{"path": "<WORKDIR>/u.bin", "content_b64": "AAH/"}]}}),
    ("upload bad base64", FASTAPI, "POST", "/files/upload",
     {"json": {"files": [{"path": "<WORKDIR>/v.bin", "content_b64": "!!"}]}}),
    ("download", HOT, "POST", "/files/download", {"json": {"paths": ["<WORKDIR>/u.bin", "<WORKDIR>/none"]}}),
    ("delete", HOT, "POST", "/files/delete", {"json": {"file_path": "<WORKDIR>/u.bin"}}),
    ("missing field", FASTAPI, "POST", "/execute", {"json": {}}),
    ("extra field", FASTAPI, "POST", "/execute", {"json": {"command": "true", "bogus": 1}}),
    ("wrong type", FASTAPI, "POST", "/files/read", {"json": {"file_path": "x", "offset": "many"}}),
    ("not an object", FASTAPI, "POST", "/execute", {"json": ["true"]}),
    ("broken json", FASTAPI, "POST", "/execute", {"content": b'{"command": ', "headers": JSON}),
    ("not utf-8", FASTAPI, "POST", "/execute", {"content": b'{"command": "\xff"}', "headers": JSON}),
    ("empty body", FASTAPI, "POST", "/execute", {"content": b"", "headers": JSON}),
    ("text content type", FASTAPI, "POST", "/execute",
     {"content": b'{"command": "true"}', "headers": {"Content-Type": "text/plain"}}),
    ("json charset", FASTAPI, "POST", "/execute",
     {"content": b'{"command": "true"}', "headers": {"Content-Type": "application/json; charset=utf-8"}}),
    ("lone surrogate", FASTAPI, "POST", "/files/read",
     {"content": b'{"file_path": "/x/\\ud800"}', "headers": JSON}),
    ("deep nesting", FASTAPI, "POST", "/execute",
     {"content": b'{"command": ' + b"[" * 5000 + b"]" * 5000 + b"}", "headers": JSON}),
    ("big body", HOT, "POST", "/files/write",
     {"json": {"file_path": "<WORKDIR>/big.txt", "content": "b" * (LIMIT - 1000)}}),
    ("no key", MIDDLEWARE, "POST", "/execute", {"json": {"command": "true"}, "headers": {"Authorization": ""}}),
    ("wrong key", MIDDLEWARE, "GET", "", {"headers": {"Authorization": "Bearer wrong"}}),
    ("basic scheme", MIDDLEWARE, "POST", "/files/read",
     {"json": {"file_path": "x"}, "headers": {"Authorization": "Basic key-alice-0123456789"}}),
    ("unknown sandbox", HOT, "POST", "/v1/sandboxes/does-not-exist/execute", {"json": {"command": "true"}}),
    ("foreign sandbox", HOT, "POST", "/v1/sandboxes/<FOREIGN>/files/read", {"json": {"file_path": "/etc/hosts"}}),
    ("foreign sandbox get", HOT, "GET", "/v1/sandboxes/<FOREIGN>", {}),
    ("unknown operation", MIDDLEWARE, "POST", "/files/nope", {"json": {"path": "x"}}),
    ("wrong method", MIDDLEWARE, "GET", "/execute", {}),
    ("trailing slash", MIDDLEWARE, "POST", "/execute/", {"json": {"command": "true"}}),
    ("oversized, declared", MIDDLEWARE, "POST", "/execute", {"json": {"command": "y" * (LIMIT + 10)}}),
    ("oversized, chunked", HOT, "POST", "/execute", {"content": _chunked_oversized, "headers": JSON}),
]  # fmt: skip

_MEANINGFUL_HEADERS = ("content-type", "www-authenticate", "retry-after", "allow")


def _metrics(client: httpx.Client) -> dict[str, float]:
    counted = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(("sandboxes_errors_total{", "sandboxes_requests_total{")):
            name, value = line.rsplit(" ", 1)
            counted[name] = float(value)
    return counted


def _send(
    client: httpx.Client, sandboxes: _Sandboxes, hot: bool, method: str, path: str, options: dict[str, Any]
) -> httpx.Response:
    def fill(text: str) -> str:
        return text.replace("<WORKDIR>", sandboxes.workdirs[hot]).replace("<FOREIGN>", sandboxes.foreign[hot])

    url = fill(path) if path.startswith("/v1/") else f"/v1/sandboxes/{sandboxes.ids[hot]}{path}"
    options = dict(options)
    if "json" in options:
        options["json"] = json.loads(fill(json.dumps(options["json"])))
    if callable(options.get("content")):
        options["content"] = options["content"]()
    return client.request(method, url, **options)


def _normalised(response: httpx.Response, sandboxes: _Sandboxes, hot: bool) -> dict[str, Any]:
    text = response.text
    for placeholder, value in (
        ("<WORKDIR>", sandboxes.workdirs[hot]),
        ("<ID>", sandboxes.ids[hot]),
        ("<FOREIGN>", sandboxes.foreign[hot]),
    ):
        text = text.replace(value, placeholder)
    text = re.sub(r'"duration_ms":\s*[0-9.e+-]+', '"duration_ms": 0', text)
    text = re.sub(r'"(created_at|expires_at|modified_at)":\s*[0-9.e+-]+', r'"\1": 0', text)
    text = re.sub(r'"request_id":\s*"[^"]*"', '"request_id": "-"', text)
    return {
        "status": response.status_code,
        "body": text,
        "headers": {name: response.headers.get(name) for name in _MEANINGFUL_HEADERS},
    }


@pytest.mark.parametrize(("name", "served_by", "method", "path", "options"), CASES, ids=[c[0] for c in CASES])
def test_same_answer_with_and_without_the_hot_path(
    service: Running,
    switch: _Switch,
    sandboxes: _Sandboxes,
    name: str,
    served_by: str,
    method: str,
    path: str,
    options: dict[str, Any],
) -> None:
    answers = {}
    counted = {}
    with service.client("alice") as client:
        for hot in (True, False):
            switch.use_hot_path(hot)
            try:
                before = _metrics(client)
                before_calls = switch.calls
                response = _send(client, sandboxes, hot, method, path, options)
                handed_over = switch.calls - before_calls
                after = _metrics(client)
                if hot:
                    expected = 1 if served_by == FASTAPI else 0
                    assert handed_over == expected, f"{name}: handed to FastAPI {handed_over}x, not {expected}x"
            finally:
                switch.use_hot_path(True)
            answers[hot] = _normalised(response, sandboxes, hot)
            counted[hot] = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
            assert response.headers.get("x-request-id"), name
    assert answers[True] == answers[False]
    assert counted[True] == counted[False]
    assert counted[True], "every request is counted in the metrics"


def test_rate_limit_on_the_hot_path(service: Running, switch: _Switch) -> None:
    """The token is taken on the fast path too, and a refusal there is FastAPI's refusal."""
    with service.client("slow") as slow:
        sandbox = create(slow)  # the burst's first token
        path = f"/v1/sandboxes/{sandbox['id']}/files/ls"
        before = switch.calls
        first = slow.post(path, json={"path": sandbox["workdir"]})
        refused = slow.post(path, json={"path": sandbox["workdir"]})
        assert switch.calls == before  # both answered by the fast path
        assert first.status_code == 200
        assert (refused.status_code, error_of(refused)) == (429, "rate_limited")
        assert int(refused.headers["retry-after"]) >= 1
        assert re.fullmatch(r"tenant 'slow' exceeds 0\.5 requests/s; retry in [0-9.]+s", refused.json()["message"])
        switch.use_hot_path(False)
        try:
            also_refused = slow.get(f"/v1/sandboxes/{sandbox['id']}")
        finally:
            switch.use_hot_path(True)
        assert (also_refused.status_code, error_of(also_refused)) == (429, "rate_limited")


def test_one_route_table_and_one_authentication(service: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing dispatches requests in front of the app's router: the request middleware hands
    every request to FastAPI's own exception middleware, the fast paths are routes of the app's
    one table (no router nested in it), and a request is authenticated once, by
    `request_tenant`, fast path or not."""
    layers = []
    layer = service.app.middleware_stack
    while layer is not None:
        layers.append(type(layer).__name__)
        layer = getattr(layer, "app", None)
    assert layers[layers.index("_RequestMiddleware") + 1] == "ExceptionMiddleware", layers
    nested = [route for route in service.app.routes if isinstance(route, Mount | Host | Router)]
    assert not nested, f"a router nested in the table: {nested}"
    authenticated: list[str | None] = []
    authenticate = Authenticator.authenticate

    def counted(self: Authenticator, authorization: str | None) -> Any:
        authenticated.append(authorization)
        return authenticate(self, authorization)

    monkeypatch.setattr(Authenticator, "authenticate", counted)
    with service.client("alice") as client:
        sandbox = create(client)
        requests = [
            ("GET", f"/v1/sandboxes/{sandbox['id']}", None),
            ("POST", f"/v1/sandboxes/{sandbox['id']}/execute", {"command": "true"}),
            ("POST", f"/v1/sandboxes/{sandbox['id']}/execute", {"command": "true", "bogus": 1}),
            ("POST", f"/v1/sandboxes/{sandbox['id']}/files/ls", {"path": sandbox["workdir"]}),
            ("GET", "/v1/sandboxes", None),
        ]
        for method, path, body in requests:
            authenticated.clear()
            response = client.request(method, path, json=body)
            assert response.status_code in (200, 422), response.text
            assert len(authenticated) == 1, (method, path, body)
        client.delete(f"/v1/sandboxes/{sandbox['id']}")
