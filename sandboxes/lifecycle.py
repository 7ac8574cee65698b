"""The lifecycle contract: one meaning of ``close``, ``destroy`` and ``with`` for every sandbox.

* ``close()`` lets go of what this handle holds (connections, exec helpers, temporary files on
  the caller's side); the sandbox and its files live on, and another handle may attach to them.
* ``destroy()`` removes the sandbox and everything in it, then closes. Idempotent: a sandbox
  already gone (expired, destroyed elsewhere) is not an error.
* ``with`` destroys what the caller created and only closes what it attached to: leaving a
  block must never delete a sandbox someone else made (an agent resuming a thread attaches to
  its sandbox; the service adopts containers after a restart). `owned` records which it is.

Every backend's sandbox follows it by inheriting `Lifecycle`; ``tests/test_lifecycle.py`` checks
each one against a real backend.
"""

from __future__ import annotations

import abc
import asyncio
from typing import Self

__all__ = ["Lifecycle"]


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
