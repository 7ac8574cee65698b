"""KubernetesSandbox's exec helper over the FAKE API server (`fake_apiserver`, its exec
WebSocket bridged to a real container): a command written to the helper whose answer was lost
answers ``connection_lost`` and ran once; one whose request could not be written whole goes to
a new helper, transparently (`sandboxes._mux.MuxBroken.may_resend`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from mux_faults import FaultyStream, assert_an_unanswered_command_runs_once, assert_an_unsent_command_is_resent, faulty
from support import SESSION_OWNER

from sandboxes.kubernetes import KubernetesSandbox, KubernetesSandboxConfig
from sandboxes.kubernetes import sandbox as kubernetes_sandbox


@pytest.fixture
def patched(
    kube_api_client: Any, runtime_image: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[KubernetesSandbox, list[FaultyStream]]]:
    streams = faulty(monkeypatch, kubernetes_sandbox)
    config = KubernetesSandboxConfig(image=runtime_image, owner=SESSION_OWNER)
    with KubernetesSandbox.create(config, api_client=kube_api_client) as sandbox:
        yield sandbox, streams


def test_a_command_whose_answer_was_lost_is_never_run_twice(
    patched: tuple[KubernetesSandbox, list[FaultyStream]],
) -> None:
    sandbox, streams = patched
    assert_an_unanswered_command_runs_once(sandbox, streams, "/workspace/ran")


def test_a_command_not_written_whole_is_resent_to_a_new_helper(
    patched: tuple[KubernetesSandbox, list[FaultyStream]],
) -> None:
    sandbox, streams = patched
    assert_an_unsent_command_is_resent(sandbox, streams, "/workspace/ran")
