"""What a `sandboxes.lifecycle.Provider` promises, checked against a real backend.

Subclass `ProviderConformance` and provide a ``provider`` fixture: a provider of your backend
whose sweeps reach only the sandboxes these tests make (its own owner, root or base
directory). The tests create, attach, list, destroy and sweep through it, and check what the
backend itself records (`Provider.list`), never only what a handle remembers. A
`SharedProvider`'s tests also subclass `SharedProviderConformance`: selection by label, and an
expiry moved after creation that every process's list and sweep read back.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from pydantic import ValidationError

from sandboxes.lifecycle import CreateOptions, Lifecycle, Provider, SandboxNameTaken, SandboxRecord, SharedProvider

__all__ = ["ProviderConformance", "SharedProviderConformance"]

LABELS = {"conformance": "yes", "tenant": "t-1"}


class ProviderConformance:
    @pytest.fixture
    def provider(self) -> Any:
        raise NotImplementedError("subclasses provide a `provider` fixture")

    def test_is_a_provider(self, provider: Any) -> None:
        assert isinstance(provider, Provider)

    def test_create_records_labels_env_and_expiry(self, provider: Any) -> None:
        before = time.time()
        with provider.create(CreateOptions(labels=LABELS, env={"CONFORMANCE_VAR": "seen"}, ttl=600)) as sandbox:
            assert issubclass(type(sandbox), Lifecycle)
            assert sandbox.owned
            assert sandbox.execute('echo "$CONFORMANCE_VAR"').output == "seen\n"
            record = _record(provider, sandbox)
            assert record is not None, "list() does not show a sandbox just created"
            assert dict(record.labels) == LABELS
            assert record.running
            assert record.expires_at is not None
            assert before + 600 - 5 <= record.expires_at <= time.time() + 600 + 5
        assert _record(provider, sandbox) is None, "leaving a created sandbox's block left it listed"

    def test_attach_by_ref_only_closes(self, provider: Any) -> None:
        created = provider.create(CreateOptions(labels=LABELS, env={"CONFORMANCE_VAR": "again"}))
        try:
            record = _record(provider, created)
            assert record is not None
            with provider.attach(record.ref) as attached:
                assert not attached.owned
                assert attached.id == created.id
                assert attached.execute('echo "$CONFORMANCE_VAR"').output == "again\n"
            again = _record(provider, created)
            assert again is not None, "leaving an attached handle's block destroyed the sandbox"
            assert dict(again.labels) == LABELS
        finally:
            created.destroy()
        assert _record(provider, created) is None

    def test_destroy_by_ref_is_idempotent_and_attach_then_fails(self, provider: Any) -> None:
        sandbox = provider.create()
        record = _record(provider, sandbox)
        assert record is not None
        sandbox.close()
        provider.destroy(record.ref)
        assert _record(provider, sandbox) is None
        provider.destroy(record.ref)
        with pytest.raises(LookupError):
            provider.attach(record.ref)

    def test_sweep_removes_only_the_expired(self, provider: Any) -> None:
        """Expiry is judged on the caller's clock: a sweep at a ``now`` past the short TTL reaps
        it, one at the real time does not. The short TTL leaves the real clock far behind it
        (a 1 s TTL could pass while a slow backend was still creating, and a pod's
        ``activeDeadlineSeconds`` from it ends the pod itself)."""
        short = provider.create(CreateOptions(ttl=30))
        long = provider.create(CreateOptions(ttl=3600))
        try:
            short_record, long_record = _record(provider, short), _record(provider, long)
            assert short_record is not None
            assert long_record is not None
            assert short_record.ref not in provider.sweep().removed  # not yet: the clock is the caller's
            swept = provider.sweep(now=time.time() + 60)
            assert short_record.ref in swept.removed
            assert long_record.ref not in swept.removed
            assert _record(provider, short) is None
            assert _record(provider, long) is not None
            assert long.execute("echo alive").output == "alive\n"
        finally:
            short.close()
            long.destroy()


class SharedProviderConformance:
    @pytest.fixture
    def provider(self) -> Any:
        raise NotImplementedError("subclasses provide a `provider` fixture")

    def test_is_a_shared_provider(self, provider: Any) -> None:
        assert isinstance(provider, SharedProvider)

    def test_select_reads_only_the_matching_labels(self, provider: Any) -> None:
        one = provider.create(CreateOptions(labels={**LABELS, "pick": "one"}))
        two = provider.create(CreateOptions(labels={**LABELS, "pick": "two"}))
        try:
            picked = provider.select({"pick": "one"})
            assert [record.id for record in picked] == [one.id]
            assert dict(picked[0].labels) == {**LABELS, "pick": "one"}
            assert {record.id for record in provider.select(LABELS)} == {one.id, two.id}
            assert provider.select({"pick": "three"}) == []
        finally:
            one.destroy()
            two.destroy()
        assert provider.select({"pick": "one"}) == []

    def test_a_name_is_one_sandbox(self, provider: Any) -> None:
        """A second create with a living sandbox's `CreateOptions.name` is refused, makes
        nothing, and leaves the first whole: how racing processes make one sandbox."""
        name = uuid.uuid4().hex
        first = provider.create(CreateOptions(labels={**LABELS, "named": "first"}, name=name))
        try:
            with pytest.raises(SandboxNameTaken):
                provider.create(CreateOptions(labels={**LABELS, "named": "second"}, name=name))
            assert provider.select({"named": "second"}) == []
            assert [record.id for record in provider.select({"named": "first"})] == [first.id]
            assert first.execute("echo whole > kept && cat kept").output == "whole\n"
        finally:
            first.destroy()

    def test_an_expiry_moved_later_is_what_lists_and_sweeps_read(self, provider: Any) -> None:
        now = time.time()
        sandbox = provider.create(CreateOptions(expires_at=now + 60))
        try:
            record = _record(provider, sandbox)
            assert record is not None
            assert record.expires_at is not None
            assert abs(record.expires_at - (now + 60)) <= 1
            provider.set_expiry(record.ref, now + 3600)
            moved = _record(provider, sandbox)
            assert moved is not None
            assert moved.expires_at is not None
            assert abs(moved.expires_at - (now + 3600)) <= 1
            assert record.ref not in provider.sweep(now=now + 120).removed  # past the first expiry
            assert sandbox.execute("echo alive").output == "alive\n"
            assert record.ref in provider.sweep(now=now + 7200).removed
            assert _record(provider, sandbox) is None
            with pytest.raises(LookupError):
                provider.set_expiry(record.ref, now + 7200)
        finally:
            sandbox.destroy()

    def test_an_expiry_is_a_ttl_or_an_instant_not_both(self) -> None:
        with pytest.raises(ValidationError, match="not both"):
            CreateOptions(ttl=60, expires_at=time.time() + 60)


def _record(provider: Any, sandbox: Any) -> SandboxRecord | None:
    found = [record for record in provider.list() if record.id == sandbox.id]
    assert len(found) <= 1, found
    return found[0] if found else None
