"""The sandboxes as an MCP server, for any agent that takes tools from one (desktop assistants,
IDE agents, LangChain's MCP adapters): ``sandboxes mcp`` on stdio (`run_stdio`), and the
service's own ``/mcp`` over streamable HTTP (`sandboxes.mcp.mount`). Built on the public API
through `sandboxes.client` only, with the official ``mcp`` SDK (the ``mcp`` extra).
"""

from sandboxes.mcp._access import Access, FixedAccess
from sandboxes.mcp._http import SANDBOX_HEADER, mount
from sandboxes.mcp._server import INLINE_OUTPUT_CHARS, OUTPUTS_DIR, RESOURCE_TEMPLATE, resource_uri
from sandboxes.mcp._stdio import run_stdio
from sandboxes.mcp._tools import build_server

__all__ = [
    "INLINE_OUTPUT_CHARS",
    "OUTPUTS_DIR",
    "RESOURCE_TEMPLATE",
    "SANDBOX_HEADER",
    "Access",
    "FixedAccess",
    "build_server",
    "mount",
    "resource_uri",
    "run_stdio",
]
