"""`SSHProvider`: spreads `SSHSandbox` workspaces over a pool of hosts, least-loaded first.

What "load" means. A host's load is the number of sandbox workspaces it holds, as far as this
provider knows: a workspace counts from its creation until its destruction, whether or not a
sandbox object is open on it, because a closed-but-not-destroyed workspace still occupies the
host and can be attached again. Two sources feed it:

* in memory: every workspace this provider creates or attaches is added to its host's set, and
  removed when its sandbox is destroyed;
* measured: `refresh_load` lists the workspace directories under each host's workspace root
  (one short command per host), replacing the remembered set. Call it at start-up (``with
  provider:`` does) so that a restarted provider does not forget the workspaces an earlier one
  left, and again whenever other providers may share the hosts.

`create` chooses from the in-memory number only, never measuring: a measurement per create
would cost a round trip to every host. So workspaces made or removed by someone else are only
seen at the next `refresh_load`. Only directories named like a workspace (16 hex digits, as
`SSHSandbox.create` names them) are counted, so other files in the root do not skew it.

A host that cannot be reached is skipped and the next least-loaded is tried; it is then tried
only after the healthy hosts until ``retry_after`` has passed or a `refresh_load` reaches it, so
a dead host does not cost every create a connect timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Literal

import paramiko
from pydantic import BaseModel, ConfigDict, Field, field_validator

from sandboxes import _scripts
from sandboxes.paths import InvalidPathError, normalize_path
from sandboxes.ssh._connection import SSHError, SSHHostConfig, SSHUnreachableError, connections, run_simple
from sandboxes.ssh.sandbox import SSHSandbox, SSHSandboxConfig

__all__ = ["SSHProvider", "SSHProviderConfig"]

logger = logging.getLogger(__name__)

_WORKSPACE_GLOB = "[0-9a-f]" * 16
"""The shape of the names `SSHSandbox.create` gives workspaces (``uuid4().hex[:16]``)."""

_LIST_WORKSPACES = rf"""root=${{1:-$HOME/sandboxes}}
printf '%s\n' "${{1:-$HOME}}"
for d in "$root"/{_WORKSPACE_GLOB}; do
  if [ -d "$d" ] && [ ! -L "$d" ]; then printf '%s\n' "${{d##*/}}"; fi
done
exit 0
"""
"""First line: the configured root, or $HOME when none is (the root is then $HOME/sandboxes,
like `SSHSandbox.create`); then one workspace name a line."""


class SSHProviderConfig(BaseModel):
    """The hosts to spread sandboxes over, and the sandbox settings shared by all of them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hosts: list[SSHHostConfig] = Field(min_length=1)
    workspace_root: str | None = None
    """Where workspaces live on every host; default ``$HOME/sandboxes`` of the login user."""
    isolation: Literal["user", "none"] = "user"
    """As `SSHSandboxConfig.isolation`: by default each sandbox leases its own user on its host,
    and a host whose pool is exhausted is skipped like an unreachable one."""
    user_group: str = "sandboxes"
    run_as: str | None = None
    default_timeout: float = Field(default=120.0, ge=0)
    output_limit: int | None = Field(default=None, gt=0)
    """Per-command output cap; ``None`` keeps `SSHSandboxConfig`'s default."""
    use_exec_helper: bool = True
    retry_after: float = Field(default=30.0, ge=0)
    """Seconds a host that failed stays behind the healthy ones in the placement order."""

    @field_validator("hosts")
    @classmethod
    def _distinct_hosts(cls, hosts: list[SSHHostConfig]) -> list[SSHHostConfig]:
        seen: set[tuple[str, int, str]] = set()
        for host in hosts:
            if host.key in seen:
                raise ValueError(f"host {_label(host)} is listed twice")
            seen.add(host.key)
        return hosts

    @field_validator("workspace_root")
    @classmethod
    def _absolute_root(cls, root: str | None) -> str | None:
        if root is None:
            return None
        try:
            return normalize_path(root)
        except InvalidPathError as exc:
            raise ValueError(str(exc)) from exc


class _Host:
    """What the provider remembers about one host; guarded by the provider's lock."""

    def __init__(self, config: SSHHostConfig) -> None:
        self.config = config
        self.label = _label(config)
        self.workspaces: set[str] = set()
        self.reserved = 0
        """Creates in flight here: counted so concurrent creates spread instead of piling up."""
        self.failed_at: float | None = None

    @property
    def load(self) -> int:
        return len(self.workspaces) + self.reserved


class SSHProvider:
    """Creates `SSHSandbox` instances on the least-loaded of several hosts (see module docs).

    ``with SSHProvider(config) as provider:`` measures the hosts' load on entry and closes the
    sandboxes still open on exit (their workspaces stay; `destroy_all` removes them).
    """

    def __init__(self, config: SSHProviderConfig) -> None:
        self.config = config
        self._hosts = [_Host(host) for host in config.hosts]
        self._open: dict[int, SSHSandbox] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ load

    @property
    def loads(self) -> dict[str, int]:
        """Current load per host, keyed ``user@host:port`` (includes creates in flight)."""
        with self._lock:
            return {host.label: host.load for host in self._hosts}

    def refresh_load(self) -> dict[str, int | None]:
        """Measure every host: its workspace directories become its load. A host that cannot
        be reached keeps its remembered load, is logged, and reads ``None`` here."""
        measured: dict[str, int | None] = {}
        for host in self._hosts:
            try:
                workspaces = self._list_workspaces(host.config)
            except SSHError as exc:
                logger.warning("could not measure the load of %s: %s", host.label, exc)
                with self._lock:
                    host.failed_at = time.monotonic()
                measured[host.label] = None
                continue
            with self._lock:
                host.workspaces = workspaces
                host.failed_at = None
                measured[host.label] = len(workspaces)
        return measured

    def _list_workspaces(self, config: SSHHostConfig) -> set[str]:
        connection = connections.acquire(config)
        try:
            output = run_simple(connection, _scripts.command(_LIST_WORKSPACES, self.config.workspace_root or ""))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise SSHUnreachableError(f"listing workspaces on {_label(config)} failed: {exc}") from exc
        finally:
            connections.release(connection)
        first, *names = output.splitlines()
        try:
            root = self.config.workspace_root or f"{normalize_path(first)}/sandboxes"
        except InvalidPathError as exc:
            raise SSHError(f"unusable $HOME on {_label(config)}: {first!r}") from exc
        return {f"{root}/{name}" for name in names if name}

    # ------------------------------------------------------------------ creating

    def create(self) -> SSHSandbox:
        """A new sandbox on the least-loaded reachable host (ties: the first listed).

        Raises the last host's `SSHError` when no host could make one."""
        tried: set[int] = set()
        last_error: SSHError | None = None
        while (index := self._reserve(tried)) is not None:
            tried.add(index)
            host = self._hosts[index]
            try:
                sandbox = _TrackedSSHSandbox.create(self._sandbox_config(host.config))
            except SSHError as exc:
                last_error = exc
            except (paramiko.SSHException, OSError, EOFError) as exc:  # dropped mid-create
                last_error = SSHUnreachableError(f"creating a workspace on {host.label} failed: {exc}")
            else:
                assert isinstance(sandbox, _TrackedSSHSandbox)  # `SSHSandbox.create` builds `cls`
                self._adopt(host, sandbox, reserved=True)
                return sandbox
            with self._lock:
                host.reserved -= 1
                host.failed_at = time.monotonic()
            logger.warning("skipping host %s: %s", host.label, last_error)
        if last_error is None:  # unreachable: hosts has min_length=1
            raise SSHError("no hosts configured")
        raise last_error

    def attach(self, host: SSHHostConfig | str, workspace: str) -> SSHSandbox:
        """A sandbox on an existing workspace of one of the configured hosts, named by its
        config or its ``[user@]host[:port]``; the workspace joins that host's load."""
        chosen = self._find_host(host)
        sandbox = _TrackedSSHSandbox.attach(self._sandbox_config(chosen.config), workspace)
        assert isinstance(sandbox, _TrackedSSHSandbox)
        self._adopt(chosen, sandbox, reserved=False)
        return sandbox

    def _reserve(self, tried: set[int]) -> int | None:
        """Pick the next host to try and count the create against it at once."""
        now = time.monotonic()
        with self._lock:
            candidates = [i for i in range(len(self._hosts)) if i not in tried]
            if not candidates:
                return None

            def rank(i: int) -> tuple[bool, int, int]:
                failed_at = self._hosts[i].failed_at
                cooling = failed_at is not None and now - failed_at < self.config.retry_after
                return (cooling, self._hosts[i].load, i)

            index = min(candidates, key=rank)
            self._hosts[index].reserved += 1
            return index

    def _adopt(self, host: _Host, sandbox: _TrackedSSHSandbox, *, reserved: bool) -> None:
        sandbox._on_close = self._closed
        sandbox._on_destroy = lambda: self._destroyed(host, sandbox.workspace)
        with self._lock:
            if reserved:
                host.reserved -= 1
                host.failed_at = None
            host.workspaces.add(sandbox.workspace)
            self._open[id(sandbox)] = sandbox

    def _closed(self, sandbox: SSHSandbox) -> None:
        with self._lock:
            self._open.pop(id(sandbox), None)

    def _destroyed(self, host: _Host, workspace: str) -> None:
        with self._lock:
            host.workspaces.discard(workspace)

    def _find_host(self, wanted: SSHHostConfig | str) -> _Host:
        if isinstance(wanted, SSHHostConfig):
            matches = [h for h in self._hosts if h.config.key == wanted.key]
        else:
            matches = [h for h in self._hosts if wanted in _names(h.config)]
        if len(matches) != 1:
            known = ", ".join(h.label for h in self._hosts)
            problem = "matches several hosts" if matches else "is not one of the provider's hosts"
            raise ValueError(f"host {wanted if isinstance(wanted, str) else _label(wanted)!r} {problem} ({known})")
        return matches[0]

    def _sandbox_config(self, host: SSHHostConfig) -> SSHSandboxConfig:
        settings = {
            "host": host,
            "workspace_root": self.config.workspace_root,
            "isolation": self.config.isolation,
            "user_group": self.config.user_group,
            "run_as": self.config.run_as,
            "default_timeout": self.config.default_timeout,
            "use_exec_helper": self.config.use_exec_helper,
        }
        if self.config.output_limit is not None:
            settings["output_limit"] = self.config.output_limit
        return SSHSandboxConfig.model_validate(settings)

    # ------------------------------------------------------------------ lifecycle

    @property
    def sandboxes(self) -> tuple[SSHSandbox, ...]:
        """The sandboxes this provider created or attached that are still open."""
        with self._lock:
            return tuple(self._open.values())

    def destroy_all(self) -> None:
        """Destroy every open sandbox of this provider, all of them even if some fail; then
        raise an `SSHError` naming the ones whose workspace could not be removed."""
        failures = []
        for sandbox in self.sandboxes:
            try:
                sandbox.destroy()
            except Exception as exc:
                logger.warning("could not destroy %s: %s", sandbox.id, exc)
                failures.append(f"{sandbox.id}: {exc}")
        if failures:
            raise SSHError(f"{len(failures)} sandbox(es) not destroyed: " + "; ".join(failures))

    def close(self) -> None:
        """Close the open sandboxes (workspaces stay, and stay counted). Idempotent."""
        for sandbox in self.sandboxes:
            sandbox.close()

    def __enter__(self) -> SSHProvider:
        self.refresh_load()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _TrackedSSHSandbox(SSHSandbox):
    """Tells its provider when it closes and when its workspace is gone, so the load follows
    sandboxes destroyed by their holders, not only through the provider."""

    _on_close: Callable[[SSHSandbox], None] | None = None
    _on_destroy: Callable[[], None] | None = None

    def close(self) -> None:
        super().close()
        if self._on_close is not None:
            self._on_close(self)

    def destroy(self) -> None:
        removes = not self._closed  # `SSHSandbox.destroy` leaves the workspace of a closed sandbox
        super().destroy()
        notify, self._on_destroy = self._on_destroy, None
        if removes and notify is not None:
            notify()


def _label(config: SSHHostConfig) -> str:
    return f"{config.username}@{config.host}:{config.port}"


def _names(config: SSHHostConfig) -> set[str]:
    """The ways `SSHProvider.attach` accepts to name a host."""
    bare = {config.host, f"{config.host}:{config.port}"}
    return bare | {f"{config.username}@{name}" for name in bare}
