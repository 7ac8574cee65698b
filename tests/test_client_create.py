"""The client's creates against the real service: each logical create carries one
``Idempotency-Key`` on all its attempts, so a create whose answer was lost is retried and
answers the sandbox its first attempt made, never a second one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from server.service_harness import KEYS, Running, running, settings_for

from sandboxes.client import AsyncSandboxClient, QuotaExceeded, SandboxClient, _ops
from sandboxes.client import _wire as w
from sandboxes.client.errors import error_from_response


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with running(settings_for(tmp_path_factory.mktemp("client-create"))) as svc:
        yield svc


class _LosesAnswers(httpx.BaseTransport):
    """Sends every request to the service, and loses the answers of the first ``lose``
    creates once the service has made their sandbox (a connection cut while the answer
    travels back); records the ``Idempotency-Key`` of every create sent."""

    def __init__(self, lose: int) -> None:
        self.inner = httpx.HTTPTransport()
        self.lose = lose
        self.keys: list[str | None] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.method == "POST" and request.url.path == "/v1/sandboxes":
            self.keys.append(request.headers.get("idempotency-key"))
            if self.lose > 0:
                self.lose -= 1
                response.read()
                response.close()
                raise httpx.ReadError("the answer was lost on the way", request=request)
        return response

    def close(self) -> None:
        self.inner.close()


def _ids(client: SandboxClient) -> set[str]:
    return {info.id for info in client.list()}


def test_a_create_whose_answers_were_lost_makes_one_sandbox(service: Running) -> None:
    lossy = _LosesAnswers(lose=3)
    with (
        SandboxClient(service.url, KEYS["alice"]) as plain,
        SandboxClient(service.url, KEYS["alice"], transport=lossy, retries=4, backoff=0.01) as c,
    ):
        before = _ids(plain)
        sandbox = c.create(labels={"lost": "answers"})
        try:
            assert _ids(plain) - before == {sandbox.id}
            assert len(lossy.keys) == 4
            assert len(set(lossy.keys)) == 1
            assert lossy.keys[0]
        finally:
            plain.delete(sandbox.id)


def test_each_create_has_its_own_key_unless_given_one(service: Running) -> None:
    with SandboxClient(service.url, KEYS["alice"]) as c:
        one, two = c.create(), c.create()
        assert one.id != two.id
        key = str(uuid.uuid4())
        three = c.create(idempotency_key=key)
        assert c.create(idempotency_key=key).id == three.id
        for sandbox in (one, two, three):
            sandbox.destroy()


async def test_the_async_client_sends_a_key_too(service: Running) -> None:
    key = str(uuid.uuid4())
    async with AsyncSandboxClient(service.url, KEYS["alice"]) as c:
        first = await c.create(idempotency_key=key)
        assert (await c.create(idempotency_key=key)).id == first.id
        await first.adestroy()


def test_a_quota_refusal_is_retried_only_when_waiting_helps() -> None:
    request = httpx.Request("POST", "http://127.0.0.1/v1/sandboxes")
    body = {"error": "quota_exceeded", "message": "10 live sandboxes", "request_id": "r"}
    later = error_from_response(httpx.Response(429, json=body, headers={"retry-after": "3"}, request=request))
    never = error_from_response(httpx.Response(403, json=body, request=request))
    assert isinstance(later, QuotaExceeded)
    assert isinstance(never, QuotaExceeded)
    assert (later.retry_after, never.retry_after) == (3, None)
    keyed = _ops.create("default", None, None, None, "k")
    assert keyed.headers == {"Idempotency-Key": "k"}
    assert w.may_retry(keyed, later)
    assert not w.may_retry(keyed, never)
    unkeyed = _ops.create("default", None, None, None)
    assert not w.may_retry(unkeyed, later)  # without a key a retry could make a second sandbox
