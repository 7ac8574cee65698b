"""What the service must remember across a crash: one small JSON file per sandbox.

The backend is the truth about what exists (directories, containers); these files add what it
cannot say: which tenant a local directory belongs to, and a TTL renewed after creation
(Docker labels are fixed when a container is created). One file per sandbox, replaced
atomically, so a ``kill -9`` at any instant leaves either the old or the new version, and
concurrent changes to different sandboxes never rewrite each other's state. The directory
lives outside every sandbox's root: no sandbox can read or forge it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import uuid
from bisect import bisect_left, insort
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from sandboxes.lifecycle import FINAL_EXPIRY
from sandboxes.server.logs import random_id

logger = logging.getLogger(__name__)

_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

DELETED_AT = FINAL_EXPIRY
"""The expiry a deletion records on a shared backend's sandbox (and its claim) before its destroy
(`SandboxState.deleted_on_record`): long past on every replica's clock, no expiry a create
or a renewal gives, and final on the backend: no replica's renewal moves it."""

PAUSED_AT_TIMEOUT = "timeout"
"""`SandboxState.paused` of a sandbox its TTL paused (``on_timeout``): its clock runs to the
end of its retention (then it is removed); ``paused_remaining`` is the TTL a resume gives it."""


class Network(NamedTuple):
    """A sandbox's network as its state says it at one moment (`SandboxState.network`)."""

    allow: tuple[str, ...] | None
    headers: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    public_ports: bool | None
    mask_request_host: str | None
    preview_public: tuple[int, ...]


_PAUSES_BESIDE_RECORD = frozenset({"stop", PAUSED_AT_TIMEOUT})
"""The pauses a shared backend's record cannot say (it says frozen alone, read back as ``keep``)."""


@dataclass
class SandboxState:
    id: str
    tenant: str
    template: str
    backend: str
    created_at: float
    expires_at: float
    cpus: float
    memory: int
    """Bytes, as counted against the tenant's quota."""
    ref: str
    """The backend's handle: a local root directory, a container id."""
    workdir: str
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    """The sandbox's environment over its template's (a local sandbox re-opened after a restart
    needs it again; a container keeps its own)."""
    idempotency_key: str = ""
    """The digest of the ``Idempotency-Key`` it was created with (`sandboxes.server.
    idempotency`), also a label on the sandbox; empty: created without one."""
    request_digest: str = ""
    """The digest of the create request that made it, to tell a replay from a key reused."""
    volumes: list[str] = field(default_factory=list)
    """The tenant's volumes it mounts (`sandboxes.server.volumes`), by name."""
    paused: str = ""
    """``keep``, ``stop`` or `PAUSED_AT_TIMEOUT` while paused (whether its TTL clock runs,
    `sandboxes.server.pausing`); empty while it runs."""
    paused_remaining: float = 0.0
    """Paused with ``stop``: the seconds of TTL it had left, given back at resume."""
    pause_intent: str = ""
    """A pause under way: its kind, written before the freeze and cleared when ``paused`` is
    written after it, so that a ``kill -9`` between them leaves the intent for the next start to
    settle with what the backend says (`settle_pause`); empty otherwise."""
    resume_expiry: float = 0.0
    """A resume under way on a shared backend of a pause with its clock stopped or at its timeout:
    the expiry it gives, written before the thaw and cleared when the resume is recorded after it,
    so that a ``kill -9`` between them is settled at the next start (`settle_resume`); 0 otherwise."""
    processes_ended: bool = False
    """Paused by a freeze whose processes ended since (its jail with the service that held it,
    `sandboxes.lifecycle.HolderBoundProvider`): its files alone come back at resume."""
    hibernated: str = ""
    """Paused by hibernation: the snapshot its workspace was kept in, its container or jail
    released (`sandboxes.server.keeping`); empty otherwise."""
    auto_resume: bool = False
    """An operation on it while paused resumes it first, instead of answering ``paused``."""
    on_timeout: str = "delete"
    """What its expiry does while it runs (`sandboxes.api.CreateSandbox.on_timeout`)."""
    egress_allow: list[str] | None = None
    """The egress allow-list its create asked for instead of its template's; ``None``: none."""
    egress_headers: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)
    """Headers the egress proxy sets on its plain-HTTP requests, by host (E2B's network
    ``rules``): secrets, in this file and the service's memory only, never in a log."""
    public_ports: bool | None = None
    """E2B's ``allowPublicTraffic``: its ports take requests without its traffic token."""
    mask_request_host: str | None = None
    """E2B's ``maskRequestHost``: the ``Host`` its ports' requests carry (``${PORT}`` replaced)."""
    preview_public: list[int] = field(default_factory=list)
    """Its ports whose preview URL anyone may reach (``PUT .../ports/{port}`` public), sorted,
    each once: kept here so that a restart, a hibernate and a fork keep them open."""
    network_set: bool = False
    """Its network was set through the API (a create's E2B ``network``, ``update_network``,
    ``PUT .../egress``): a shared backend's sandbox keeps this file for it (its record holds
    its create's allow-list alone: `take_recorded` reads the rest from here at adoption), unless
    its record holds it all (`network_on_record`)."""
    network_on_record: bool = False
    """Its network is recorded on the sandbox itself (a pod's annotation, `sandboxes.lifecycle.
    RecordsNetwork`), where every replica reads it with its record: no file is kept for it, and
    a file's network never overrides it."""
    deleting: bool = False
    """A tombstone: deletion started. A restart finishes it instead of adopting the sandbox
    back from its container's labels."""

    @property
    def deleted_on_record(self) -> bool:
        """Whether its record (a shared backend's sandbox's, or its claim's) says it was deleted:
        its expiry is `DELETED_AT`, which a deletion records before its destroy. Its destroy failed
        or is under way, by whichever replica (or this one before a restart): every replica and
        every start reads it gone and reaps it, as a record whose expiry passed; none lists,
        finds or counts it, and no renewal moves it (`sandboxes.server.claims.Claims.renew`)."""
        return self.expires_at <= DELETED_AT

    @property
    def kept_beside_record(self) -> bool:
        """Whether a shared backend's sandbox keeps this file beside its record, for what the
        record cannot say: its network set through the API, or a pause at its timeout or with its
        clock stopped (its record says frozen alone), or a pause under way. `take_recorded` reads
        it back at adoption."""
        beside = self.network_set and not self.network_on_record
        return beside or self.paused in _PAUSES_BESIDE_RECORD or bool(self.pause_intent)

    def take_recorded(self, recorded: SandboxState) -> None:
        """Take what ``recorded`` (its state file) says over its record: its network if set, and
        its pause at its timeout or with its clock stopped while its record still says frozen, and
        a pause under way (with the expiry a pause at its timeout gives, if later than its record's),
        and a resume under way; and its deletion (`deleting`), which no expiry undoes."""
        self.deleting = self.deleting or recorded.deleting
        if recorded.network_set and not self.network_on_record:  # its record's is every replica's
            self.take_network(recorded)
        if self.paused and recorded.paused in _PAUSES_BESIDE_RECORD:
            self.paused, self.paused_remaining = recorded.paused, recorded.paused_remaining
        if recorded.pause_intent:
            self.pause_intent, self.paused_remaining = recorded.pause_intent, recorded.paused_remaining
            self.expires_at = max(self.expires_at, recorded.expires_at)
        if recorded.resume_expiry:
            self.resume_expiry = recorded.resume_expiry

    def settle_pause(self, frozen: bool, guarded_until: float = 0.0) -> None:
        """Settle a pause a crash interrupted (`pause_intent`) by what the backend says now: ``frozen``,
        it is completed (one with its clock stopped recorded to expire no sooner than
        ``guarded_until``, which a shared backend's other replicas read); running, one asked for
        is undone, and one at its timeout stays under way (the service makes it again)."""
        if frozen and self.pause_intent:
            self.paused, self.pause_intent = self.pause_intent, ""
            if self.paused == "stop":
                self.expires_at = max(self.expires_at, guarded_until)
        elif self.pause_intent and self.pause_intent != PAUSED_AT_TIMEOUT:
            self.paused, self.pause_intent, self.paused_remaining = "", "", 0.0

    def settle_resume(self, thawed: bool) -> None:
        """Settle a resume a crash interrupted (`resume_expiry`) by what the backend says now:
        ``thawed``, it is completed with the expiry it was to give; still frozen, it stays paused
        as it was (the resume is dropped, as one that never began)."""
        if self.resume_expiry and thawed:
            self.expires_at, self.paused, self.paused_remaining = self.resume_expiry, "", 0.0
            self.processes_ended = False
        self.resume_expiry = 0.0

    def take_network(self, recorded: SandboxState) -> None:
        """Serve what ``recorded`` (its state file) says of its network, over its record's."""
        self.egress_allow = None if recorded.egress_allow is None else list(recorded.egress_allow)
        self.egress_headers = {host: dict(values) for host, values in recorded.egress_headers.items()}
        self.public_ports, self.mask_request_host = recorded.public_ports, recorded.mask_request_host
        self.preview_public = list(recorded.preview_public)
        self.network_set = recorded.network_set

    def network(self) -> Network:
        """What `take_network` takes, to compare, and to give back (`restore_network`): a copy,
        which no later change to this state alters."""
        return Network(
            None if self.egress_allow is None else tuple(self.egress_allow),
            tuple((host, tuple(values.items())) for host, values in self.egress_headers.items()),
            self.public_ports,
            self.mask_request_host,
            tuple(self.preview_public),
        )

    def restore_network(self, network: Network) -> None:
        """Its network as ``network`` (what `network` returned then) says it."""
        self.egress_allow = None if network.allow is None else list(network.allow)
        self.egress_headers = {host: dict(values) for host, values in network.headers}
        self.public_ports, self.mask_request_host = network.public_ports, network.mask_request_host
        self.preview_public = list(network.preview_public)

    def set_preview_public(self, port: int, public: bool) -> None:
        """``port`` in `preview_public` or not, the list still sorted with each port once."""
        at = bisect_left(self.preview_public, port)
        held = at < len(self.preview_public) and self.preview_public[at] == port
        if public and not held:
            insort(self.preview_public, port)
        elif not public and held:
            del self.preview_public[at]

    def preview_is_public(self, port: int) -> bool:
        at = bisect_left(self.preview_public, port)
        return at < len(self.preview_public) and self.preview_public[at] == port

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SandboxState:
        return cls(**{key: data[key] for key in cls.__dataclass_fields__ if key in data})


class StateStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o700)

    def save(self, state: SandboxState) -> None:
        replace_private(self._path(state.id), json.dumps(state.to_json()))

    def load(self, sandbox_id: str) -> SandboxState | None:
        """The state saved of ``sandbox_id`` (by this replica or another sharing the directory);
        ``None`` if none is, or it cannot be read, or no sandbox can have that id."""
        if not _SAFE_ID.match(sandbox_id):
            return None
        try:
            return SandboxState.from_json(json.loads(self._path(sandbox_id).read_text(encoding="utf-8")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            logger.warning("ignoring unreadable state file of %s: %s", sandbox_id, exc)
            return None

    def save_new(self, state: SandboxState) -> bool:
        """`save`, only if no state of that id is saved: ``False`` (nothing written) if one is.
        The file appears whole or not at all, and of two concurrent callers one alone writes it."""
        path = self._path(state.id)
        temporary = path.with_name(f".{path.name}.{random_id()}.new")  # no other writer's, on any host
        _write_private(temporary, json.dumps(state.to_json()))
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        finally:
            temporary.unlink()
        return True

    def remove(self, sandbox_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(sandbox_id).unlink()

    def load_all(self) -> list[SandboxState]:
        states = []
        for path in sorted(self.directory.glob("*.json")):
            try:
                states.append(SandboxState.from_json(json.loads(path.read_text(encoding="utf-8"))))
            except (OSError, ValueError, TypeError) as exc:
                logger.warning("ignoring unreadable state file %s: %s", path, exc)
        return states

    def _path(self, sandbox_id: str) -> Path:
        if not _SAFE_ID.match(sandbox_id):
            raise ValueError(f"unsafe sandbox id {sandbox_id!r}")
        return self.directory / f"{sandbox_id}.json"


def replace_private(path: Path, text: str) -> None:
    """``text`` as the whole of ``path`` (0600), in one step: a ``kill -9`` leaves the old file or
    the new, and writers racing (replicas sharing the directory) each replace it whole."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        _write_private(temporary, text)
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


def _write_private(path: Path, text: str) -> None:
    """``text`` as the whole of ``path``, a file only the service's user reads (a state holds
    secrets: its env, its egress headers)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        os.fchmod(descriptor, 0o600)
        out.write(text)
