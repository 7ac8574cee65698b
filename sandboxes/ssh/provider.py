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

What a provider records (`sandboxes.lifecycle`): each workspace it creates gets a record, a
small JSON file named after the workspace in the login user's private state directory
(``$XDG_STATE_HOME/sandboxes/workspaces``, mode 700), holding its `CreateOptions` labels,
environment and expiry. Not in the workspace root: sandbox users make their workspaces
there (it is open to them while a lease makes one), and a sandbox must not forge the record of
another. `list` reads the
records and the workspace directories in one command per host; a workspace without a record
(made by `SSHSandbox.create` directly, or a crash before the record) is listed with no labels.
Refs are ``user@host:port:/workspace``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import paramiko
from pydantic import Field, field_validator

from sandboxes import _scripts
from sandboxes.lifecycle import CreateOptions, SandboxRecord, Sweep
from sandboxes.paths import InvalidPathError, normalize_path
from sandboxes.ssh._connection import (
    SSHConnection,
    SSHError,
    SSHHostConfig,
    SSHUnreachableError,
    connections,
    run_simple,
    run_status,
)
from sandboxes.ssh.sandbox import SSHSandbox, SSHSandboxConfig, SSHSandboxTemplate

__all__ = ["SSHProvider", "SSHProviderConfig"]

logger = logging.getLogger(__name__)

_WORKSPACE_GLOB = "[0-9a-f]" * 16
"""The shape of the names `SSHSandbox.create` gives workspaces (``uuid4().hex[:16]``)."""

_RECORDS = "${XDG_STATE_HOME:-$HOME/.local/state}/sandboxes/workspaces"

_LIST_WORKSPACES = rf"""root=${{1:-$HOME/sandboxes}}
printf '%s\n' "${{1:-$HOME}}"
for d in "$root"/{_WORKSPACE_GLOB}; do
  if [ -d "$d" ] && [ ! -L "$d" ]; then printf 'W %s\n' "${{d##*/}}"; fi
done
for f in {_RECORDS}/{_WORKSPACE_GLOB}.json; do
  if [ -f "$f" ]; then n=${{f##*/}}; printf 'R %s %s\n' "${{n%.json}}" "$(head -c 262144 "$f" | tr -d '\n')"; fi
done
exit 0
"""
"""First line: the configured root, or $HOME when none is (the root is then $HOME/sandboxes,
like `SSHSandbox.create`); then ``W name`` per workspace directory and ``R name json`` per
record (of any root: the record names its workspace)."""

_WRITE_RECORD = rf"""d={_RECORDS}
mkdir -p -- "$d" && chmod 700 -- "$d" && printf '%s\n' "$2" > "$d/.$1.tmp" && mv -f -- "$d/.$1.tmp" "$d/$1.json"
"""

_READ_RECORD = rf"""[ -d "$1" ] || exit 3
cat -- {_RECORDS}/"$2".json 2>/dev/null; exit 0
"""

_REMOVE_RECORD = rf"""rm -f -- {_RECORDS}/"$1".json"""


class SSHProviderConfig(SSHSandboxTemplate):
    """The hosts to spread sandboxes over; every `SSHSandboxTemplate` field (isolation, user
    group, timeouts, ...) is the template of the sandboxes made on all of them."""

    hosts: list[SSHHostConfig] = Field(min_length=1)
    retry_after: float = Field(default=30.0, ge=0)
    """Seconds a host that failed stays behind the healthy ones in the placement order."""
    ttl: float | None = Field(default=None, gt=0)
    """Seconds until a `SSHProvider.sweep` may remove a sandbox; ``None``: never."""

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
        return self._scan(config).workspaces

    def _scan(self, config: SSHHostConfig) -> _Scan:
        """The workspace directories under the root on one host, and the records of this root."""
        with _connection(config) as connection:
            try:
                output = run_simple(connection, _scripts.command(_LIST_WORKSPACES, self.config.workspace_root or ""))
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise SSHUnreachableError(f"listing workspaces on {_label(config)} failed: {exc}") from exc
        first, *lines = output.splitlines()
        try:
            root = self.config.workspace_root or f"{normalize_path(first)}/sandboxes"
        except InvalidPathError as exc:
            raise SSHError(f"unusable $HOME on {_label(config)}: {first!r}") from exc
        scan = _Scan(root)
        for line in lines:
            kind, _, rest = line.partition(" ")
            name, _, text = rest.partition(" ")
            if kind == "W" and name:
                scan.workspaces.add(f"{root}/{name}")
            elif kind == "R" and name:
                record = _parse_record(text)
                if record is not None and record.get("workspace") == f"{root}/{name}":
                    scan.records[f"{root}/{name}"] = record
        return scan

    # ------------------------------------------------------------------ creating

    def create(self, options: CreateOptions | None = None) -> SSHSandbox:
        """A new sandbox on the least-loaded reachable host (ties: the first listed), recorded
        with ``options``' labels, environment and expiry.

        Raises the last host's `SSHError` when no host could make one."""
        options = options or CreateOptions()
        tried: set[int] = set()
        last_error: SSHError | None = None
        while (index := self._reserve(tried)) is not None:
            tried.add(index)
            host = self._hosts[index]
            try:
                sandbox = _TrackedSSHSandbox.create(self._sandbox_config(host.config, options.env))
                try:
                    self._write_record(sandbox, options)
                except BaseException:
                    sandbox.destroy()
                    raise
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

    def attach(self, ref: SSHHostConfig | str, workspace: str | None = None) -> SSHSandbox:
        """A sandbox on an existing workspace of one of the configured hosts: ``attach(ref)``
        with a ref (``user@host:port:/workspace``, as `list` gives), or ``attach(host,
        workspace)`` with the host named by its config or its ``[user@]host[:port]``. The
        workspace joins that host's load; ``with`` only closes it. `LookupError` if the
        workspace does not exist."""
        if workspace is None:
            if not isinstance(ref, str):
                raise TypeError("attach(host, workspace) needs the workspace")
            ref, workspace = _split_ref(ref)
        chosen = self._find_host(ref)
        workspace = normalize_path(workspace)
        record = self._read_record(chosen.config, workspace)
        env = record.get("env") if isinstance(record.get("env"), dict) else {}
        sandbox = _TrackedSSHSandbox.attach(self._sandbox_config(chosen.config, env or {}), workspace)
        assert isinstance(sandbox, _TrackedSSHSandbox)
        self._adopt(chosen, sandbox, reserved=False)
        return sandbox

    def list(self) -> list[SandboxRecord]:
        """Every workspace under the root on every host, with what its record says. Raises
        `SSHError` when a host cannot be reached: what it holds is then unknown, and a caller
        reconciling against the list must not take its sandboxes for gone."""
        found: list[SandboxRecord] = []
        for host in self._hosts:
            scan = self._scan(host.config)
            for workspace in sorted(scan.workspaces | set(scan.records)):
                found.append(
                    _record_of(host.config, workspace, scan.records.get(workspace), workspace in scan.workspaces)
                )
        return found

    def destroy(self, ref: str) -> None:
        """Remove the workspace ``ref`` (with its user's leftovers) and its record; gone already
        is fine."""
        host, workspace = _split_ref(ref)
        chosen = self._find_host(host)
        try:
            sandbox = self.attach(ref)
        except LookupError:
            self._remove_record(chosen.config, workspace)
            return
        sandbox.destroy()

    def sweep(self, now: float | None = None) -> Sweep:
        """Remove the sandboxes whose recorded expiry passed, and the records of workspaces
        already gone (a destroy interrupted between the two). Unreachable hosts are an error
        for this sweep; the next one tries again."""
        now = time.time() if now is None else now
        report = Sweep()
        for host in self._hosts:
            try:
                scan = self._scan(host.config)
            except SSHError as exc:
                report.errors.append(f"{host.label}: {exc}")
                continue
            for workspace, record in scan.records.items():
                ref = _ref(host.config, workspace)
                expires_at = record.get("expires_at")
                gone = workspace not in scan.workspaces
                if not gone and not (isinstance(expires_at, int | float) and expires_at < now):
                    continue
                try:
                    self.destroy(ref)
                except (SSHError, LookupError, ValueError) as exc:
                    report.errors.append(f"{ref}: {exc}")
                else:
                    report.removed.append(ref)
        return report

    # ------------------------------------------------------------------ records

    def _write_record(self, sandbox: SSHSandbox, options: CreateOptions) -> None:
        now = time.time()
        ttl = options.ttl if options.ttl is not None else self.config.ttl
        record = {
            "workspace": sandbox.workspace,
            "labels": options.labels,
            "env": options.env,
            "created_at": now,
            "expires_at": None if ttl is None else now + ttl,
        }
        with _connection(sandbox.config.host) as connection:
            run_simple(connection, _scripts.command(_WRITE_RECORD, _name(sandbox.workspace), json.dumps(record)))

    def _read_record(self, config: SSHHostConfig, workspace: str) -> dict[str, Any]:
        with _connection(config) as connection:
            status, output = run_status(connection, _scripts.command(_READ_RECORD, workspace, _name(workspace)), 30)
        if status == 3:
            raise LookupError(f"no workspace {workspace} on {_label(config)}")
        if status != 0:
            raise SSHError(f"reading the record of {workspace} on {_label(config)} failed: {output.strip()[:200]}")
        return _parse_record(output.strip()) or {}

    def _remove_record(self, config: SSHHostConfig, workspace: str) -> None:
        with _connection(config) as connection:
            run_simple(connection, _scripts.command(_REMOVE_RECORD, _name(workspace)))

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
        try:
            self._remove_record(host.config, workspace)
        except SSHError as exc:  # the workspace is gone; a sweep removes the record
            logger.warning("could not remove the record of %s on %s: %s", workspace, host.label, exc)

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

    def _sandbox_config(self, host: SSHHostConfig, env: dict[str, str] | None = None) -> SSHSandboxConfig:
        config = self.config.on(host)
        if env:
            config = config.model_copy(update={"env": {**config.env, **env}})
        return config

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

    def check_ready(self) -> None:
        """Ready whenever configured: `create` tries every host and says which failed."""

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


class _Scan:
    def __init__(self, root: str) -> None:
        self.root = root
        self.workspaces: set[str] = set()
        self.records: dict[str, dict[str, Any]] = {}


@contextlib.contextmanager
def _connection(config: SSHHostConfig) -> Iterator[SSHConnection]:
    connection = connections.acquire(config)
    try:
        yield connection
    finally:
        connections.release(connection)


def _parse_record(text: str) -> dict[str, Any] | None:
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _record_of(config: SSHHostConfig, workspace: str, record: dict[str, Any] | None, exists: bool) -> SandboxRecord:
    record = record or {}
    labels = record.get("labels")
    created_at, expires_at = record.get("created_at"), record.get("expires_at")
    return SandboxRecord(
        id=f"ssh:{config.host}:{config.port}:{workspace}",
        ref=_ref(config, workspace),
        labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
        created_at=float(created_at) if isinstance(created_at, int | float) else 0.0,
        expires_at=float(expires_at) if isinstance(expires_at, int | float) else None,
        running=exists,
    )


def _name(workspace: str) -> str:
    return workspace.rstrip("/").rsplit("/", 1)[-1]


def _ref(config: SSHHostConfig, workspace: str) -> str:
    return f"{_label(config)}:{workspace}"


def _split_ref(ref: str) -> tuple[str, str]:
    """``user@host:port:/workspace`` -> (``user@host:port``, ``/workspace``)."""
    host, sep, path = ref.partition(":/")
    if not sep or not host:
        raise ValueError(f"not an SSH sandbox ref (user@host:port:/workspace): {ref!r}")
    return host, "/" + path


def _label(config: SSHHostConfig) -> str:
    return f"{config.username}@{config.host}:{config.port}"


def _names(config: SSHHostConfig) -> set[str]:
    """The ways `SSHProvider.attach` accepts to name a host."""
    bare = {config.host, f"{config.host}:{config.port}"}
    return bare | {f"{config.username}@{name}" for name in bare}
