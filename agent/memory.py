"""Memory (``AGENTS.md``) and skills (``SKILL.md``), read from the workspace into the system prompt.

Both are read once per run (``before_agent``), from the thread's workspace, so a file the agent
edited during one run is what the next run sees; both are added to every model call's system
message with `append_to_system_message`.

Skills use progressive disclosure: only each skill's name and description (from the YAML front
matter of ``<dir>/<skill>/SKILL.md``) go into the prompt, with the path; the model reads the
body with ``read_file`` when the skill applies.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NotRequired, TypedDict

import yaml
from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langgraph.runtime import Runtime

from agent._system import SectionAppender
from agent.lifecycle import SandboxAgentState
from agent.workspace import WorkspaceSource
from sandboxes import protocol as p

__all__ = ["MemoryMiddleware", "SkillMetadata", "SkillsMiddleware", "parse_skill"]

logger = logging.getLogger(__name__)

MAX_MEMORY_BYTES = 200_000
MAX_SKILL_BYTES = 1_000_000

MEMORY_GUIDELINES = """<memory_guidelines>
The <agent_memory> above was loaded from the files named in it. Follow it. When you learn
something that should outlast this conversation (a preference, a convention, a fact about the
project), update the relevant file with edit_file, and do not store secrets there.
</memory_guidelines>"""

SKILLS_PROMPT = """## Skills

Skills are instructions for particular kinds of tasks. When one applies, read its file with
read_file before you start and follow it.

{skills}"""


class SkillMetadata(TypedDict):
    name: str
    description: str
    path: str


class MemoryState(SandboxAgentState):
    memory_contents: NotRequired[dict[str, str]]


class SkillsState(SandboxAgentState):
    skills_metadata: NotRequired[list[SkillMetadata]]


def _download_text(backend: p.BackendProtocol, path: str, limit: int) -> str | None:
    [response] = backend.download_files([path])
    if response.error or response.content is None:
        return None
    if len(response.content) > limit:
        logger.warning("%s is over %d bytes; not loaded", path, limit)
        return None
    try:
        return response.content.decode("utf-8")
    except UnicodeDecodeError:
        return None


def parse_skill(text: str, path: str) -> SkillMetadata | None:
    """Name and description from ``SKILL.md``'s YAML front matter; ``None`` if it has none."""
    if not text.startswith("---"):
        return None
    end = text.find("\n---", 3)
    if end < 0:
        return None
    try:
        meta = yaml.safe_load(text[3:end])
    except yaml.YAMLError:
        return None
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return None
    description = meta.get("description")
    return SkillMetadata(name=meta["name"], description=str(description or "").strip(), path=path)


class _PromptSection(AgentMiddleware[Any, Any]):
    """Appends ``self._section(state)`` to every model call's system message."""

    _append: SectionAppender | None = None

    def _section(self, state: Any) -> str | None:
        raise NotImplementedError

    def _with_section(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        section = self._section(request.state)
        if not section:
            return request
        if self._append is None:
            self._append = SectionAppender()
        return request.override(system_message=self._append(request.system_message, section))

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> ModelResponse[Any]:
        return handler(self._with_section(request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        return await handler(self._with_section(request))


class MemoryMiddleware(_PromptSection):
    """The ``AGENTS.md`` files, read at each run, as the system prompt's last section: inside
    every other prompt-adding middleware, so the prompt's stable prefix comes first."""

    state_schema = MemoryState
    priority = 15

    def __init__(self, source: WorkspaceSource, paths: Sequence[str]) -> None:
        super().__init__()
        self.source = source
        self.paths = list(paths)
        self.tools = []

    def before_agent(self, state: MemoryState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        backend = self.source(state, runtime.store).backend
        contents = {}
        for path in self.paths:
            text = _download_text(backend, path, MAX_MEMORY_BYTES)
            if text is not None:
                contents[path] = text
        return {"memory_contents": contents}

    def _section(self, state: Any) -> str | None:
        contents: dict[str, str] = state.get("memory_contents") or {}
        if not contents:
            return None
        body = "\n\n".join(f"{path}\n{text.strip()}" for path, text in contents.items())
        return f"<agent_memory>\n{body}\n</agent_memory>\n\n{MEMORY_GUIDELINES}"


class SkillsMiddleware(_PromptSection):
    state_schema = SkillsState
    priority = 60

    def __init__(self, source: WorkspaceSource, directories: Sequence[str]) -> None:
        super().__init__()
        self.source = source
        self.directories = list(directories)
        self.tools = []

    def _scan(self, backend: p.BackendProtocol, directory: str) -> list[SkillMetadata]:
        listing = backend.ls(directory)
        found = []
        for entry in listing.entries or []:
            if not entry.is_dir:
                continue
            path = entry.path.rstrip("/") + "/SKILL.md"
            text = _download_text(backend, path, MAX_SKILL_BYTES)
            meta = parse_skill(text, path) if text is not None else None
            if meta is not None:
                found.append(meta)
        return found

    def before_agent(self, state: SkillsState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        backend = self.source(state, runtime.store).backend
        skills: dict[str, SkillMetadata] = {}
        for directory in self.directories:  # a later directory overrides a skill of the same name
            skills.update({meta["name"]: meta for meta in self._scan(backend, directory)})
        return {"skills_metadata": list(skills.values())}

    def _section(self, state: Any) -> str | None:
        skills: list[SkillMetadata] = state.get("skills_metadata") or []
        if not skills:
            return None
        lines = [f"- **{s['name']}**: {s['description']}\n  -> read `{s['path']}`" for s in skills]
        return SKILLS_PROMPT.format(skills="\n".join(lines))
