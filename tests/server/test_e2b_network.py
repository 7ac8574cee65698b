"""E2B's ``network`` options through the real SDK, sync and async, on a local jail whose template
has egress (`sandboxes.server.e2b.models`): a ``deny_out`` narrower than all traffic leaves the
rest open and ``allow_out`` wins over it, at create and through ``update_network``; ``rules``'
transforms are headers the egress proxy adds (the value never in the sandbox); ``allow_public_traffic``
opens the sandbox's ports to requests without its token and ``mask_request_host`` is the ``Host``
they carry. Every target is a server this test starts on 127.0.0.2 or 127.0.0.3, or in the
sandbox; a refused one is never connected to."""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import ALL_TRAFFIC, AsyncSandbox, Sandbox, SandboxException
from e2b_harness import opts
from egress_targets import Target, targets_fixture
from service_harness import Running, running, settings_for
from support import HAS_BWRAP, needs

from sandboxes.local import LocalTemplate
from sandboxes.server.e2b.models import Network, egress_allow, network_of
from sandboxes.server.egress.policy import EgressPolicy, decide

TOKEN = "e2b-transform-value-123"
APP_PORT = 8080


targets = targets_fixture()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    needs(HAS_BWRAP, "bubblewrap is not installed")
    template = LocalTemplate(default_timeout=60, egress=True, egress_open_ranges=["127.0.0.0/8"])
    with running(settings_for(tmp_path_factory.mktemp("e2b-network"), templates={"default": template})) as svc:
        yield svc


_FETCH = (
    "import sys, urllib.request, urllib.error\n"
    "try:\n"
    "    print(urllib.request.urlopen(sys.argv[1], timeout=20).read().decode())\n"
    "except urllib.error.HTTPError as exc:\n"
    "    print(exc.code, exc.read().decode().strip())\n"
)


def _fetch(url: str) -> str:
    """A command printing what urllib gets at ``url`` through the sandbox's proxy, or the refusal."""
    return f"python3 -c {shlex.quote(_FETCH)} {shlex.quote(url)}"


def _reached(sandbox: Sandbox, url: str) -> str:
    """What a fetch of ``url`` printed, once the sandbox's proxy listens (it starts with the sandbox)."""
    deadline = time.monotonic() + 30
    while True:
        out = sandbox.commands.run(_fetch(url), timeout=60).stdout.strip()
        if out.startswith(("hello", "403")) or time.monotonic() > deadline:
            return out
        time.sleep(0.1)


async def _areached(sandbox: AsyncSandbox, url: str) -> str:
    deadline = time.monotonic() + 30
    while True:
        out = (await sandbox.commands.run(_fetch(url), timeout=60)).stdout.strip()
        if out.startswith(("hello", "403")) or time.monotonic() > deadline:
            return out
        await asyncio.sleep(0.1)


def test_a_narrower_deny_out_leaves_the_rest_open_and_update_network_changes_it(
    service: Running, targets: tuple[Target, Target]
) -> None:
    open_, denied = targets
    sandbox = Sandbox.create(network={"deny_out": ["127.0.0.3"]}, **opts(service))
    try:
        reached = len(denied.seen)
        assert _reached(sandbox, open_.url) == "hello from 127.0.0.2"
        assert _reached(sandbox, denied.url).startswith("403 egress refused")
        assert len(denied.seen) == reached  # never connected to
        info = sandbox.get_info()
        assert (info.allow_internet_access, info.network) == (None, {"deny_out": ["127.0.0.3"]})
        sandbox.update_network({"deny_out": ["127.0.0.2/32"]})  # the next connection on
        assert _reached(sandbox, denied.url) == "hello from 127.0.0.3"
        assert _reached(sandbox, open_.url).startswith("403 egress refused")
        with pytest.raises(SandboxException, match="denyOut takes addresses"):
            sandbox.update_network({"deny_out": ["example.com"]})  # E2B: no names in denyOut
        sandbox.update_network({"deny_out": [ALL_TRAFFIC]})
        assert _reached(sandbox, denied.url).startswith("403 egress refused")
        assert sandbox.get_info().network == {"allow_out": [], "deny_out": [ALL_TRAFFIC]}
    finally:
        sandbox.kill()


def test_allow_out_wins_over_a_narrower_deny_out_async(service: Running, targets: tuple[Target, Target]) -> None:
    open_, excepted = targets

    async def scenario() -> tuple[str, str, Any, str]:
        network: Any = {"deny_out": ["127.0.0.0/8"], "allow_out": ["127.0.0.3"]}
        sandbox = await AsyncSandbox.create(network=network, **opts(service))
        try:
            allowed = await _areached(sandbox, excepted.url)
            refused = await _areached(sandbox, open_.url)
            info = await sandbox.get_info()
            await sandbox.update_network({"allow_internet_access": True})  # every public destination, and opened ranges
            return allowed, refused, info.network, await _areached(sandbox, open_.url)
        finally:
            await sandbox.kill()

    allowed, refused, network, after = asyncio.run(scenario())
    assert allowed == "hello from 127.0.0.3"
    assert refused.startswith("403 egress refused")
    assert network == {"allow_out": ["127.0.0.3"], "deny_out": ["127.0.0.0/8"]}
    assert after == "hello from 127.0.0.2"


def test_a_rules_transform_adds_its_headers_and_update_network_replaces_them(
    service: Running, targets: tuple[Target, Target]
) -> None:
    target = targets[0]
    rules: Any = {"127.0.0.2": [{"transform": {"headers": {"X-Test-Token": TOKEN}}}]}
    network: Any = {"allow_out": ["127.0.0.2"], "deny_out": [ALL_TRAFFIC], "rules": rules}
    sandbox = Sandbox.create(network=network, **opts(service))
    try:
        assert _reached(sandbox, target.url) == "hello from 127.0.0.2"
        assert target.seen[-1]["x-test-token"] == TOKEN
        looked = sandbox.commands.run("env; ps aux; grep -rl e2b-transform ~ /tmp 2>/dev/null; true").stdout
        assert TOKEN not in looked
        assert sandbox.get_info().network == {"allow_out": ["127.0.0.2"], "deny_out": [ALL_TRAFFIC], "rules": rules}
        sandbox.update_network({"allow_out": ["127.0.0.2"], "deny_out": [ALL_TRAFFIC]})  # rules omitted: cleared
        assert _reached(sandbox, target.url) == "hello from 127.0.0.2"
        assert "x-test-token" not in target.seen[-1]
        with pytest.raises(SandboxException, match="not a host name"):
            sandbox.update_network({"rules": {"*": [{"transform": {"headers": {"X-A": "b"}}}]}})
    finally:
        sandbox.kill()


def test_rules_set_by_update_network_reach_the_next_request_async(
    service: Running, targets: tuple[Target, Target]
) -> None:
    target = targets[1]

    async def scenario() -> tuple[str, dict[str, str], str, dict[str, str]]:
        sandbox = await AsyncSandbox.create(allow_internet_access=True, **opts(service))
        try:
            first = await _areached(sandbox, target.url)
            before = dict(target.seen[-1])
            rules: Any = {"127.0.0.3": [{"transform": {"headers": {"Authorization": f"Bearer {TOKEN}"}}}]}
            await sandbox.update_network({"allow_internet_access": True, "rules": rules})
            second = await _areached(sandbox, target.url)
            return first, before, second, dict(target.seen[-1])
        finally:
            await sandbox.kill()

    first, before, second, after = asyncio.run(scenario())
    assert first == second == "hello from 127.0.0.3"
    assert "authorization" not in before
    assert after["authorization"] == f"Bearer {TOKEN}"


def _serve_in(sandbox: Sandbox) -> None:
    """The preview app on `APP_PORT` inside the sandbox, listening once this returns."""
    sandbox.files.write("app.py", (Path(__file__).parent / "preview_app.py").read_text())
    sandbox.commands.run(f"exec python3 app.py {APP_PORT}", background=True)
    probe = f"import socket, time\nwhile socket.socket().connect_ex(('127.0.0.1', {APP_PORT})): time.sleep(0.05)"
    sandbox.commands.run(f"timeout 20 python3 -c {shlex.quote(probe)}")


def test_allow_public_traffic_opens_the_ports_with_the_masked_host(service: Running) -> None:
    network: Any = {"allow_public_traffic": True, "mask_request_host": "custom-host.example.com:${PORT}"}
    public = Sandbox.create(network=network, **opts(service))
    private = Sandbox.create(network={"allow_public_traffic": False}, **opts(service))
    try:
        for made in (public, private):
            _serve_in(made)
        url = f"{service.url}/e2b/envd/headers"
        answer = httpx.get(url, headers={"E2b-Sandbox-Id": public.sandbox_id, "E2b-Sandbox-Port": str(APP_PORT)})
        assert answer.status_code == 200, answer.text
        seen = {key.lower(): value for key, value in json.loads(answer.text).items()}
        assert seen["host"] == f"custom-host.example.com:{APP_PORT}"
        refused = httpx.get(url, headers={"E2b-Sandbox-Id": private.sandbox_id, "E2b-Sandbox-Port": str(APP_PORT)})
        assert refused.status_code == 403  # as E2B's own test_allow_public_traffic_false expects
        token = {"E2B-Traffic-Access-Token": private.traffic_access_token or ""}
        headers = {"E2b-Sandbox-Id": private.sandbox_id, "E2b-Sandbox-Port": str(APP_PORT), **token}
        assert httpx.get(url, headers=headers).status_code == 200
        assert public.get_info().network == network
        assert private.get_info().network == {"allow_public_traffic": False}
    finally:
        public.kill()
        private.kill()
    gone = httpx.get(url, headers={"E2b-Sandbox-Id": public.sandbox_id, "E2b-Sandbox-Port": str(APP_PORT)})
    assert gone.status_code == 403  # killed: public no more


def test_allow_public_traffic_is_reported_async(service: Running) -> None:
    async def scenario() -> Any:
        sandbox = await AsyncSandbox.create(network={"allow_public_traffic": True}, **opts(service))
        try:
            return (await AsyncSandbox.get_info(sandbox.sandbox_id, **opts(service))).network
        finally:
            await sandbox.kill()

    assert asyncio.run(scenario()) == {"allow_public_traffic": True}


@pytest.mark.parametrize(
    ("sent", "internet", "reported"),
    [
        ({"denyOut": ["8.8.8.8"]}, None, {"denyOut": ["8.8.8.8"]}),
        (
            {"allowOut": ["1.1.1.1", "example.com:443"], "denyOut": ["8.8.8.0/24", "2001:4860::/32"]},
            None,
            {"allowOut": ["1.1.1.1", "example.com:443"], "denyOut": ["8.8.8.0/24", "2001:4860::/32"]},
        ),
        (
            {"allowOut": ["1.1.1.1"], "denyOut": ["0.0.0.0/0"]},
            False,
            {"allowOut": ["1.1.1.1"], "denyOut": ["0.0.0.0/0"]},
        ),
    ],
)
def test_what_a_network_allows_reads_back_as_sent(
    sent: dict[str, list[str]], internet: bool | None, reported: dict[str, list[str]]
) -> None:
    allow = egress_allow(None, Network.model_validate(sent))
    assert allow is not None
    assert network_of(allow) == (internet, reported)


def test_a_narrower_deny_out_is_decided_on_addresses_and_bounded() -> None:
    allow = egress_allow(None, Network.model_validate({"denyOut": ["8.8.8.8"], "allowOut": ["dns.google"]}))
    assert allow is not None
    policy = EgressPolicy(allow=allow)
    assert not decide(policy, "rebound.example", 443, ["8.8.8.8"]).allowed  # whatever the name
    assert decide(policy, "dns.google", 443, ["8.8.8.8"]).allowed  # allowOut wins
    assert decide(policy, "one.one.one.one", 443, ["1.1.1.1"]).allowed
    assert decide(policy, "v6.example", 443, ["2606:4700::1111"]).allowed
    assert egress_allow(True, Network()) == ["*"]
    assert network_of(["*"]) == (True, None)
    with pytest.raises(ValueError, match="more networks"):  # some 30 scattered addresses at most
        egress_allow(None, Network.model_validate({"denyOut": [f"{n}.0.0.1" for n in range(1, 60)]}))
