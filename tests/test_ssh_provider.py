"""SSHProvider over two real sshd hosts (`sandboxes/ssh-vm` containers on loopback): where
sandboxes are placed, how the load follows creates and destroys, what a restarted provider
measures, and how a host that is down is skipped.

Each test uses its own workspace root on the two shared hosts, so their loads are independent.
Workspace directories are checked through ``docker exec``, not through the provider or SSH."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from ssh_fixtures import SSHVM, free_port, start_vm

from sandboxes.ssh import SSHHostConfig, SSHSandbox, SSHSandboxConfig, SSHUnreachableError, UserPoolError
from sandboxes.ssh.provider import SSHProvider, SSHProviderConfig

PROVIDER_LOG = "sandboxes.ssh.provider"


@pytest.fixture(scope="module")
def vms(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SSHVM, SSHVM]]:
    first = start_vm(tmp_path_factory.mktemp("ssh-a"))
    try:
        second = start_vm(tmp_path_factory.mktemp("ssh-b"))
    except Exception:
        first.stop()
        raise
    yield first, second
    first.stop()
    second.stop()


@pytest.fixture
def root() -> str:
    return f"/tmp/ws-{uuid.uuid4().hex[:8]}"


def _config(vms: tuple[SSHVM, ...], root: str, **overrides: Any) -> SSHProviderConfig:
    return SSHProviderConfig(hosts=[vm.host_config() for vm in vms], workspace_root=root, **overrides)


def _label(vm: SSHVM) -> str:
    return f"sandbox@127.0.0.1:{vm.port}"


def _on_disk(vm: SSHVM, root: str) -> set[str]:
    """Workspace directories under ``root``, seen through docker exec (not SSH)."""
    result = vm.docker.exec_run(["sh", "-c", f"[ -d {root} ] && ls -1 {root} || true"], user="sandbox")
    assert result.exit_code == 0, result.output
    return {f"{root}/{name}" for name in result.output.decode().split()}


def _port(sandbox: SSHSandbox) -> int:
    return sandbox.config.host.port


# ---------------------------------------------------------------------- configuration


def test_config_refuses_no_hosts_duplicates_and_relative_roots() -> None:
    host = SSHHostConfig(host="127.0.0.1", port=2222, username="sandbox")
    with pytest.raises(ValidationError):
        SSHProviderConfig(hosts=[])
    with pytest.raises(ValidationError, match="listed twice"):
        SSHProviderConfig(hosts=[host, host.model_copy()])
    with pytest.raises(ValidationError):
        SSHProviderConfig(hosts=[host], workspace_root="relative/root")
    other_user = host.model_copy(update={"username": "other"})
    assert len(SSHProviderConfig(hosts=[host, other_user]).hosts) == 2


# ---------------------------------------------------------------------- placement


def test_placement_alternates_then_fills_the_emptier_host(vms: tuple[SSHVM, SSHVM], root: str) -> None:
    a, b = vms
    provider = SSHProvider(_config(vms, root))
    try:
        first = [provider.create() for _ in range(4)]
        assert [_port(s) for s in first] == [a.port, b.port, a.port, b.port]
        assert provider.loads == {_label(a): 2, _label(b): 2}
        assert _on_disk(a, root) == {s.workspace for s in first if _port(s) == a.port}
        assert len(_on_disk(b, root)) == 2

        for sandbox in first:  # destroyed by its holder, not through the provider
            if _port(sandbox) == b.port:
                sandbox.destroy()
        assert provider.loads == {_label(a): 2, _label(b): 0}
        assert _on_disk(b, root) == set()
        assert [_port(provider.create()) for _ in range(3)] == [b.port, b.port, a.port]
        assert provider.loads == {_label(a): 3, _label(b): 2}

        assert len(provider.sandboxes) == 5
        provider.destroy_all()
        assert provider.loads == {_label(a): 0, _label(b): 0}
        assert not provider.sandboxes
        assert _on_disk(a, root) == set()
        assert _on_disk(b, root) == set()
    finally:
        provider.destroy_all()


def test_concurrent_creates_spread_evenly(vms: tuple[SSHVM, SSHVM], root: str) -> None:
    """A create counts against its host before connecting, so parallel creates cannot all
    see the same empty host."""
    a, b = vms
    provider = SSHProvider(_config(vms, root))
    made: list[SSHSandbox] = []
    errors: list[BaseException] = []

    def create() -> None:
        try:
            made.append(provider.create())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(6)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        assert sorted(_port(s) for s in made) == sorted([a.port] * 3 + [b.port] * 3)
        assert provider.loads == {_label(a): 3, _label(b): 3}
        assert len(_on_disk(a, root)) == 3
        assert len(_on_disk(b, root)) == 3
    finally:
        provider.destroy_all()


def test_refresh_load_counts_workspaces_already_on_the_hosts(vms: tuple[SSHVM, SSHVM], root: str) -> None:
    """Workspaces made outside the provider count once measured; other entries in the root do not."""
    a, b = vms
    outside = [SSHSandbox.create(SSHSandboxConfig(host=a.host_config(), workspace_root=root)) for _ in range(3)]
    for sandbox in outside:
        sandbox.close()  # the workspace stays
    decoys = f"mkdir -p {root}/notes {root}/0123456789abcdef0 && touch {root}/0123456789abcdef"
    assert a.docker.exec_run(["sh", "-c", decoys], user="sandbox").exit_code == 0
    provider = SSHProvider(_config(vms, root))
    try:
        assert provider.loads == {_label(a): 0, _label(b): 0}  # nothing measured yet
        assert provider.refresh_load() == {_label(a): 3, _label(b): 0}  # b's root does not exist
        assert [_port(provider.create()) for _ in range(4)] == [b.port, b.port, b.port, a.port]
        assert provider.loads == {_label(a): 4, _label(b): 3}
    finally:
        provider.destroy_all()
        for sandbox in outside:
            SSHSandbox.attach(sandbox.config, sandbox.workspace).destroy()


def test_load_survives_a_provider_restart(vms: tuple[SSHVM, SSHVM], root: str) -> None:
    a, b = vms
    before = SSHProvider(_config(vms, root))
    kept = [before.create() for _ in range(3)]  # a, b, a
    assert kept[0].write(f"{kept[0].workspace}/note.txt", "kept\n").error is None
    before.close()  # the process "restarts": sandboxes closed, workspaces left on the hosts
    assert before.sandboxes == ()
    assert before.loads == {_label(a): 2, _label(b): 1}

    after = SSHProvider(_config(vms, root))
    try:
        assert after.loads == {_label(a): 0, _label(b): 0}
        with after:  # entering measures the hosts
            assert after.loads == {_label(a): 2, _label(b): 1}
            assert _port(after.create()) == b.port

            again = after.attach(f"127.0.0.1:{a.port}", kept[0].workspace)
            assert again.read(f"{kept[0].workspace}/note.txt").file_data is not None
            assert after.loads[_label(a)] == 2  # attaching a measured workspace does not count it twice
            again.destroy()
            assert after.loads == {_label(a): 1, _label(b): 2}
            assert kept[0].workspace not in _on_disk(a, root)
        assert after.sandboxes == ()  # leaving closed the open ones
        for sandbox in kept[1:]:
            after.attach(sandbox.config.host, sandbox.workspace)
        after.attach(_label(b), next(iter(_on_disk(b, root) - {kept[1].workspace})))
        after.destroy_all()
        assert _on_disk(a, root) == set()
        assert _on_disk(b, root) == set()
        assert after.loads == {_label(a): 0, _label(b): 0}
    finally:
        after.destroy_all()


def test_attach_names_one_of_the_hosts(vms: tuple[SSHVM, SSHVM], root: str) -> None:
    a, _ = vms
    provider = SSHProvider(_config(vms, root))
    with pytest.raises(ValueError, match="not one of the provider's hosts"):
        provider.attach("127.0.0.1:1", f"{root}/x")
    with pytest.raises(ValueError, match="matches several hosts"):
        provider.attach("127.0.0.1", f"{root}/x")
    made = SSHSandbox.create(SSHSandboxConfig(host=a.host_config(), workspace_root=root))
    made.close()
    sandbox = provider.attach(f"sandbox@127.0.0.1:{a.port}", made.workspace)
    try:
        assert _port(sandbox) == a.port
        assert sandbox.user == made.user
        assert provider.loads[_label(a)] == 1
    finally:
        sandbox.destroy()
    assert provider.loads[_label(a)] == 0


# ---------------------------------------------------------------------- unreachable hosts


def test_a_stopped_host_is_skipped(
    vms: tuple[SSHVM, SSHVM], root: str, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    a, b = vms
    caplog.set_level(logging.WARNING, logger=PROVIDER_LOG)
    provider = SSHProvider(_config(vms, root))
    a.docker.stop(timeout=2)
    try:
        assert _port(provider.create()) == b.port  # a was emptier (tie, listed first) but is down
        skips = [r.getMessage() for r in caplog.records if r.name == PROVIDER_LOG]
        assert len(skips) == 1
        assert _label(a) in skips[0]

        caplog.clear()
        assert _port(provider.create()) == b.port  # a failed recently: tried only after b
        assert [r for r in caplog.records if r.name == PROVIDER_LOG] == []
        assert provider.loads == {_label(a): 0, _label(b): 2}
        assert provider.refresh_load() == {_label(a): None, _label(b): 2}

        dead_port = free_port()
        doomed = SSHProvider(
            SSHProviderConfig(
                hosts=[a.host_config(), a.host_config(port=dead_port)], workspace_root=root, retry_after=0
            )
        )
        with pytest.raises(SSHUnreachableError, match=str(dead_port)):  # the last host's error
            doomed.create()
        assert doomed.loads == {_label(a): 0, f"sandbox@127.0.0.1:{dead_port}": 0}
    finally:
        a.docker.start()
        a.wait_for_sshd()
    try:
        assert provider.refresh_load() == {_label(a): 0, _label(b): 2}  # reachable again: no longer held back
        assert _port(provider.create()) == a.port
    finally:
        provider.destroy_all()


# ---------------------------------------------------------------------- per-sandbox users


def test_a_host_whose_user_pool_is_exhausted_is_skipped(
    vms: tuple[SSHVM, SSHVM], root: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Group ``sbx-03`` has one member, so one sandbox (made outside the provider, in another
    root) exhausts the first host's pool; the provider then places on the second host, and
    says why. With both pools taken, the pool error itself is raised."""
    first, second = vms
    outside = SSHSandbox.create(
        SSHSandboxConfig(host=first.host_config(), user_group="sbx-03", workspace_root=f"{root}-outside")
    )
    try:
        provider = SSHProvider(_config(vms, root, user_group="sbx-03"))
        with caplog.at_level(logging.WARNING, logger=PROVIDER_LOG):
            placed = provider.create()
        assert _port(placed) == second.port
        assert placed.user == "sbx-03"
        assert any("every user of group 'sbx-03'" in r.getMessage() for r in caplog.records)
        with pytest.raises(UserPoolError, match="every user of group 'sbx-03'"):
            provider.create()
        provider.destroy_all()
    finally:
        outside.destroy()
