"""CompositeBackend's async twins: they await the routed backends' own async methods, fan
searches out concurrently, raise a backend's error only once every call has finished, and
answer as the sync methods do."""

from __future__ import annotations

import asyncio

import pytest
from composite_support import paths_of

from sandboxes import protocol as p
from sandboxes.composite import CompositeBackend
from sandboxes.state import StateBackend


class AsyncOnlyState(StateBackend):
    """Answers only through its async twins, so a composite that falls back to running its own
    sync methods in a thread (instead of awaiting the routed backend) fails loudly. Searches
    wait for each other at a barrier: sequential awaiting would never get past it."""

    def __init__(self, barrier: asyncio.Barrier | None = None) -> None:
        super().__init__()
        self.sync_allowed = True
        self.barrier = barrier

    def _sync(self) -> None:
        if not self.sync_allowed:
            raise AssertionError("the composite called a sync method from an async twin")

    def ls(self, path: str) -> p.LsResult:
        self._sync()
        return super().ls(path)

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> p.ReadResult:
        self._sync()
        return super().read(file_path, offset, limit)

    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> p.GrepResult:
        self._sync()
        return super().grep(pattern, path, glob, max_count=max_count)

    def glob(self, pattern: str, path: str | None = None) -> p.GlobResult:
        self._sync()
        return super().glob(pattern, path)

    async def als(self, path: str) -> p.LsResult:
        return StateBackend.ls(self, path)

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> p.ReadResult:
        return StateBackend.read(self, file_path, offset, limit)

    async def agrep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> p.GrepResult:
        if self.barrier is not None:
            await self.barrier.wait()
        return StateBackend.grep(self, pattern, path, glob, max_count=max_count)

    async def aglob(self, pattern: str, path: str | None = None) -> p.GlobResult:
        if self.barrier is not None:
            await self.barrier.wait()
        return StateBackend.glob(self, pattern, path)


async def test_async_twins_use_the_routed_backends_async_methods() -> None:
    default, mem = AsyncOnlyState(), AsyncOnlyState()
    composite = CompositeBackend(default, {"/mem": mem})
    composite.write("/a.txt", "needle")
    composite.write("/mem/b.txt", "needle")
    default.sync_allowed = mem.sync_allowed = False
    assert paths_of((await composite.als("/")).entries) == ["/a.txt", "/mem/"]
    assert paths_of((await composite.als("/mem")).entries) == ["/mem/b.txt"]
    read = await composite.aread("/mem/b.txt")
    assert read.file_data is not None
    assert read.file_data.content == "needle"
    default.barrier = mem.barrier = asyncio.Barrier(2)  # both searches must be in flight at once
    grep = await asyncio.wait_for(composite.agrep("needle", "/"), timeout=5)
    assert paths_of(grep.matches) == ["/a.txt", "/mem/b.txt"]
    default.barrier = mem.barrier = asyncio.Barrier(2)
    glob = await asyncio.wait_for(composite.aglob("*.txt"), timeout=5)
    assert paths_of(glob.matches) == ["/a.txt", "/mem/b.txt"]


async def test_async_fan_out_raises_an_unreachable_backends_error_after_all_calls_finish() -> None:
    class Unreachable(StateBackend):
        async def aglob(self, pattern: str, path: str | None = None) -> p.GlobResult:
            raise ConnectionError("sandbox unreachable")

    class Slow(StateBackend):
        finished = False

        async def aglob(self, pattern: str, path: str | None = None) -> p.GlobResult:
            await asyncio.sleep(0.05)
            Slow.finished = True
            return StateBackend.glob(self, pattern, path)

    composite = CompositeBackend(Slow(), {"/gone": Unreachable()})
    with pytest.raises(ConnectionError, match="unreachable"):
        await composite.aglob("*")
    assert Slow.finished


async def test_async_answers_equal_sync_answers() -> None:
    composite = CompositeBackend(StateBackend(), {"/mem": StateBackend(), "/d/c": StateBackend()})
    assert await composite.awrite("/mem/x.txt", "hi\n") == p.WriteResult(path="/mem/x.txt")
    await composite.aupload_files([("/d/c/z.txt", b"hi\n"), ("/top.txt", b"hi\n")])
    assert await composite.agrep("hi", "/", max_count=3) == composite.grep("hi", "/", max_count=3)
    assert await composite.aglob("**/*.txt", "/d") == composite.glob("**/*.txt", "/d")
    assert await composite.adownload_files(["/d/c/z.txt", "/nope"]) == composite.download_files(["/d/c/z.txt", "/nope"])
    assert await composite.aedit("/mem/x.txt", "hi", "ho") == p.EditResult(path="/mem/x.txt", occurrences=1)
    assert await composite.adelete("/mem") == composite.delete("/mem")
    assert await composite.adelete("/mem/x.txt") == p.DeleteResult(path="/mem/x.txt")
