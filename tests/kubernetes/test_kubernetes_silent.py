"""KubernetesSandbox: a silent command is never idleness on the exec helper's connection. The
client side of the websocket has no read timeout (the FAKE API server's transport cannot show
one: checked at the unit level below), and the stream pings the server while open, so a proxy
in front of a real API server that cuts idle connections sees traffic however quiet a command."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fake_apiserver import FakeKubernetes
from support import SESSION_OWNER, wait_for

from sandboxes.kubernetes import KubernetesSandbox, KubernetesSandboxConfig
from sandboxes.kubernetes import _exec as kube_exec

_KEEPALIVE = 0.1


@pytest.fixture
def sandbox(
    fake_kubernetes: FakeKubernetes, runtime_image: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[KubernetesSandbox]:
    from kubernetes import client

    monkeypatch.setattr(kube_exec, "KEEPALIVE", _KEEPALIVE, raising=False)
    api_client = client.ApiClient(client.Configuration(host=fake_kubernetes.url))
    config = KubernetesSandboxConfig(image=runtime_image, owner=SESSION_OWNER)
    with KubernetesSandbox.create(config, api_client=api_client) as created:
        assert created.execute("true").exit_code == 0
        yield created


def _helper_stream(sandbox: KubernetesSandbox) -> kube_exec.ExecStream:
    mux = sandbox.helper_driver.mux
    assert mux is not None
    stream = mux._stream
    assert isinstance(stream, kube_exec.ExecStream)
    return stream


def test_the_helpers_websocket_has_no_read_timeout(sandbox: KubernetesSandbox) -> None:
    stream = _helper_stream(sandbox)
    assert stream._ws.gettimeout() is None
    assert stream._ws.sock.gettimeout() is None


def test_the_helpers_stream_pings_while_a_command_is_silent(sandbox: KubernetesSandbox) -> None:
    stream = _helper_stream(sandbox)
    before = stream.pongs
    result = sandbox.execute("sleep 1; echo done", timeout=30)
    assert (result.exit_code, result.error, result.output) == (0, None, "done\n"), result
    wait_for(lambda: stream.pongs >= before + 3, "three pongs to the pings sent during a silent second")
    assert sandbox.helper_driver.mux is not None
    assert sandbox.helper_driver.mux._stream is stream  # the same helper throughout
