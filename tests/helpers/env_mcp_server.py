"""A stdio MCP server (the mcp SDK's MCPServer) with one tool, `show_env`, that answers with the
value of the variable named by its first argument. It lets a test see what environment the provider
gave a configured stdio MCP server."""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("envsrv")
VARIABLE = sys.argv[1]


@server.tool()
def show_env() -> str:
    """Show the configured variable."""
    return f"{VARIABLE}={os.environ.get(VARIABLE, '<unset>')}"


if __name__ == "__main__":
    server.run("stdio")
