"""What `sandboxes.lifecycle` promises, checked against a real backend.

Subclass `LifecycleConformance` and provide three fixtures: ``create`` (a new sandbox, owned by
the caller), ``attach`` (a second handle on an existing sandbox, by the handle's id or by
whatever the backend attaches with) and ``exists`` (whether the sandbox is still there, asked of
the backend itself, not of a handle).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePath
from typing import Any

import pytest

from sandboxes.lifecycle import Lifecycle

__all__ = ["LifecycleConformance"]

Create = Callable[[], Any]
Attach = Callable[[Any], Any]
Exists = Callable[[Any], bool]


class LifecycleConformance:
    @pytest.fixture
    def create(self) -> Create:
        raise NotImplementedError("subclasses provide a `create` fixture")

    @pytest.fixture
    def attach(self) -> Attach:
        raise NotImplementedError("subclasses provide an `attach` fixture")

    @pytest.fixture
    def exists(self) -> Exists:
        raise NotImplementedError("subclasses provide an `exists` fixture")

    def test_with_destroys_what_it_created(self, create: Create, exists: Exists) -> None:
        with create() as sandbox:
            assert issubclass(type(sandbox), Lifecycle)
            assert sandbox.owned
            assert sandbox.execute("echo alive").output == "alive\n"
            assert exists(sandbox)
        assert not exists(sandbox)

    def test_with_only_closes_what_it_attached_to(self, create: Create, attach: Attach, exists: Exists) -> None:
        original = create()
        try:
            original.write(f"{_home(original)}/kept.txt", "kept")
            with attach(original) as attached:
                assert not attached.owned
                assert attached.execute("echo attached").output == "attached\n"
            assert exists(original), "leaving an attached handle's block destroyed the sandbox"
            again = attach(original)
            try:
                assert again.read(f"{_home(original)}/kept.txt").file_data is not None
            finally:
                again.close()
        finally:
            original.destroy()
        assert not exists(original)

    def test_the_id_names_the_sandbox_not_the_handle(self, create: Create, attach: Attach) -> None:
        """What ``id`` is for: a second handle on the same sandbox has the same id (a caller
        holding the id finds its sandbox again), another sandbox has another."""
        original, other = create(), create()
        try:
            attached = attach(original)
            try:
                assert attached.id == original.id, "a handle on the same sandbox answers another id"
                assert attached.execute("echo same").output == "same\n"
            finally:
                attached.close()
            assert other.id != original.id, "two sandboxes answer the same id"
        finally:
            original.destroy()
            other.destroy()

    def test_close_keeps_destroy_is_idempotent(self, create: Create, exists: Exists) -> None:
        sandbox = create()
        sandbox.close()
        sandbox.close()
        assert exists(sandbox)
        sandbox.destroy()
        sandbox.destroy()
        assert not exists(sandbox)


def _home(sandbox: Any) -> str:
    """A directory the sandbox may write and that outlives a handle: its workspace or root
    directory where it has one, else /tmp (which is private to a handle on a local sandbox)."""
    for name in ("workspace", "workdir", "root"):
        value = getattr(sandbox, name, None)
        if isinstance(value, str | PurePath):
            return str(value)
    return "/tmp"
