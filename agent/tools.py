"""The filesystem and execute tools, over any `BackendProtocol`, and the middleware that adds them.

Each tool makes one protocol call on the call's `Workspace` and renders the result as text for
the model. Failures are the protocol's: ``Error (file_not_found): File '/x' not found``; a
backend that raises (unreachable, closed) becomes ``Error (unavailable): ...``; no traceback
ever reaches the model. A tool that changed ``/scratch/`` returns the ``files`` update with
its message.

`FilesystemMiddleware` also keeps tool results small: a result longer than
``large_result_chars`` is written into the workspace under ``/large_tool_results/<call id>``
and the model gets its head and tail and the path to page through it with ``read_file``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain.tools import ToolRuntime
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from agent._system import SectionAppender
from agent.lifecycle import SandboxAgentState
from agent.workspace import Layout, Workspace, WorkspaceSource
from sandboxes import protocol as p

__all__ = ["FilesystemMiddleware", "filesystem_tools", "render_error"]

logger = logging.getLogger(__name__)

FILESYSTEM_PROMPT = """## Files and commands

You work in a sandbox. Paths are absolute. Tools: `ls`, `read_file` (pages of lines: use
`offset` and `limit`), `write_file`, `edit_file` (exact string replacement), `delete` (a file,
or a directory and everything in it), `glob`, `grep` (literal text){execute}.
{routes}"""

EXECUTE_PROMPT = ", and `execute` to run shell commands in the sandbox"

DEFAULT_LARGE_RESULT_CHARS = 80_000
PREVIEW_CHARS = 2_000
MAX_TIMEOUT = 3600.0
"""The longest timeout the model may ask ``execute`` for, in seconds."""
LINE_CHARS = 5_000
"""Lines longer than this are cut in ``read_file`` output (the page stays bounded)."""
READ_CHARS = 40_000
"""At most this much of a file's text makes one ``read_file`` page; the rest is read on."""


def render_error(code: str | None, message: str | None) -> str:
    return f"Error ({code or p.BACKEND_ERROR}): {message or 'the operation failed'}"


def _failed(result: Any) -> str | None:
    return render_error(result.error, result.message) if result.error else None


def _ls(ws: Workspace, path: str) -> str:
    path = ws.resolve(path)
    result = ws.backend.ls(path)
    if (error := _failed(result)) is not None:
        return error
    entries = result.entries or []
    if not entries:
        return f"{path} is empty"
    return "\n".join(e.path if e.is_dir else f"{e.path}  ({e.size} bytes)" for e in entries)


def _read(ws: Workspace, file_path: str, offset: int, limit: int) -> str:
    file_path = ws.resolve(file_path)
    result = ws.backend.read(file_path, offset, limit)
    if (error := _failed(result)) is not None:
        return error
    data = result.file_data
    if data is None or result.no_lines_requested:
        return f"{file_path}: no lines requested"
    if data.encoding == "base64":
        return f"{file_path} is binary; its content in base64:\n{data.content}"
    first = result.start_line or offset + 1
    numbered, whole = _numbered(data.content, first, limit)
    if not numbered:
        return f"{file_path} is empty"
    last = first + len(numbered) - 1
    of = f" of {result.total_lines}" if result.total_lines is not None else ""
    if not whole:  # cut here, whatever the backend said
        numbered.append(f"[lines {first}-{last}{of}; read on with offset={last}]")
    elif result.next_offset is not None:
        numbered.append(f"[lines {first}-{result.end_line}{of}; read on with offset={result.next_offset}]")
    return "\n".join(numbered)


def _numbered(text: str, first: int, limit: int) -> tuple[list[str], bool]:
    """At most ``limit`` numbered lines of ``text``, about `READ_CHARS` in all, and whether that
    is all of it: a page stays bounded whatever the backend answered (a window of blank lines
    could come back whole)."""
    source = text[:READ_CHARS]
    lines = source.splitlines()
    whole = len(source) == len(text)
    if not whole and len(lines) > 1:
        lines.pop()  # may be cut short
    if len(lines) > max(limit, 0):
        lines, whole = lines[: max(limit, 0)], False
    numbered: list[str] = []
    size = 0
    for n, line in enumerate(lines, first):
        row = f"{n:6}\t{line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + ' [line cut]'}"
        size += len(row) + 1
        if numbered and size > READ_CHARS:
            return numbered, False
        numbered.append(row)
    return numbered, whole


def _write(ws: Workspace, file_path: str, content: str) -> str:
    result = ws.backend.write(ws.resolve(file_path), content)
    return _failed(result) or f"Wrote {len(content)} characters to {result.path}"


def _edit(ws: Workspace, file_path: str, old_string: str, new_string: str, replace_all: bool) -> str:
    result = ws.backend.edit(ws.resolve(file_path), old_string, new_string, replace_all)
    return _failed(result) or f"Replaced {result.occurrences} occurrence(s) in {result.path}"


def _delete(ws: Workspace, file_path: str) -> str:
    result = ws.backend.delete(ws.resolve(file_path))
    return _failed(result) or f"Deleted {result.path}"


def _glob(ws: Workspace, pattern: str, path: str | None) -> str:
    path = ws.resolve(path)
    result = ws.backend.glob(pattern, path)
    if (error := _failed(result)) is not None:
        return error
    paths = [m.path for m in result.matches or []]
    text = "\n".join(paths) if paths else f"No files match {pattern!r} under {path}"
    return text + ("\n[more matches not shown]" if result.truncated else "")


def _grep(ws: Workspace, pattern: str, path: str | None, glob: str | None) -> str:
    result = ws.backend.grep(pattern, ws.resolve(path), glob)
    if (error := _failed(result)) is not None:
        return error
    lines = [f"{m.path}:{m.line}: {m.text}" for m in result.matches or []]
    text = "\n".join(lines) if lines else f"No matches for {pattern!r}"
    return text + ("\n[more matches not shown]" if result.truncated else "")


def _execute(ws: Workspace, command: str, timeout: float | None) -> str:
    if ws.sandbox is None:
        return render_error(p.INVALID_ARGUMENT, "this workspace cannot run commands")
    if timeout is not None and not 0 < timeout <= MAX_TIMEOUT:
        # 0 would mean no timeout at all for the backend: never the model's choice.
        return render_error(p.INVALID_ARGUMENT, f"timeout must be more than 0 and at most {MAX_TIMEOUT:g} seconds")
    response = ws.sandbox.execute(command, timeout=timeout, cwd=ws.workdir)
    parts = [response.output.rstrip("\n")] if response.output else []
    if response.truncated:
        parts.append("[output truncated: head and tail kept]")
    if response.error:
        parts.append(render_error(response.error, response.message))
    else:
        parts.append(f"[exit code {response.exit_code}]")
    return "\n".join(parts)


def _tool_call_id(runtime: ToolRuntime) -> str:
    return runtime.tool_call_id or ""


def filesystem_tools(source: WorkspaceSource, *, with_execute: bool = True) -> list[BaseTool]:
    """``ls``, ``read_file``, ``write_file``, ``edit_file``, ``delete``, ``glob``, ``grep`` and
    ``execute``, named and ordered as deepagents' tools."""

    def ls(runtime: ToolRuntime, path: str | None = None) -> str | Command[Any]:
        """List a directory (not recursive; default: the working directory). Directories end with '/'."""
        return run_ls(runtime, path=path)

    def read_file(runtime: ToolRuntime, file_path: str, offset: int = 0, limit: int = 2000) -> str | Command[Any]:
        """Read a file as numbered lines, `limit` lines from 0-based line `offset`."""
        return run_read(runtime, file_path=file_path, offset=offset, limit=limit)

    def write_file(runtime: ToolRuntime, file_path: str, content: str) -> str | Command[Any]:
        """Write a file, creating parent directories and replacing any existing file."""
        return run_write(runtime, file_path=file_path, content=content)

    def edit_file(
        runtime: ToolRuntime, file_path: str, old_string: str, new_string: str, replace_all: bool = False
    ) -> str | Command[Any]:
        """Replace the exact text `old_string` by `new_string`; it must be unique unless `replace_all`."""
        return run_edit(
            runtime, file_path=file_path, old_string=old_string, new_string=new_string, replace_all=replace_all
        )

    def delete(runtime: ToolRuntime, file_path: str) -> str | Command[Any]:
        """Delete a file, or a directory and everything in it, recursively. It cannot be undone."""
        return run_delete(runtime, file_path=file_path)

    def glob(runtime: ToolRuntime, pattern: str, path: str | None = None) -> str | Command[Any]:
        """Find files by glob pattern (`**/*.py`); a pattern without '/' matches names at any depth."""
        return run_glob(runtime, pattern=pattern, path=path)

    def grep(
        runtime: ToolRuntime, pattern: str, path: str | None = None, glob: str | None = None
    ) -> str | Command[Any]:
        """Search files under `path` (default: the working directory) for a literal string.

        `glob` filters file names. Answers path:line: text."""
        return run_grep(runtime, pattern=pattern, path=path, glob=glob)

    def execute(runtime: ToolRuntime, command: str, timeout: float | None = None) -> str | Command[Any]:
        """Run a shell command in the sandbox's working directory; answers its output and exit code."""
        return run_execute(runtime, command=command, timeout=timeout)

    run_ls = _runner("ls", source, _ls)
    run_read = _runner("read_file", source, _read)
    run_write = _runner("write_file", source, _write)
    run_edit = _runner("edit_file", source, _edit)
    run_delete = _runner("delete", source, _delete)
    run_glob = _runner("glob", source, _glob)
    run_grep = _runner("grep", source, _grep)
    run_execute = _runner("execute", source, _execute)
    functions: list[Callable[..., Any]] = [ls, read_file, write_file, edit_file, delete, glob, grep]
    if with_execute:
        functions.append(execute)
    return [StructuredTool.from_function(f) for f in functions]


def _runner(name: str, source: WorkspaceSource, body: Callable[..., str]) -> Callable[..., str | Command[Any]]:
    def run(runtime: ToolRuntime, **kwargs: Any) -> str | Command[Any]:
        try:
            ws = source(runtime.state, runtime.store)
            text = body(ws, **kwargs)
        except Exception as exc:
            logger.warning("tool %s failed", name, exc_info=True)
            return render_error(p.UNAVAILABLE, f"{type(exc).__name__}: {exc}")
        update = ws.updates()
        if not update:
            return text
        message = ToolMessage(text, tool_call_id=_tool_call_id(runtime), name=name)
        return Command(update={**update, "messages": [message]})

    return run


def _preview(text: str, path: str) -> str:
    head, tail = text[:PREVIEW_CHARS], text[-PREVIEW_CHARS:]
    return (
        f"[This result was {len(text)} characters, too long to show. It is saved in full at {path}: "
        f"read it with read_file(file_path={path!r}, offset=..., limit=...) or search it with grep.]\n"
        f"--- head ---\n{head}\n--- tail ---\n{tail}"
    )


class FilesystemMiddleware(AgentMiddleware[SandboxAgentState, Any]):
    """Adds the tools, says how to use them in the system prompt, and evicts large results."""

    state_schema = SandboxAgentState
    priority = 50

    def __init__(
        self,
        source: WorkspaceSource,
        *,
        layout: Layout | None = None,
        execute: bool = True,
        large_result_chars: int | None = DEFAULT_LARGE_RESULT_CHARS,
        unevicted: frozenset[str] = frozenset({"read_file"}),
    ) -> None:
        super().__init__()
        self.source = source
        self.layout = layout or Layout()
        self.large_result_chars = large_result_chars
        self.unevicted = unevicted
        self.tools = filesystem_tools(source, with_execute=execute)
        self.prompt = FILESYSTEM_PROMPT.format(execute=EXECUTE_PROMPT if execute else "", routes=self._routes())
        self._append = SectionAppender()
        self._sandbox_prompt: tuple[str, str] | None = None
        """The last sandbox id and its prompt (the workdir of an id never changes)."""

    def _routes(self) -> str:
        lines = []
        if self.layout.memories:
            lines.append(f"Files under {self.layout.memories} are kept across conversations.")
        if self.layout.scratch:
            lines.append(f"Files under {self.layout.scratch} last as long as this conversation.")
        if self.layout.memories or self.layout.scratch:
            lines.append("Commands do not see those two directories.")
        return "\n".join(lines)

    # ------------------------------------------------------------------ prompt

    def _prompt_for(self, state: Mapping[str, Any]) -> str:
        sandbox_id = state.get("sandbox_id")
        if not sandbox_id:
            return self.prompt
        last = self._sandbox_prompt
        if last is not None and last[0] == sandbox_id:
            return last[1]
        workdir = self.source(state, None).workdir
        prompt = f"{self.prompt}\nYour working directory is {workdir}; relative paths are relative to it."
        self._sandbox_prompt = (sandbox_id, prompt)
        return prompt

    def _with_prompt(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        return request.override(system_message=self._append(request.system_message, self._prompt_for(request.state)))

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> ModelResponse[Any]:
        return handler(self._with_prompt(request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        return await handler(self._with_prompt(request))

    # ------------------------------------------------------------------ eviction

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]]
    ) -> ToolMessage | Command[Any]:
        return self._evict(request, handler(request))

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        result = await handler(request)
        return await asyncio.to_thread(self._evict, request, result)

    def _evict(self, request: ToolCallRequest, result: ToolMessage | Command[Any]) -> ToolMessage | Command[Any]:
        limit = self.large_result_chars
        if limit is None:
            return result
        if isinstance(result, Command):
            return _cut_command(result, limit)
        text = _text_of(result)
        if text is None or len(text) <= max(limit, 4 * PREVIEW_CHARS):  # a preview would not be shorter
            return result
        if self.layout.large_results is None or request.tool_call["name"] in self.unevicted:
            return _cut(result, text, limit, "read smaller pages")
        path = f"{self.layout.large_results.rstrip('/')}/{_safe_name(result.tool_call_id)}"
        try:
            ws = self.source(request.state, request.runtime.store)
            error = _failed(ws.backend.write(path, text))
        except Exception as exc:
            error = render_error(p.UNAVAILABLE, str(exc))
        if error is not None:
            return _cut(result, text, limit, f"it could not be saved: {error}")
        message = result.model_copy(update={"content": _preview(text, path)})
        return Command(update={**ws.updates(), "messages": [message]})


def _text_of(message: Any) -> str | None:
    """A tool message's text, if it is one; content blocks count whole."""
    if not isinstance(message, ToolMessage):
        return None
    return message.content if isinstance(message.content, str) else str(message.content)


def _cut(message: ToolMessage, text: str, limit: int, why: str) -> ToolMessage:
    """``message`` with its text cut to a head and a tail: at most ``limit`` characters in all."""
    note = f"[Result of {len(text)} characters cut to its head and tail; {why}]\n"
    keep = max((limit - len(note) - 5) // 2, 0)
    return message.model_copy(update={"content": note + text[:keep] + "\n...\n" + text[len(text) - keep :]})


def _cut_command(command: Command[Any], limit: int) -> Command[Any]:
    """``command`` with every tool message of its update over ``limit`` cut (not saved)."""
    update = command.update
    messages = update.get("messages") if isinstance(update, dict) else None
    if not isinstance(update, dict) or not isinstance(messages, list):
        return command
    bounded = []
    for message in messages:
        text = _text_of(message)
        too_long = text is not None and len(text) > limit
        bounded.append(_cut(message, text, limit, "ask for less") if too_long and text is not None else message)
    return dataclasses.replace(command, update={**update, "messages": bounded})


def _safe_name(tool_call_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in tool_call_id) or "result"
