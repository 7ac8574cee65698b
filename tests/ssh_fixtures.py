"""Throwaway SSH "VMs" for the SSH tests: `sandboxes/ssh-vm` containers reached on loopback only.

Each VM gets a fresh key pair and its port 22 bound to a fixed free loopback port, so a
`docker restart` brings sshd back at the same address (the restart tests rely on it) with the
same host keys (they are generated once, on the container's first start).
"""

from __future__ import annotations

import io
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
from support import SESSION_OWNER
from testcontainers.core.container import DockerContainer

from sandboxes.ssh import SSHHostConfig

SSH_VM_IMAGE = os.environ.get("SANDBOXES_SSH_VM_IMAGE", "sandboxes/ssh-vm:latest")
"""The image the test VMs run; override to test a candidate build before retagging it."""
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A loopback port nothing listens on right now (the kernel's pick, then released)."""
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def new_key() -> tuple[paramiko.RSAKey, str, str]:
    """A key pair: the key, its authorized_keys line, its private text."""
    key = paramiko.RSAKey.generate(2048)
    private = io.StringIO()
    key.write_private_key(private)
    return key, f"{key.get_name()} {key.get_base64()}", private.getvalue()


def wait_for_banner(port: int, wait: float = 20.0) -> None:
    """Until sshd greets on ``port``. Docker's proxy accepts connections before sshd listens
    (and drops them), so an accepted connection alone proves nothing."""
    deadline = time.monotonic() + wait
    while True:
        try:
            with socket.create_connection((LOOPBACK, port), timeout=2) as probe:
                if probe.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"no sshd on {LOOPBACK}:{port} after {wait}s")
        time.sleep(0.1)


def fetch_host_key(port: int) -> paramiko.PKey:
    """The server's host key, once sshd is up."""
    wait_for_banner(port)
    transport = paramiko.Transport((LOOPBACK, port))
    try:
        transport.start_client(timeout=5)
        return transport.get_remote_server_key()
    finally:
        transport.close()


def write_known_hosts(path: Path, port: int, *keys: paramiko.PKey) -> Path:
    hosts = paramiko.HostKeys()
    for key in keys:
        hosts.add(f"[{LOOPBACK}]:{port}", key.get_name(), key)
    path.write_text("")  # HostKeys.save of an empty set writes nothing: the file must still exist
    hosts.save(str(path))
    return path


@dataclass
class SSHVM:
    container: DockerContainer
    port: int
    private_key: str
    host_key: paramiko.PKey
    known_hosts: Path

    @property
    def docker(self) -> Any:
        """The docker-py container, for restart / kill / pause."""
        return self.container.get_wrapped_container()

    def host_config(self, **overrides: Any) -> SSHHostConfig:
        settings: dict[str, Any] = {
            "host": LOOPBACK,
            "port": self.port,
            "username": "sandbox",
            "private_key": self.private_key,
            "known_hosts": self.known_hosts,
            "use_agent": False,
            "connect_timeout": 5.0,
            **overrides,
        }
        return SSHHostConfig(**settings)

    def config_host(self, key: Path) -> dict[str, Any]:
        """This VM as an operator writes a host in the service's config file: its private key in
        the file ``key`` (written, readable by its owner only, unless it is there), not inline."""
        if not key.exists():
            key.write_text(self.private_key)
            key.chmod(0o600)
        return {**self.host_config().model_dump(mode="json", exclude={"private_key"}), "key_path": str(key)}

    def wait_for_sshd(self) -> None:
        """After a restart: sshd answers again (with the same host key)."""
        assert fetch_host_key(self.port).asbytes() == self.host_key.asbytes()

    def stop(self) -> None:
        self.container.stop()


def start_vm(workdir: Path) -> SSHVM:
    """Start one ssh-vm container, labelled for the session sweep, and learn its host key."""
    _, public, private = new_key()
    port = free_port()
    container = (
        DockerContainer(SSH_VM_IMAGE)
        .with_env("SSH_AUTHORIZED_KEYS", public)
        # NET_ADMIN: the image firewalls its sandbox users at start, and refuses to start without.
        .with_kwargs(labels={"io.sandboxes.test-session": SESSION_OWNER}, cap_add=["NET_ADMIN"])
    )
    # Loopback only. `with_bind_ports` cannot name a host address in this testcontainers
    # version, but its port map goes to docker-py as is, which takes (address, port).
    container.ports["22/tcp"] = (LOOPBACK, port)  # type: ignore[assignment]
    container.start()
    try:
        host_key = fetch_host_key(port)
    except Exception:
        container.stop()
        raise
    workdir.mkdir(parents=True, exist_ok=True)
    known_hosts = write_known_hosts(workdir / f"known_hosts-{port}", port, host_key)
    return SSHVM(container, port, private, host_key, known_hosts)
