"""`build_server`: the MCP server of the sandboxes, with its tools: the lifecycle
(``create_sandbox``, ``list_sandboxes``, ``use_sandbox``, ``destroy_sandbox``), commands
(``execute``; ``start_process``, ``poll_process``, ``kill_process`` in the background) and files
(``read_file``, ``write_file``, ``edit_file``, ``ls``, ``glob``, ``grep``, ``upload_file``).

Each tool is one or two calls of the public API through `sandboxes.client`, as the caller's
tenant; its parameters are typed and described for the model, and it answers text.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any

from mcp.server.fastmcp import FastMCP
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import CallToolResult
from pydantic import Field

from sandboxes import protocol as p
from sandboxes.mcp import _format as fmt
from sandboxes.mcp._access import Access, Ctx
from sandboxes.mcp._server import (
    INLINE_OUTPUT_CHARS,
    INSTRUCTIONS,
    Cwd,
    Env,
    FilePath,
    Refused,
    SandboxId,
    Server,
    Timeout,
    Tools,
    _checked,
    _ok,
    add,
    resource_uri,
)

__all__ = ["build_server"]

ProcessId = Annotated[str, Field(description="The id start_process answered.")]


def build_server(access: Access, *, inline_output_chars: int = INLINE_OUTPUT_CHARS, **options: Any) -> FastMCP[Any]:
    """The MCP server of the sandboxes reached through ``access``; an output longer than
    ``inline_output_chars`` is answered as its head and tail. ``options`` go to FastMCP."""
    tools = Tools(access, inline_output_chars)
    # Over HTTP every request carries a tenant's key, which a page that rebinds a host name has not.
    options.setdefault("transport_security", TransportSecuritySettings(enable_dns_rebinding_protection=False))
    server = Server(tools, name="sandboxes", instructions=INSTRUCTIONS, log_level="WARNING", **options)
    _lifecycle(server, tools)
    _commands(server, tools)
    _files(server, tools)
    _transfers(server, tools)
    return server


def _lifecycle(server: FastMCP[Any], tools: Tools) -> None:
    async def create_sandbox(
        ctx: Ctx,
        template: Annotated[str, Field(description="The service's template to make it from.")] = "default",
        ttl: Annotated[
            float | None, Field(gt=0, description="Seconds it lives; leave out for the template's default.")
        ] = None,
        bind: Annotated[bool, Field(description="Make it this session's sandbox (later calls need no id).")] = True,
    ) -> CallToolResult:
        """Create a new sandbox: an isolated machine to run commands and keep files in. Answers its id."""
        sandbox = await tools.access.client(ctx).create(template, ttl=ttl)
        if bind:
            tools.bindings.bind(ctx, sandbox.id)
        assert sandbox.info is not None
        note = " (now this session's sandbox)" if bind else ""
        return _ok(f"created {fmt.sandbox_text(sandbox.info)}{note}")

    async def list_sandboxes(ctx: Ctx) -> CallToolResult:
        """List your sandboxes, one a line; this session's sandbox is marked with *."""
        found = await tools.access.client(ctx).list()
        bound = tools.bindings.get(ctx) or tools.access.default_sandbox(ctx)
        lines = [("* " if info.id == bound else "  ") + fmt.sandbox_text(info) for info in found]
        return _ok("\n".join(lines) if lines else "no sandboxes: create one with create_sandbox")

    async def use_sandbox(
        ctx: Ctx, sandbox_id: Annotated[str, Field(description="The sandbox later calls act on.")]
    ) -> CallToolResult:
        """Make an existing sandbox this session's sandbox, so later calls need no sandbox_id."""
        info = await tools.access.client(ctx).get(sandbox_id)
        tools.bindings.bind(ctx, info.id)
        return _ok(f"using {fmt.sandbox_text(info)}")

    async def destroy_sandbox(ctx: Ctx, sandbox_id: SandboxId = None) -> CallToolResult:
        """Destroy a sandbox and everything in it."""
        target = tools.sandbox_id(ctx, sandbox_id)
        await tools.access.client(ctx).get(target)  # a wrong id says not_found, not a silent success
        await tools.access.client(ctx).delete(target)
        tools.bindings.forget(ctx, target)
        return _ok(f"destroyed {target}")

    for fn in (create_sandbox, use_sandbox, destroy_sandbox):
        add(server, fn)
    add(server, list_sandboxes, read_only=True)


def _commands(server: FastMCP[Any], tools: Tools) -> None:
    async def execute(
        ctx: Ctx,
        command: Annotated[str, Field(description="A shell command line (sh -c), e.g. 'ls -la && python3 app.py'.")],
        timeout: Timeout = None,  # noqa: ASYNC109 - the command's, enforced by the service
        cwd: Cwd = None,
        env: Env = None,
        sandbox_id: SandboxId = None,
    ) -> CallToolResult:
        """Run a shell command in the sandbox and wait for it; answers its output (stdout and
        stderr interleaved) and exit code. A long output is shown as its head and tail, and kept
        whole in a file of the sandbox whose path the answer names."""
        sandbox = tools.sandbox(ctx, sandbox_id)
        result = await sandbox.aexecute(command, timeout=timeout, cwd=cwd, env=env)
        text = await tools.output_text(sandbox, result)
        if result.exit_code is None and result.error is not None:
            raise Refused(result.error, f"{result.message or 'the command did not finish'}\n{text}")
        return _ok(text)

    async def start_process(
        ctx: Ctx,
        command: Annotated[str, Field(description="A shell command line to run in the background (a server...).")],
        timeout: Timeout = None,  # noqa: ASYNC109 - the command's, enforced by the service
        cwd: Cwd = None,
        env: Env = None,
        sandbox_id: SandboxId = None,
    ) -> CallToolResult:
        """Start a command in the background and return at once with its process id; follow it
        with poll_process, stop it with kill_process."""
        status = await tools.sandbox(ctx, sandbox_id).astart_process(command, timeout=timeout, cwd=cwd, env=env)
        return _ok(tools.process_text(status))

    async def poll_process(ctx: Ctx, process_id: ProcessId, sandbox_id: SandboxId = None) -> CallToolResult:
        """A background process's state (running, exited, killed, timeout), exit code and output so far."""
        return _ok(tools.process_text(await tools.sandbox(ctx, sandbox_id).apoll_process(process_id)))

    async def kill_process(ctx: Ctx, process_id: ProcessId, sandbox_id: SandboxId = None) -> CallToolResult:
        """Kill a background process and everything it started; answers its final state."""
        return _ok(tools.process_text(await tools.sandbox(ctx, sandbox_id).akill_process(process_id)))

    async def preview_url(
        ctx: Ctx,
        port: Annotated[int, Field(ge=1, le=65535, description="The port a server listens on in the sandbox.")],
        ttl: Annotated[float, Field(ge=1, le=604800, description="Seconds the link works (a week at most).")] = 3600,
        sandbox_id: SandboxId = None,
    ) -> CallToolResult:
        """A link to a server running in the sandbox (a web app started with start_process),
        for a browser or a person: it opens that port's pages until it expires. The sandbox has
        no network: the service relays the link's requests to the port."""
        sandbox = tools.sandbox(ctx, sandbox_id)
        token = await sandbox.apreview_url(port, ttl)
        base = tools.access.client(ctx).config.base_url().rstrip("/")
        return _ok(f"{base}{token.url} (port {port} of sandbox {sandbox.id}, for {ttl:g} s)")

    for fn in (execute, start_process, kill_process, preview_url):
        add(server, fn)
    add(server, poll_process, read_only=True)


def _files(server: FastMCP[Any], tools: Tools) -> None:
    async def read_file(
        ctx: Ctx,
        file_path: FilePath,
        offset: Annotated[int, Field(ge=0, description="0-based line to start at.")] = 0,
        limit: Annotated[int, Field(ge=1, le=2000, description="Most lines to read.")] = 2000,
        sandbox_id: SandboxId = None,
    ) -> CallToolResult:
        """Read a text file with line numbers, a page at a time (offset, limit); the answer says
        the offset of the next page when there is more."""
        sandbox = tools.sandbox(ctx, sandbox_id)
        path = await tools.path(sandbox, file_path)
        result = _checked(await sandbox.aread(path, offset, limit))
        return _ok(fmt.read_text(path, result, resource_uri(sandbox.id, path)))

    async def write_file(
        ctx: Ctx,
        file_path: FilePath,
        content: Annotated[str, Field(description="The file's whole new text.")],
        sandbox_id: SandboxId = None,
    ) -> CallToolResult:
        """Create a text file, or replace one, with content (parent directories are made)."""
        sandbox = tools.sandbox(ctx, sandbox_id)
        path = await tools.path(sandbox, file_path)
        _checked(await sandbox.awrite(path, content))
        return _ok(f"wrote {len(content)} characters to {path}")

    async def edit_file(
        ctx: Ctx,
        file_path: FilePath,
        old_string: Annotated[
            str, Field(description="Text to replace, exactly as in the file (unique unless replace_all).")
        ],
        new_string: Annotated[str, Field(description="The text to put in its place.")],
        replace_all: Annotated[bool, Field(description="Replace every occurrence, not only a unique one.")] = False,
        sandbox_id: SandboxId = None,
    ) -> CallToolResult:
        """Replace old_string by new_string in a text file."""
        sandbox = tools.sandbox(ctx, sandbox_id)
        path = await tools.path(sandbox, file_path)
        result = _checked(await sandbox.aedit(path, old_string, new_string, replace_all))
        return _ok(f"replaced {result.occurrences} occurrence(s) in {path}")

    async def ls(
        ctx: Ctx,
        path: Annotated[str | None, Field(description="Directory to list; leave out for the workdir.")] = None,
        sandbox_id: SandboxId = None,
    ) -> CallToolResult:
        """List a directory: one entry a line, directories ending with /."""
        sandbox = tools.sandbox(ctx, sandbox_id)
        result = _checked(await sandbox.als(await tools.path(sandbox, path)))
        return _ok(fmt.listing_text(result.entries or []))

    async def glob(
        ctx: Ctx,
        pattern: Annotated[str, Field(description="A glob such as '**/*.py'.")],
        path: Annotated[str | None, Field(description="Directory to search; leave out for the workdir.")] = None,
        sandbox_id: SandboxId = None,
    ) -> CallToolResult:
        """Find files whose path matches a glob pattern."""
        sandbox = tools.sandbox(ctx, sandbox_id)
        result = _checked(await sandbox.aglob(pattern, await tools.path(sandbox, path)))
        return _ok(fmt.listing_text(result.matches or [], result.truncated))

    async def grep(
        ctx: Ctx,
        pattern: Annotated[str, Field(description="A literal string to search for (not a regular expression).")],
        path: Annotated[str | None, Field(description="File or directory; leave out for the workdir.")] = None,
        glob: Annotated[str | None, Field(description="Only files matching this glob, e.g. '*.py'.")] = None,
        max_count: Annotated[int | None, Field(ge=1, description="Stop after this many matches.")] = None,
        sandbox_id: SandboxId = None,
    ) -> CallToolResult:
        """Search files for a literal string; answers path:line:text, one match a line."""
        sandbox = tools.sandbox(ctx, sandbox_id)
        result = _checked(await sandbox.agrep(pattern, await tools.path(sandbox, path), glob, max_count=max_count))
        return _ok(fmt.grep_text(result.matches or [], result.truncated))

    add(server, write_file)
    add(server, edit_file)
    for reader in (read_file, ls, glob, grep):
        add(server, reader, read_only=True)


def _transfers(server: FastMCP[Any], tools: Tools) -> None:
    async def upload_file(
        ctx: Ctx,
        file_path: FilePath,
        content_base64: Annotated[str, Field(description="The file's bytes, base64-encoded.")],
        sandbox_id: SandboxId = None,
    ) -> CallToolResult:
        """Put a file of any bytes (binary too) in the sandbox; answers the resource to read it back."""
        try:
            data = base64.b64decode(content_base64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise Refused(p.INVALID_ARGUMENT, f"content_base64 is not base64: {exc}") from exc
        sandbox = tools.sandbox(ctx, sandbox_id)
        path = await tools.path(sandbox, file_path)
        [done] = await sandbox.aupload_files([(path, data)])
        _checked(done)
        return _ok(f"uploaded {len(data)} bytes to {path}; resource {resource_uri(sandbox.id, path)}")

    add(server, upload_file)
