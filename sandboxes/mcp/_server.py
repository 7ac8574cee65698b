"""The MCP server's machinery: `Server`, a FastMCP serving each sandbox's files as resources
``sandbox://{id}/{path}``, `Tools`, the state its tools share, and `add`, which registers one.

Every tool answers text for the model, or a tool error (``isError``) that reads ``error: <code>:
<message>`` with a code of the protocol's vocabulary (`sandboxes.protocol.ErrorCode`) or of the
service's (`sandboxes.api.ServiceErrorCode`): what the service refused, what the sandbox
reported, and arguments that do not validate never reach the client as a traceback.
"""

from __future__ import annotations

import functools
import mimetypes
import posixpath
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Annotated, Any, ParamSpec
from urllib.parse import quote, unquote, urlsplit

from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ResourceError
from mcp.server.lowlevel.helper_types import ReadResourceContents
from mcp.types import CallToolResult, ResourceTemplate, TextContent, ToolAnnotations
from pydantic import AnyUrl, Field

from sandboxes import protocol as p
from sandboxes.client import RemoteSandbox, SandboxServiceError
from sandboxes.mcp import _format as fmt
from sandboxes.mcp._access import Access, Bindings, Ctx

__all__ = [
    "INLINE_OUTPUT_CHARS",
    "INSTRUCTIONS",
    "OUTPUTS_DIR",
    "RESOURCE_TEMPLATE",
    "Refused",
    "SandboxId",
    "Server",
    "Tools",
    "add",
    "resource_uri",
]

INLINE_OUTPUT_CHARS = 20_000
"""The longest command output answered whole; a longer one is answered as its head and tail,
and kept whole in a file in the sandbox (`OUTPUTS_DIR`)."""

OUTPUTS_DIR = ".sandboxes-mcp/outputs"
"""Where, under the sandbox's workdir, the whole output of a long command is kept."""

RESOURCE_TEMPLATE = "sandbox://{sandbox_id}/{path}"
"""A sandbox's file as a resource: ``path`` is its absolute path without the leading ``/``."""

INSTRUCTIONS = """\
Sandboxes are isolated machines to run commands and edit files in. Create one with create_sandbox
(it becomes this session's sandbox: later calls need no sandbox_id), or pick an existing one with
use_sandbox. Paths are absolute, or relative to the sandbox's workdir (the place to work in).
Files can be read as resources sandbox://{sandbox_id}/{absolute path without its leading /}."""

P = ParamSpec("P")

SandboxId = Annotated[
    str | None,
    Field(description="The sandbox to act on; leave out to use this session's sandbox (use_sandbox, create_sandbox)."),
]
FilePath = Annotated[str, Field(description="Absolute path, or relative to the sandbox's workdir.")]
Timeout = Annotated[
    float | None,
    Field(ge=0, description="Seconds before the command is killed; leave out for the service's default."),
]
Cwd = Annotated[str | None, Field(description="Working directory; leave out for the sandbox's workdir.")]
Env = Annotated[dict[str, str] | None, Field(description="Extra environment variables for the command.")]


class Refused(Exception):
    """A tool's refusal: ``code`` of the protocol's or the service's vocabulary, and a sentence."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def _ok(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)])


def _failed(code: str, message: str, detail: str = "") -> CallToolResult:
    text = f"error: {code}: {message}" + (f"\n{detail}" if detail else "")
    return CallToolResult(content=[TextContent(type="text", text=text)], isError=True)


def _answers(fn: Callable[P, Awaitable[CallToolResult]]) -> Callable[P, Awaitable[CallToolResult]]:
    """A tool whose refusals, and the service's, are tool errors in the protocol's vocabulary."""

    @functools.wraps(fn)
    async def tool(*args: P.args, **kwargs: P.kwargs) -> CallToolResult:
        try:
            return await fn(*args, **kwargs)
        except Refused as exc:
            return _failed(exc.code, exc.message)
        except SandboxServiceError as exc:
            return _failed(exc.code, exc.message)

    return tool


def _checked(result: Any) -> Any:
    """A protocol result, or `Refused` with its code and sentence."""
    if result.error is not None:
        raise Refused(result.error, result.message or result.error)
    return result


def resource_uri(sandbox_id: str, path: str) -> str:
    """The resource of the file at absolute ``path`` in ``sandbox_id``."""
    return f"sandbox://{quote(sandbox_id, safe='')}/{quote(path.lstrip('/'), safe='/')}"


def _parse_uri(uri: str) -> tuple[str, str]:
    parts = urlsplit(uri)
    if parts.scheme != "sandbox" or not parts.netloc or parts.path in ("", "/"):
        raise ResourceError(f"{p.INVALID_ARGUMENT}: {uri!r} is not sandbox://{{sandbox_id}}/{{path}}")
    return unquote(parts.netloc), unquote(parts.path)


class Server(FastMCP[Any]):
    """FastMCP with the sandboxes' file resources: a template whose ``path`` spans ``/``."""

    def __init__(self, tools: Tools, **options: Any) -> None:
        super().__init__(**options)
        self._files = tools

    async def list_resource_templates(self) -> list[ResourceTemplate]:
        sandbox_file = ResourceTemplate(
            uriTemplate=RESOURCE_TEMPLATE,
            name="sandbox_file",
            description="A file of a sandbox, downloaded: text as text, anything else as base64 bytes.",
        )
        return [*await super().list_resource_templates(), sandbox_file]

    async def read_resource(self, uri: AnyUrl | str) -> Iterable[ReadResourceContents]:
        if not str(uri).startswith("sandbox:"):
            return await super().read_resource(uri)
        sandbox_id, path = _parse_uri(str(uri))
        return [await self._files.download(self.get_context(), sandbox_id, path)]


class Tools:
    """The tools' shared state: where calls go (`Access`), what each session bound, the bound
    on an output answered whole."""

    def __init__(self, access: Access, inline_output_chars: int) -> None:
        self.access = access
        self.bindings = Bindings()
        self.inline = inline_output_chars

    def sandbox_id(self, ctx: Ctx, given: str | None) -> str:
        found = given or self.bindings.get(ctx) or self.access.default_sandbox(ctx)
        if not found:
            raise Refused(
                p.INVALID_ARGUMENT,
                "no sandbox: pass sandbox_id, or call create_sandbox or use_sandbox first",
            )
        return found

    def sandbox(self, ctx: Ctx, given: str | None) -> RemoteSandbox:
        return self.access.client(ctx).attach(self.sandbox_id(ctx, given))

    async def path(self, sandbox: RemoteSandbox, path: str | None) -> str:
        """``path`` made absolute against the sandbox's workdir (the workdir itself for none)."""
        if path and path.startswith("/"):
            return path
        workdir = (await sandbox.arefresh()).workdir or "/"
        return posixpath.join(workdir, path) if path else workdir

    async def download(self, ctx: Ctx, sandbox_id: str, path: str) -> ReadResourceContents:
        sandbox = self.access.client(ctx).attach(sandbox_id)
        try:
            [found] = await sandbox.adownload_files([path])
        except SandboxServiceError as exc:
            raise ResourceError(f"{exc.code}: {exc.message}") from exc
        if found.error is not None or found.content is None:
            raise ResourceError(f"{found.error}: {found.message or found.error}")
        mime = mimetypes.guess_type(path)[0]
        try:
            return ReadResourceContents(found.content.decode("utf-8"), mime or "text/plain")
        except UnicodeDecodeError:
            return ReadResourceContents(found.content, mime or "application/octet-stream")

    async def keep_output(self, sandbox: RemoteSandbox, output: str) -> str:
        """``output`` kept whole in a new file of the sandbox; its path."""
        workdir = (await sandbox.arefresh()).workdir or "/"
        path = posixpath.join(workdir, OUTPUTS_DIR, f"exec-{uuid.uuid4().hex[:12]}.txt")
        [kept] = await sandbox.aupload_files([(path, output.encode("utf-8", "surrogateescape"))])
        _checked(kept)
        return path

    async def output_text(self, sandbox: RemoteSandbox, result: p.ExecuteResponse) -> str:
        """A command's output whole, or past `inline` its head and tail and the file that keeps it."""
        if result.exit_code is not None:
            status = f"[exit code {result.exit_code}]"
        else:
            status = f"[{result.error}: {result.message or 'the command did not finish'}]"
        cut = "\n[the command printed more than the service keeps: the middle was left out]" if result.truncated else ""
        if len(result.output) <= self.inline:
            shown = result.output.removesuffix("\n") if result.output else "(no output)"
            return f"{shown}{cut}\n{status}"
        try:
            where = f"The whole output is in {await self.keep_output(sandbox, result.output)}: page through it "
            where += "with read_file (offset, limit) or search it with grep."
        except (Refused, SandboxServiceError) as exc:
            where = f"The whole output could not be kept in the sandbox ({exc})."
        shown = fmt.preview(result.output)
        return f"Output too long ({len(result.output)} characters) to show whole. {where}\n\n{shown}{cut}\n{status}"

    def process_text(self, status: Any) -> str:
        text = fmt.process_text(status)
        return text if len(text) <= self.inline else fmt.preview(text)


def add(server: FastMCP[Any], fn: Callable[..., Awaitable[CallToolResult]], *, read_only: bool = False) -> None:
    """Register ``fn`` as a tool named after it, its docstring its description."""
    hints = ToolAnnotations(readOnlyHint=True) if read_only else None
    server.add_tool(_answers(fn), annotations=hints, structured_output=False)
