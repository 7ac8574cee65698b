"""The same episode on DockerSandbox and through the service (RemoteSandbox), and a resumed
thread reattaching to its container."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import FileEpisode, ask, thread, tool_results
from langgraph.checkpoint.memory import InMemorySaver
from support import SESSION_OWNER

from agent import ProviderAdapter, RemoteProvider, create_sandbox_agent, lifecycle_of
from agent.testing import ScriptedChatModel, call, say
from sandboxes.docker import DockerSandboxConfig
from sandboxes.docker.provider import DockerProvider as Docker
from sandboxes.ssh.provider import SSHProvider as SSH
from sandboxes.ssh.provider import SSHProviderConfig

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
from service_harness import KEYS, running, settings_for


@pytest.fixture
def docker_provider(docker_client: Any, runtime_image: str) -> ProviderAdapter:
    template = DockerSandboxConfig(image=runtime_image, owner=SESSION_OWNER)
    return ProviderAdapter(Docker(template, client=docker_client))


@pytest.fixture
def remote_provider(tmp_path: Path) -> Iterator[RemoteProvider]:
    with running(settings_for(tmp_path / "service")) as service:
        provider = RemoteProvider(service.url, KEYS["alice"], ttl=600)
        yield provider
        provider.client.close()


@pytest.fixture
def ssh_provider(docker_client: Any, tmp_path: Path) -> Iterator[ProviderAdapter]:
    from ssh_fixtures import start_vm

    vm = start_vm(tmp_path / "ssh")
    try:
        yield ProviderAdapter(SSH(SSHProviderConfig(hosts=[vm.host_config()], workspace_root="/tmp/agent-ws")))
    finally:
        vm.stop()


def episode_then_reattach(provider: ProviderAdapter | RemoteProvider) -> str:
    """The file episode, then the same thread from a fresh agent (an empty registry, as in a new
    process) reattaches to the sandbox by the id in its checkpoint. Returns the sandbox id."""
    checkpointer = InMemorySaver()
    config = thread()
    episode = FileEpisode()
    graph = create_sandbox_agent(episode.model, sandbox=provider, checkpointer=checkpointer)
    state = graph.invoke(ask("work"), config)
    sandbox_id: str = state["sandbox_id"]
    try:
        episode.check(graph, state)
        lifecycle_of(graph).close()  # this "process" lets go; the sandbox lives on
        look = call("execute", command="cat out.txt")
        model = ScriptedChatModel(steps=[say("", look), say("still there")])
        fresh = create_sandbox_agent(model, sandbox=provider, checkpointer=checkpointer)
        resumed = fresh.invoke(ask("is it there?"), config)
        assert resumed["sandbox_id"] == sandbox_id
        assert tool_results(resumed)[look["id"]] == "from-sh\n[exit code 0]"
        assert lifecycle_of(fresh).live == (sandbox_id,)
    finally:
        provider.release(provider.attach(sandbox_id))
    with pytest.raises(LookupError):  # what SandboxMiddleware replaces a gone sandbox on
        provider.attach(sandbox_id)
    return sandbox_id


def test_episode_on_docker_and_reattach(docker_provider: ProviderAdapter, docker_client: Any) -> None:
    import docker.errors

    sandbox_id = episode_then_reattach(docker_provider)
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(sandbox_id)


def test_episode_through_the_service_and_reattach(remote_provider: RemoteProvider) -> None:
    from sandboxes.client import NotFound

    sandbox_id = episode_then_reattach(remote_provider)
    with pytest.raises(NotFound):
        remote_provider.client.get(sandbox_id)


def test_episode_on_ssh_and_reattach(ssh_provider: ProviderAdapter) -> None:
    sandbox_id = episode_then_reattach(ssh_provider)
    assert sandbox_id.partition("@")[2].startswith("127.0.0.1:")  # its ref: user@host:port:workspace
    with pytest.raises(LookupError, match="no workspace"):  # released: its workspace is gone
        ssh_provider.attach(sandbox_id)


def test_large_results_and_scratch_through_the_service(remote_provider: RemoteProvider) -> None:
    big = call("execute", command="seq 1 30000")
    keep = call("write_file", file_path="/scratch/n.txt", content="kept")
    model = ScriptedChatModel(steps=[say("", big, keep), say("ok")])
    graph = create_sandbox_agent(model, sandbox=remote_provider, release="end", large_result_chars=20_000)
    state = graph.invoke(ask("count"))
    assert f"saved in full at /large_tool_results/{big['id']}" in tool_results(state)[big["id"]]
    assert state["files"][f"/large_tool_results/{big['id']}"]["content"].endswith("29999\n30000\n[exit code 0]")
    assert state["files"]["/scratch/n.txt"]["content"] == "kept"
    assert state.get("sandbox_id") is None  # released at the end of the run
