"""The lifecycle contract: one meaning of ``close``, ``destroy`` and ``with`` for every sandbox.

* ``close()`` lets go of what this handle holds (connections, exec helpers, temporary files on
  the caller's side); the sandbox and its files live on, and another handle may attach to them.
* ``destroy()`` removes the sandbox and everything in it, then closes. Idempotent: a sandbox
  already gone (expired, destroyed elsewhere) is not an error.
* ``with`` destroys what the caller created and only closes what it attached to: leaving a
  block must never delete a sandbox someone else made (an agent resuming a thread attaches to
  its sandbox; the service adopts containers after a restart). `owned` records which it is.

Every backend's sandbox follows it by inheriting `Sandbox` (the protocol's operations, the
lifecycle, and what names it: `Sandbox.ref`, `Sandbox.workdir`); ``tests/test_lifecycle.py``
checks each one against a real backend. Consumers (the service, the agent) hold a `Sandbox` and
a `Provider` and never name a concrete backend.

A `Provider` makes and finds the sandboxes of one backend from one template: ``create``,
``attach`` by reference, ``list`` what exists, ``destroy`` by reference, ``sweep`` the expired,
and (`PooledProvider`) ``acquire`` from a warm pool. What a provider knows of its sandboxes is
recorded on the sandboxes themselves (labels, annotations, marker files), never only in the
provider's memory, so a new process with the same template finds, adopts and reaps them: that
is what lets the service restart, and run several replicas, without losing a sandbox.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, Self, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandboxes import protocol as p

__all__ = [
    "DEFAULT_USER_IDS",
    "FINAL_EXPIRY",
    "NETWORK_RECORD_LIMIT",
    "CreateOptions",
    "Freezable",
    "FreezeUnavailable",
    "HolderBoundProvider",
    "Lifecycle",
    "Mount",
    "PooledProvider",
    "Provider",
    "RecordsNetwork",
    "ResumableProvider",
    "Sandbox",
    "SandboxNameTaken",
    "SandboxRecord",
    "SandboxStartError",
    "SharedProvider",
    "Sweep",
    "VolumeInUse",
    "VolumeProvider",
    "label_expiry",
]


class Lifecycle(abc.ABC):
    """``close``/``destroy`` plus the ``with`` rule, for a sandbox handle."""

    owned: bool = True
    """Whether this handle created its sandbox (``with`` destroys it) or attached to one that
    already existed (``with`` only closes)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release this handle's resources; the sandbox stays."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Remove the sandbox (idempotent), then close."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.owned:
            self.destroy()
        else:
            self.close()

    async def adestroy(self) -> None:
        await asyncio.to_thread(self.destroy)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.owned:
            await self.adestroy()
        else:
            await self.aclose()


DEFAULT_USER_IDS = (1000, 1000)

FINAL_EXPIRY = 1.0
"""A recorded expiry at or before this (the epoch's first second) is final: `SharedProvider.set_expiry`
never moves it (a deletion's record, which no other process's renewal may undo)."""
"""The uid and gid a sandbox's commands run as unless its backend says otherwise."""


class Sandbox(p.SandboxBackendProtocol, Lifecycle):
    """A sandbox of any backend: the protocol's operations and commands, the lifecycle, and the
    names its provider and its consumers need, so that no consumer asks which backend made it."""

    @property
    @abc.abstractmethod
    def ref(self) -> str:
        """What `Provider.attach` and `Provider.destroy` take for this sandbox (`SandboxRecord.ref`)."""

    @property
    @abc.abstractmethod
    def workdir(self) -> str:
        """The absolute directory commands start in and the sandbox's files are meant to live in."""

    @property
    def user_ids(self) -> tuple[int, int]:
        """The uid and gid the sandbox's commands run as: who files put in from outside belong to."""
        return DEFAULT_USER_IDS


class SandboxStartError(RuntimeError):
    """A provider could not start a sandbox, for a reason its backend names in its own words
    (``reason``: a Kubernetes pod's ``Unschedulable``, ``ErrImagePull``...). Raised after what
    was made for it is removed. Unlike a failure of the call itself, the reason is what an
    operator has to fix, and the service passes it on to the tenant who asked."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class SandboxNameTaken(RuntimeError):
    """A create with `CreateOptions.name` refused by the backend: the owner has a sandbox of
    that name already (made by another process, perhaps still starting). Nothing was made."""


class Mount(BaseModel):
    """A volume (`VolumeProvider.create_volume`'s ref) mounted at ``path`` in a sandbox."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)  # built at first use, not import

    volume: str
    path: str = Field(pattern=r"^/[^\x00]*$")
    read_only: bool = False


class CreateOptions(BaseModel):
    """What one sandbox adds to its provider's template: the service's tenant labels, a
    lifetime, the client's environment. Everything else is the template's."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)  # built at first use, not import

    labels: dict[str, str] = Field(default_factory=dict)
    """Recorded on the sandbox (container/pod labels, a marker file), so `Provider.list` returns
    them after a restart. Keys are the caller's; a provider keeps its own beside them."""
    env: dict[str, str] = Field(default_factory=dict)
    """Added to the template's environment for every command."""
    name: str | None = Field(default=None, pattern=r"^[a-z0-9]{1,32}$")
    """The backend's name of the sandbox (a container's, a pod's), unique while the sandbox
    lives: a second create with it raises `SandboxNameTaken`, which is how several processes
    racing one creation make one sandbox. A `SharedProvider` honours it (where processes meet);
    the others, which one process alone drives, may ignore it. ``None``: a fresh one."""
    ttl: float | None = Field(default=None, gt=0)
    """Seconds until a sweep may reap it; ``None``: the template's."""
    mounts: tuple[Mount, ...] = ()
    """Volumes to mount: only a `VolumeProvider` honours them (the service gives none to another)."""
    expires_at: float | None = Field(default=None, gt=0)
    """An expiry (Unix seconds) that `SharedProvider.set_expiry` may move later, instead of
    ``ttl``: sweeps reap by it, but no deadline that cannot move is set (a pod's
    ``activeDeadlineSeconds`` can only shrink). Only a `SharedProvider` takes it."""

    @model_validator(mode="after")
    def _one_expiry(self) -> CreateOptions:
        if self.ttl is not None and self.expires_at is not None:
            raise ValueError("give ttl or expires_at, not both")
        return self


def label_expiry(labels: Mapping[str, str], name: str, logger: logging.Logger) -> float | None:
    """The expiry (seconds since the epoch) a sandbox's label ``name`` records; ``None`` where it
    records none, or none that reads as a number (then said in ``logger``, the backend's)."""
    value = labels.get(name)
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        logger.warning("ignoring unreadable %s label %r", name, value)
        return None


@dataclass(frozen=True, slots=True)
class SandboxRecord:
    """What exists, as the backend itself records it (not what a process remembers)."""

    id: str
    """The sandbox's id (`Sandbox.id` of a handle on it)."""
    ref: str
    """What `Provider.attach` and `Provider.destroy` take: a container id, a pod name, a
    ``host:workspace``, a directory."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """The `CreateOptions.labels` it was created with."""
    created_at: float = 0.0
    expires_at: float | None = None
    running: bool = True
    """Whether commands can run in it now (a stopped container, a pending or failed pod: not)."""
    frozen: bool = False
    """Whether its processes are frozen in place (`Freezable.freeze`): alive, not running."""
    starting: bool = False
    """Not running yet, but not stopped either: being made (a pending pod, a container created
    and not started), perhaps by another process, which will run or remove it. Neither adopt
    nor reap it on that account: its expiry and its provider's sweep bound it."""
    network: str | None = None
    """What `RecordsNetwork.set_network` recorded on it last (the caller's text, as given);
    ``None``: nothing, or a provider that records none."""


@dataclass
class Sweep:
    """What one `Provider.sweep` did."""

    removed: list[str] = field(default_factory=list)
    """Refs of the expired or orphaned sandboxes removed."""
    errors: list[str] = field(default_factory=list)
    """What could not be removed; the next sweep tries again."""


S = TypeVar("S", bound=Sandbox, covariant=True)


@runtime_checkable
class Provider(Protocol[S]):
    """Creates, finds and removes the sandboxes of one backend from one template.

    ``with provider:`` closes the provider (its connections, its pool's idle sandboxes); the
    sandboxes it handed out live on under the lifecycle contract above."""

    def create(self, options: CreateOptions | None = None) -> S:
        """A new sandbox, owned by the caller (``with`` destroys it)."""
        ...

    def attach(self, ref: str) -> S:
        """A handle on an existing sandbox (``with`` only closes it). Raises `LookupError` if
        there is none by that ref."""
        ...

    def list(self) -> list[SandboxRecord]:
        """Every sandbox of this provider's owner that exists, running or not."""
        ...

    def destroy(self, ref: str) -> None:
        """Remove the sandbox and everything it stored; gone already is fine."""
        ...

    def sweep(self, now: float | None = None) -> Sweep:
        """Remove this owner's sandboxes whose expiry passed (``now``: a clock of the caller's,
        for tests), and the leftovers of sandboxes half made or half removed."""
        ...

    def check_ready(self) -> None:
        """Raise if the backend cannot create sandboxes right now (its engine or API does not
        answer); return at once otherwise."""
        ...

    def close(self) -> None:
        """Release the provider's connections and idle pool; handed-out sandboxes stay."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...


@runtime_checkable
class PooledProvider(Provider[S], Protocol[S]):
    """A provider with a warm pool of started sandboxes."""

    def acquire(self) -> S:
        """A started sandbox from the pool (a cold `create` when it is empty), owned by the caller."""
        ...


@runtime_checkable
class ResumableProvider(Provider[S], Protocol[S]):
    """A provider whose sandboxes can stop without being removed (a container stopped by an
    engine restart), and be started again with their files."""

    def resume(self, ref: str) -> bool:
        """Start the sandbox ``ref`` again if it is not running. ``False`` when it cannot come
        back whole (its files were in memory, or it will not start): the caller should
        `Provider.destroy` it rather than hand out an empty sandbox."""
        ...


@runtime_checkable
class HolderBoundProvider(Provider[S], Protocol[S]):
    """A provider whose sandboxes' processes live only as long as the process holding their
    handle (a local jail ends with it): a sandbox attached by another process has its files and
    none of the processes it ran, frozen or not."""

    processes_end_with_holder: bool
    """``True``: what makes a provider one."""


@runtime_checkable
class SharedProvider(Provider[S], Protocol[S]):
    """A provider whose sandboxes several processes can share (the service's replicas): each
    one's record can be selected by label, and its expiry moved after creation, on the sandbox
    itself. Whatever one process changes, the others read back from the backend."""

    def select(self, labels: Mapping[str, str]) -> list[SandboxRecord]:
        """This owner's sandboxes carrying all of ``labels`` (`CreateOptions.labels`), as
        `Provider.list` reports them, selected by the backend rather than after a full list."""
        ...

    def set_expiry(self, ref: str, expires_at: float) -> None:
        """Record a new expiry on the sandbox ``ref`` (its `SandboxRecord.expires_at` from now
        on, for every process's sweep). `LookupError` if there is none by that ref, or its
        recorded expiry is final (`FINAL_EXPIRY`) and ``expires_at`` is not."""
        ...


NETWORK_RECORD_LIMIT = 16384
"""The most characters a `RecordsNetwork.set_network` record holds: far below what a backend
allows on one object (a pod's annotations: 256 KiB in all), and small enough to read back with
every record of a list."""


@runtime_checkable
class RecordsNetwork(Protocol):
    """A `SharedProvider` that keeps a caller's text (its sandbox's network, as the caller writes
    it) on each sandbox, changed after creation (a pod's annotation) and read back with its
    record (`SandboxRecord.network`): what one process records there, every other one reads."""

    def set_network(self, ref: str, change: Callable[[str | None], str]) -> None:
        """Record on the sandbox ``ref`` what ``change`` makes of the text it records now
        (``None``: none yet), on the version of it just read: if another process changed it
        since, it is read again and ``change`` called again, so no change lands between.
        `ValueError` if the text is longer than `NETWORK_RECORD_LIMIT` (nothing recorded);
        `LookupError` if there is no sandbox by that ref, or it is being removed or recorded
        deleted (`FINAL_EXPIRY`); what ``change`` raises goes through."""
        ...


class VolumeInUse(RuntimeError):
    """A volume a sandbox still mounts: not removed."""


@runtime_checkable
class VolumeProvider(Protocol):
    """A provider whose sandboxes can mount volumes (`CreateOptions.mounts`): directories that
    outlive them, made and removed here, named by the caller; what the backend calls each is
    its ref. Every volume is recorded on the backend (a label, a directory), never only here."""

    def create_volume(self, name: str, labels: Mapping[str, str], size: int) -> str:
        """A new empty volume the sandboxes' user can write (one there already: the same),
        and its ref; ``size`` bytes where the backend sizes volumes (a claim's request)."""
        ...

    def remove_volume(self, ref: str) -> None:
        """Remove the volume and its files; gone already is fine; `VolumeInUse` while a
        sandbox mounts it."""
        ...


class FreezeUnavailable(RuntimeError):
    """This sandbox cannot be frozen (its backend has no freezer, or it has no processes of
    its own to stop); the message says why. Nothing was changed."""


@runtime_checkable
class Freezable(Protocol):
    """A sandbox whose processes can all be stopped where they are, keeping their memory, and
    let run again: every process of the sandbox, its exec helper's included, or none."""

    def freeze(self) -> None:
        """Stop every process of the sandbox; idempotent. `FreezeUnavailable` if it cannot."""
        ...

    def thaw(self) -> None:
        """Let the sandbox's processes run again, where they stopped; idempotent."""
        ...
