"""An MCP server whose one tool takes a fixed, injected time: the load for benchmarks/tool_calls.py.

`wait(seconds)` awaits `asyncio.sleep(seconds)` and returns how long that took, e.g. "0.500713"
(asyncio's timers overshoot by up to ~1 ms; the benchmark reports that apart). It is `async`, so
calls overlap in one event loop: MCPServer runs sync tools in a 40-thread pool, which would cap
a benchmark at 39 calls in flight on stdio. Stdio is served by `envs.servers.stdio.run_stdio`
(no thread hop per message); `--sdk-stdio` uses the SDK's own `server.run()` for comparison.

    python benchmarks/servers/latency_server.py                          # stdio
    python benchmarks/servers/latency_server.py --transport streamable-http --port 8000
"""
import argparse
import asyncio
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from envs.servers.stdio import run_stdio  # noqa: E402

server = MCPServer("latency", log_level="WARNING")


@server.tool()
async def wait(seconds: float) -> str:
    """Wait `seconds`; returns the seconds actually waited."""
    start = time.perf_counter()
    await asyncio.sleep(seconds)
    return f"{time.perf_counter() - start:.6f}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--transport", default="stdio", choices=["stdio", "streamable-http"])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--sdk-stdio", action="store_true", help="serve stdio with server.run()")
    args = parser.parse_args()
    if args.transport == "stdio" and not args.sdk_stdio:
        run_stdio(server)
    elif args.transport == "stdio":
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.port)
