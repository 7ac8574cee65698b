"""A LangGraph deep agent whose every tool runs in a sandbox.

``create_sandbox_agent(model, sandbox="local")`` is langchain's ``create_agent`` with a
sandbox per conversation thread, file and execute tools over the sandboxes protocol,
``/memories/`` and ``/scratch/`` routes, subagents, memory, skills and human approval, as a
middleware stack in one documented order (`agent.graph`).
"""

from agent._system import append_to_system_message
from agent.backends import FileRecord, GraphStateBackend, StoreBackend, merge_files
from agent.graph import create_sandbox_agent, lifecycle_of, middleware_of, order_middleware
from agent.lifecycle import (
    FixedSandbox,
    ProviderAdapter,
    RemoteProvider,
    SandboxAgentState,
    SandboxGone,
    SandboxHook,
    SandboxMiddleware,
    SandboxProvider,
)
from agent.memory import MemoryMiddleware, SkillsMiddleware
from agent.patch import PatchToolCallsMiddleware
from agent.subagents import SubAgent, SubAgentMiddleware
from agent.tools import FilesystemMiddleware, filesystem_tools
from agent.workspace import Layout, Workspace, WorkspaceFactory

__all__ = [
    "FileRecord",
    "FilesystemMiddleware",
    "FixedSandbox",
    "GraphStateBackend",
    "Layout",
    "MemoryMiddleware",
    "PatchToolCallsMiddleware",
    "ProviderAdapter",
    "RemoteProvider",
    "SandboxAgentState",
    "SandboxGone",
    "SandboxHook",
    "SandboxMiddleware",
    "SandboxProvider",
    "SkillsMiddleware",
    "StoreBackend",
    "SubAgent",
    "SubAgentMiddleware",
    "Workspace",
    "WorkspaceFactory",
    "append_to_system_message",
    "create_sandbox_agent",
    "filesystem_tools",
    "lifecycle_of",
    "merge_files",
    "middleware_of",
    "order_middleware",
]
