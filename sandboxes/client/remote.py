"""`RemoteSandbox`: a sandbox of the service, usable exactly like a local backend.

Every protocol method is one HTTP call whose JSON answer becomes the same dataclass a local
backend returns, so an agent cannot tell the difference. What a local backend cannot do also
shows the same way: a command or write whose connection broke after it was sent answers
``connection_lost`` (it is never sent twice), as `SSHSandbox` does. Failures of the service
itself (bad key, sandbox gone, quota, rate limit after retries) raise the exceptions of
`sandboxes.client.errors`: no result dataclass could express them.

Sync methods use a `SandboxClient`, async ones an `AsyncSandboxClient` (native asyncio, no
threads). The handle works from either (`sandboxes.client._http.Connections`): whichever it was
made with is used as is, the other's connection is made on first use from the same configuration.
"""

from __future__ import annotations

import contextlib
import uuid
from asyncio import sleep as asleep
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import IO, TYPE_CHECKING, cast

from sandboxes import api
from sandboxes import protocol as p
from sandboxes.client import _ops, _state_ops
from sandboxes.client import _wire as w
from sandboxes.client._bulk import (
    TAR_OVERHEAD,
    Bound,
    Inline,
    Outcome,
    Step,
    file_from_tar,
    plan_uploads,
    tar_failure,
    tar_of_one,
)
from sandboxes.client._http import AsyncServiceConnection, Connections, ServiceConnection, achunks_of, chunks_of
from sandboxes.client._light import Polling, TransportErrors, polled_until_ended
from sandboxes.client._streams import AsyncCommandStream, CommandStream
from sandboxes.client._watches import AsyncWatchStream, WatchStream
from sandboxes.client.errors import ConnectionLost, NotFound, OperationFailed
from sandboxes.lifecycle import Sandbox

if TYPE_CHECKING:  # imported where used: websockets is for ports and terminals alone
    from sandboxes.client._ports import AsyncPortConnection, PortConnection, PortForward
    from sandboxes.client._pty import AsyncRemoteTerminal, RemoteTerminal

ArchiveSource = bytes | IO[bytes] | Iterable[bytes]
"""A tar stream to upload: bytes, a binary file (read in chunks), or an iterable of chunks."""

_CHUNK = 1 << 16


class RemoteSandbox(Sandbox):
    """A sandbox living in the service. ``with`` destroys it if this handle created it
    (`SandboxClient.create`) and only closes it if attached (`SandboxClient.attach`)."""

    def __init__(
        self,
        sandbox_id: str,
        client: ServiceConnection | AsyncServiceConnection,
        *,
        info: api.SandboxInfo | None = None,
        owned: bool = False,
    ) -> None:
        self._id = sandbox_id
        self.owned = owned
        self.info = info
        """The last known lifecycle record (from create, `refresh` or `renew`)."""
        self.config = client.config
        self._connections = Connections(client)

    @property
    def id(self) -> str:
        return self._id

    @property
    def ref(self) -> str:
        """What `SandboxClient.attach` takes: the service's id."""
        return self._id

    def __repr__(self) -> str:
        return f"RemoteSandbox({self._id!r}, url={self.config.url!r})"

    # ------------------------------------------------------------------ clients

    def _sync(self) -> ServiceConnection:
        return self._connections.sync()

    def _async(self) -> AsyncServiceConnection:
        return self._connections.async_()

    def close(self) -> None:
        """Release connections this handle opened itself (not the client it was given)."""
        self._connections.close()

    # ------------------------------------------------------------------ ports

    def connect_port(self, port: int) -> PortConnection:
        """A TCP connection to 127.0.0.1:``port`` inside the sandbox, over the service's tunnel."""
        from sandboxes.client._ports import PortConnection

        return PortConnection(self.config, self._id, port)

    async def aconnect_port(self, port: int) -> AsyncPortConnection:
        from sandboxes.client._ports import AsyncPortConnection

        return await AsyncPortConnection.open(self.config, self._id, port)

    def forward_port(self, port: int, local_port: int = 0) -> PortForward:
        """Listen on 127.0.0.1:``local_port`` (0: any free one) and forward each connection to
        ``port`` inside the sandbox, until closed (``with`` closes it)."""
        from sandboxes.client._ports import PortForward

        return PortForward(self.config, self._id, port, local_port)

    def preview_url(self, port: int, ttl: float = 3600.0) -> api.PreviewToken:
        """A link to ``port``'s preview URL that anyone holding it may open (a browser, a
        colleague) until ``ttl`` seconds pass or it is revoked; ``.url`` is its path on the
        service (the token in its query)."""
        return self._sync().call(_ops.preview_token(self._id, port, ttl))

    async def apreview_url(self, port: int, ttl: float = 3600.0) -> api.PreviewToken:
        return await self._async().call(_ops.preview_token(self._id, port, ttl))

    # ------------------------------------------------------------------ lifecycle

    def refresh(self) -> api.SandboxInfo:
        self.info = self._sync().get(self._id)
        return self.info

    def renew(self, ttl: float) -> api.SandboxInfo:
        """Push the expiry to ``ttl`` seconds from now."""
        self.info = self._sync().renew(self._id, ttl)
        return self.info

    def metrics(self) -> api.SandboxMetrics:
        """The samples of this sandbox's usage the service kept, oldest first."""
        return self._sync().metrics(self._id)

    async def ametrics(self) -> api.SandboxMetrics:
        return await self._async().metrics(self._id)

    def pause(self, ttl: str = "keep", *, mode: str = "freeze", memory: bool = False) -> api.SandboxInfo:
        """Freeze the sandbox's processes where they are, or (``mode="hibernate"``) keep its
        files in a snapshot and release it, its processes ended (``info.processes_kept`` says
        which); ``ttl``: ``keep`` (its expiry runs on) or ``stop`` (what is left of it is given
        back at `resume`). `Paused` if it is already; a hibernate asked to keep ``memory``
        raises `OperationFailed` (``unavailable``), the sandbox left running."""
        self.info = self._sync().pause(self._id, ttl, mode=mode, memory=memory)
        return self.info

    def resume(self) -> api.SandboxInfo:
        """Let a paused sandbox's processes run again (one that runs: as it is)."""
        self.info = self._sync().resume(self._id)
        return self.info

    def snapshot(self, paths: Sequence[str] = (), *, workspace: bool = True) -> api.SnapshotInfo:
        """Keep the sandbox's workspace (unless ``workspace=False``) and ``paths`` in the
        service's snapshot store; ``client.create(snapshot=info.id)`` restores it, verified."""
        return self._sync().call(_state_ops.take_snapshot(self._id, workspace, paths))

    def fork(self, count: int = 1, *, idempotency_key: str | None = None) -> list[RemoteSandbox]:
        """``count`` new sandboxes with this one's workspace, owned by the caller; retried with
        one ``Idempotency-Key`` (``idempotency_key``, else a fresh one), so a retry answers the
        same sandboxes."""
        forked = self._sync().call(_state_ops.fork(self._id, count, idempotency_key or str(uuid.uuid4())))
        return [RemoteSandbox(info.id, self._sync(), info=info, owned=True) for info in forked.sandboxes]

    @property
    def workdir(self) -> str:
        """Where the sandbox's files live (``/workspace``, a local sandbox's root directory), as
        the service says it; ``/`` if it says nothing."""
        if self.info is None:
            self.refresh()
        return (self.info.workdir if self.info is not None else None) or "/"

    def destroy(self) -> None:
        """Delete the sandbox; one already gone (expired, deleted) is not an error."""
        try:
            self._sync().delete(self._id)
        except NotFound:
            pass
        finally:
            self.close()

    async def arefresh(self) -> api.SandboxInfo:
        self.info = await self._async().get(self._id)
        return self.info

    async def arenew(self, ttl: float) -> api.SandboxInfo:
        self.info = await self._async().renew(self._id, ttl)
        return self.info

    async def apause(self, ttl: str = "keep", *, mode: str = "freeze", memory: bool = False) -> api.SandboxInfo:
        self.info = await self._async().pause(self._id, ttl, mode=mode, memory=memory)
        return self.info

    async def aresume(self) -> api.SandboxInfo:
        self.info = await self._async().resume(self._id)
        return self.info

    async def asnapshot(self, paths: Sequence[str] = (), *, workspace: bool = True) -> api.SnapshotInfo:
        return await self._async().call(_state_ops.take_snapshot(self._id, workspace, paths))

    async def afork(self, count: int = 1, *, idempotency_key: str | None = None) -> list[RemoteSandbox]:
        key = idempotency_key or str(uuid.uuid4())
        forked = await self._async().call(_state_ops.fork(self._id, count, key))
        return [RemoteSandbox(info.id, self._async(), info=info, owned=True) for info in forked.sandboxes]

    async def adestroy(self) -> None:
        try:
            with contextlib.suppress(NotFound):
                await self._async().delete(self._id)
        finally:
            self.close()

    # ------------------------------------------------------------------ commands

    def execute(
        self,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int | None = None,
    ) -> p.ExecuteResponse:
        body = _ops.execute_body(command, timeout=timeout, stdin=stdin, env=env, cwd=cwd, output_limit=output_limit)
        return self._sync().call(_ops.execute(self.config, self._id, body))

    async def aexecute(
        self,
        command: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the command's timeout, enforced by the service
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int | None = None,
    ) -> p.ExecuteResponse:
        body = _ops.execute_body(command, timeout=timeout, stdin=stdin, env=env, cwd=cwd, output_limit=output_limit)
        return await self._async().call(_ops.execute(self.config, self._id, body))

    def execute_stream(
        self,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int | None = None,
    ) -> CommandStream:
        """Output chunks (str) as the command prints them, then exactly one `ExecuteResponse`.

        The final response is the same as ``execute`` would return (its ``output`` included). If
        the connection breaks mid-stream, the stream follows the command again once from where
        it was (no byte lost or repeated); if that fails too, the response is ``connection_lost``.
        The command runs on in the service when its stream is lost or closed, until its timeout.
        """
        body = _ops.execute_body(command, timeout=timeout, stdin=stdin, env=env, cwd=cwd, output_limit=output_limit)
        return CommandStream(self._sync(), self._id, _ops.execute_stream(self.config, self._id, body))

    def attach_stream(self, command_id: str, offset: int = 0) -> CommandStream:
        """Follow a streamed command again (a `CommandStream`'s ``command_id``) from byte ``offset``
        of its output (its ``offset``): the rest of its output, then its final response."""
        return CommandStream(self._sync(), self._id, _ops.attach_stream(self._id, command_id, offset))

    def kill_stream(self, command_id: str) -> p.ExecuteResponse:
        """Kill a streamed command (a `CommandStream`'s ``command_id``) with its whole process
        tree, followed or not; its final response."""
        return self._sync().call(_ops.kill_stream(self._id, command_id))

    def aexecute_stream(
        self,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int | None = None,
    ) -> AsyncCommandStream:
        """`execute_stream`'s async twin."""
        body = _ops.execute_body(command, timeout=timeout, stdin=stdin, env=env, cwd=cwd, output_limit=output_limit)
        return AsyncCommandStream(self._async, self._id, _ops.execute_stream(self.config, self._id, body))

    def aattach_stream(self, command_id: str, offset: int = 0) -> AsyncCommandStream:
        """`attach_stream`'s async twin."""
        return AsyncCommandStream(self._async, self._id, _ops.attach_stream(self._id, command_id, offset))

    async def akill_stream(self, command_id: str) -> p.ExecuteResponse:
        """`kill_stream`'s async twin."""
        return await self._async().call(_ops.kill_stream(self._id, command_id))

    # ------------------------------------------------------------------ terminals

    def pty(
        self, cols: int = 80, rows: int = 24, command: str | None = None, *, session: str | None = None
    ) -> RemoteTerminal:
        """A terminal in the sandbox running ``command`` (a login shell by default), or the
        one of ``session`` reattached (its scrollback first); `pydantic.ValidationError` for
        a size out of bounds."""
        from sandboxes.client._pty import open_pty

        return open_pty(self.config, self._id, api.PtySize(cols=cols, rows=rows), command, session)

    async def apty(
        self, cols: int = 80, rows: int = 24, command: str | None = None, *, session: str | None = None
    ) -> AsyncRemoteTerminal:
        """`pty` on an event loop."""
        from sandboxes.client._pty import aopen_pty

        return await aopen_pty(self.config, self._id, api.PtySize(cols=cols, rows=rows), command, session)

    # ------------------------------------------------------------------ file watches

    def watch(self, path: str, *, recursive: bool = False, timeout: float | None = None) -> WatchStream:
        """Watch the directory ``path`` (``GET .../watch``): its `api.WatchEvent`s as they come,
        once in place, until the stream is closed or ``timeout`` seconds passed; `OperationFailed`
        if it cannot start (``file_not_found``, ``not_a_directory``...)."""
        return WatchStream(self._sync(), self._id, path, recursive, timeout)

    async def awatch(self, path: str, *, recursive: bool = False, timeout: float | None = None) -> AsyncWatchStream:  # noqa: ASYNC109
        """`watch`'s async twin (``timeout``: the watch's lifetime in the service, not a wait here)."""
        return await AsyncWatchStream.open(self._async(), self._id, path, recursive, timeout)

    def create_watcher(self, path: str, *, recursive: bool = False) -> str:
        """A polled watcher of the directory ``path``, in place once answered: its id, for
        `watcher_events`. The service removes it after a while without a poll."""
        return self._sync().call(_ops.create_watcher(self._id, path, recursive)).id

    def watcher_events(self, watcher_id: str) -> api.WatcherEvents:
        """The events the watcher queued since the last call (taken from it)."""
        return self._sync().call(_ops.watcher_events(self._id, watcher_id))

    def remove_watcher(self, watcher_id: str) -> None:
        self._sync().call(_ops.remove_watcher(self._id, watcher_id))

    async def acreate_watcher(self, path: str, *, recursive: bool = False) -> str:
        return (await self._async().call(_ops.create_watcher(self._id, path, recursive))).id

    async def awatcher_events(self, watcher_id: str) -> api.WatcherEvents:
        return await self._async().call(_ops.watcher_events(self._id, watcher_id))

    async def aremove_watcher(self, watcher_id: str) -> None:
        await self._async().call(_ops.remove_watcher(self._id, watcher_id))

    # ------------------------------------------------------------------ background processes

    def start_process(
        self,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int | None = None,
    ) -> w.ProcessStatus:
        """Start ``command`` in the background; poll it with `poll_process`."""
        body = _ops.execute_body(command, timeout=timeout, stdin=stdin, env=env, cwd=cwd, output_limit=output_limit)
        return self._sync().call(_ops.start_process(self._id, body))

    def poll_process(self, process_id: str) -> w.ProcessStatus:
        return self._sync().call(_ops.poll_process(self._id, process_id))

    def kill_process(self, process_id: str) -> w.ProcessStatus:
        return self._sync().call(_ops.kill_process(self._id, process_id))

    def wait_process(self, process_id: str, *, timeout: float | None = None, interval: float = 0.1) -> w.ProcessStatus:
        """Poll until the process has ended, or until ``timeout`` seconds (then the last status)."""
        return polled_until_ended(lambda: self.poll_process(process_id), timeout, interval)

    async def astart_process(
        self,
        command: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the command's timeout, enforced by the service
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int | None = None,
    ) -> w.ProcessStatus:
        body = _ops.execute_body(command, timeout=timeout, stdin=stdin, env=env, cwd=cwd, output_limit=output_limit)
        return await self._async().call(_ops.start_process(self._id, body))

    async def apoll_process(self, process_id: str) -> w.ProcessStatus:
        return await self._async().call(_ops.poll_process(self._id, process_id))

    async def akill_process(self, process_id: str) -> w.ProcessStatus:
        return await self._async().call(_ops.kill_process(self._id, process_id))

    async def await_process(
        self,
        process_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a polling budget, returns the last status
        interval: float = 0.1,
    ) -> w.ProcessStatus:
        polling = Polling(timeout)
        while True:
            status = await self.apoll_process(process_id)
            if not polling.goes_on(status):
                return status
            await asleep(interval)

    # ------------------------------------------------------------------ archives

    def upload_archive(self, directory: str, tar: ArchiveSource) -> None:
        """Extract a tar stream under ``directory``, streaming it: never held whole in memory."""
        response = self._sync().open(_ops.upload_archive(self._id, directory), content=chunks_of(tar, _CHUNK))
        response.close()

    def download_archive(self, path: str) -> Iterator[bytes]:
        """``path`` (a file or a directory) as a tar stream, chunk by chunk as it arrives.

        Close the iterator (or exhaust it) to release the connection. A connection that breaks
        mid-stream raises `ConnectionLost`: the chunks already seen are not a whole archive.
        """
        op = _ops.download_archive(self._id, path)
        response = self._sync().open(op)
        try:
            with TransportErrors(op.what):
                yield from response.iter_bytes(_CHUNK)
        finally:
            response.close()

    async def aupload_archive(self, directory: str, tar: ArchiveSource | AsyncIterable[bytes]) -> None:
        response = await self._async().open(_ops.upload_archive(self._id, directory), content=achunks_of(tar, _CHUNK))
        await response.aclose()

    async def adownload_archive(self, path: str) -> AsyncIterator[bytes]:
        op = _ops.download_archive(self._id, path)
        response = await self._async().open(op)
        try:
            with TransportErrors(op.what):
                async for chunk in response.aiter_bytes(_CHUNK):
                    yield chunk
        finally:
            await response.aclose()

    # ------------------------------------------------------------------ file operations

    def ls(self, path: str) -> p.LsResult:
        return self._sync().call(_ops.ls(self._id, path))

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> p.ReadResult:
        return self._sync().call(_ops.read(self._id, file_path, offset, limit))

    def write(self, file_path: str, content: str) -> p.WriteResult:
        return self._sync().call(_ops.write(self._id, file_path, content))

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> p.EditResult:
        return self._sync().call(_ops.edit(self._id, file_path, old_string, new_string, replace_all))

    def delete(self, file_path: str) -> p.DeleteResult:
        return self._sync().call(_ops.delete_file(self._id, file_path))

    def grep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> p.GrepResult:
        return self._sync().call(_ops.grep(self._id, pattern, path, glob, max_count))

    def glob(self, pattern: str, path: str | None = None) -> p.GlobResult:
        return self._sync().call(_ops.glob(self._id, pattern, path))

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[p.FileUploadResponse]:
        plan = plan_uploads(files, self.config)
        try:
            step = next(plan)
            while True:
                step = plan.send(self._upload_step(step))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _upload_step(self, step: Step) -> Outcome:
        if isinstance(step, Inline):
            return self._sync().call(_ops.upload(self._id, step.files))
        try:
            self.upload_archive(step.directory, tar_of_one(step.name, step.data))
        except (OperationFailed, ConnectionLost) as exc:
            return tar_failure(step, exc)
        return None, None

    def download_files(self, paths: list[str]) -> list[p.FileDownloadResponse]:
        """Small files inline (base64 in JSON); those the service answers ``file_too_large``
        for (over its inline bound) streamed as a tar, up to ``config.max_download_bytes``."""
        if not paths:
            return []
        found = self._sync().call(_ops.download(self._id, paths))
        bound = Bound.of_batch(self.config, len(paths))
        return [self._streamed(item.path, bound) if item.error == p.FILE_TOO_LARGE else item for item in found]

    def _streamed(self, path: str, bound: Bound) -> p.FileDownloadResponse:
        """``path`` streamed as a tar, read as it arrives and never past ``bound``."""
        stream = cast("Generator[bytes]", self.download_archive(path))
        try:
            outcome = file_from_tar(stream, bound.share)
        except (OperationFailed, ConnectionLost) as exc:
            return bound.failed(path, exc)
        finally:
            stream.close()
        return bound.answer(path, outcome)

    async def als(self, path: str) -> p.LsResult:
        return await self._async().call(_ops.ls(self._id, path))

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> p.ReadResult:
        return await self._async().call(_ops.read(self._id, file_path, offset, limit))

    async def awrite(self, file_path: str, content: str) -> p.WriteResult:
        return await self._async().call(_ops.write(self._id, file_path, content))

    async def aedit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> p.EditResult:
        return await self._async().call(_ops.edit(self._id, file_path, old_string, new_string, replace_all))

    async def adelete(self, file_path: str) -> p.DeleteResult:
        return await self._async().call(_ops.delete_file(self._id, file_path))

    async def agrep(
        self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None
    ) -> p.GrepResult:
        return await self._async().call(_ops.grep(self._id, pattern, path, glob, max_count))

    async def aglob(self, pattern: str, path: str | None = None) -> p.GlobResult:
        return await self._async().call(_ops.glob(self._id, pattern, path))

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[p.FileUploadResponse]:
        plan = plan_uploads(files, self.config)
        try:
            step = next(plan)
            while True:
                step = plan.send(await self._aupload_step(step))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def _aupload_step(self, step: Step) -> Outcome:
        if isinstance(step, Inline):
            return await self._async().call(_ops.upload(self._id, step.files))
        try:
            await self.aupload_archive(step.directory, tar_of_one(step.name, step.data))
        except (OperationFailed, ConnectionLost) as exc:
            return tar_failure(step, exc)
        return None, None

    async def adownload_files(self, paths: list[str]) -> list[p.FileDownloadResponse]:
        if not paths:
            return []
        found = await self._async().call(_ops.download(self._id, paths))
        bound = Bound.of_batch(self.config, len(paths))
        return [await self._astreamed(item.path, bound) if item.error == p.FILE_TOO_LARGE else item for item in found]

    async def _astreamed(self, path: str, bound: Bound) -> p.FileDownloadResponse:
        """As `_streamed`: the tar's bytes gathered (bounded as they arrive), then read."""
        gathered = bytearray()
        stream = cast("AsyncGenerator[bytes]", self.adownload_archive(path))
        try:
            async for chunk in stream:
                gathered += chunk
                if len(gathered) > bound.share + TAR_OVERHEAD:
                    return bound.answer(path, p.FILE_TOO_LARGE)
        except (OperationFailed, ConnectionLost) as exc:
            return bound.failed(path, exc)
        finally:
            await stream.aclose()
        return bound.answer(path, file_from_tar([bytes(gathered)], bound.share))
