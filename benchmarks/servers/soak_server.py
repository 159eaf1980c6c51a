"""An MCP server that fails on request, for benchmarks/soak.py: `work(kind, ms)`.

Kinds: `ok` (sleeps `ms`, answers), `hang` (never answers), `crash` (the process exits at once, with
every call in flight), `garbage` (writes non-JSON-RPC bytes to the wire, then answers), `big` (answers
8 MiB) and `error` (a tool error).

    python benchmarks/servers/soak_server.py                          # stdio
    python benchmarks/servers/soak_server.py --transport streamable-http --port 8000
"""
import argparse
import asyncio
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from envs.servers.stdio import run_stdio  # noqa: E402

server = MCPServer("soak", log_level="WARNING")
WIRE = os.dup(1)  # the real stdout (run_stdio diverts fd 1 to stderr while serving)
GARBAGE = b'Loading... done\n{"jsonrpc": "2.0", "id": 99999999, "result": {}}\n\xff\xfe not utf-8\n{"jsonrpc":\n'


@server.tool()
async def work(kind: str, ms: int = 0) -> str:
    """Do `kind` of work (see the module docstring)."""
    await asyncio.sleep(ms / 1000)
    if kind == "hang":
        await asyncio.Event().wait()
    if kind == "crash":
        os._exit(1)
    if kind == "garbage":
        os.write(WIRE, GARBAGE)
    if kind == "big":
        return "z" * (8 << 20)
    if kind == "error":
        raise ToolError("the backend said no")
    return f"done {kind} {ms}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--transport", default="stdio", choices=["stdio", "streamable-http", "sse"])
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    if args.transport == "stdio":
        run_stdio(server)
    else:
        server.run(args.transport, host="127.0.0.1", port=args.port)
