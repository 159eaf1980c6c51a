"""A tiny MCP server for tool-env tests: slow, crashing and introspective tools.

Run as a script (`python tests/fakes/slow_server.py`); stdio by default,
`--transport streamable-http --port N` for HTTP tests.
"""
import argparse
import asyncio
import os

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

# WARNING: at INFO the SDK renders each failure with rich, slowly enough to trip short timeouts.
server = MCPServer("slow", log_level="WARNING")


@server.tool()
async def sleep(seconds: float) -> str:
    """Sleep for `seconds`, then say so (async: many sleeps overlap)."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def crash(code: int = 3) -> str:
    """Kill this server process at once, as a segfaulting tool would."""
    os._exit(code)


@server.tool()
def pid() -> int:
    """This server's process id, so tests can check it is gone after shutdown."""
    return os.getpid()


@server.tool()
def fail(message: str) -> str:
    """Fail with `message`, so the client sees an `is_error` result."""
    raise ToolError(message)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--transport", default="stdio")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    if args.transport == "stdio":
        server.run()
    else:
        server.run(args.transport, host="127.0.0.1", port=args.port)
