"""An MCP server that misbehaves on request, for the tool env's fault tests.

    python tests/fakes/fault_server.py [--banner]

Tools: `sleep` (async), `block` (a sync tool that holds its worker thread), `serial` (serves
one call at a time, like a tool holding one browser or a database lock), `hang` (never returns), `pid`, `inflight` (calls now running), `noisy` (writes garbage to stdout, then
answers), `leak` (fails with the value of an environment variable in its message), `reveal`
(returns it, successfully, and writes it to stderr), `reveal_split` (writes it to stderr at the end of a
long line, in two writes split inside it), `big` (returns a text of `mib` MiB).
`--banner` prints a non-JSON line to stdout before the MCP handshake, as careless servers do;
`--transport streamable-http|sse --port N` serves over HTTP instead of stdio.
"""
import argparse
import asyncio
import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("faulty", log_level="WARNING")
running = 0
# The SDK diverts fd 1 to stderr while it serves (so stray prints cannot corrupt the channel);
# servers in other languages or older SDKs have no such guard. Keep a handle on the real pipe.
WIRE = os.dup(sys.stdout.fileno())

# Everything a confused process might put on a JSON-RPC stdout: prose, JSON that is not JSON-RPC,
# bytes that are not UTF-8, an answer to a request nobody made, a cut-off message, blank lines.
GARBAGE = (b"Loading model weights... done\n", b'{"hello": "world"}\n', b"\xff\xfe\x80 not utf-8\n",
           b'{"jsonrpc": "2.0", "id": 987654, "result": {}}\n', b'{"jsonrpc": "2.0", "id": \n', b"\n\n")


@server.tool()
async def sleep(seconds: float) -> str:
    """Sleep for `seconds` without blocking the server."""
    global running
    running += 1
    try:
        await asyncio.sleep(seconds)
    finally:
        running -= 1
    return f"slept {seconds}"


@server.tool()
def block(seconds: float) -> str:
    """Hold a worker thread for `seconds` (a tool stuck in blocking I/O)."""
    time.sleep(seconds)
    return f"blocked {seconds}"


SERIAL = asyncio.Lock()


@server.tool()
async def serial(seconds: float) -> str:
    """Sleep for `seconds` while holding the server's one lock (calls queue, first come first served)."""
    async with SERIAL:
        await asyncio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
async def hang() -> str:
    """Never return."""
    await asyncio.Event().wait()
    return "unreachable"


@server.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@server.tool()
def inflight() -> int:
    """How many `sleep` calls are running now."""
    return running


@server.tool()
def noisy(text: str) -> str:
    """Write garbage straight to stdout (the JSON-RPC channel), then answer `text`."""
    for chunk in GARBAGE:
        os.write(WIRE, chunk)
    return text


@server.tool()
def leak(name: str) -> str:
    """Fail with the value of environment variable `name` in the message."""
    raise ToolError(f"authentication failed for key {os.environ.get(name, '')}")


@server.tool()
def reveal(name: str) -> str:
    """Return the value of environment variable `name` (and write it to stderr)."""
    print(f"debug: {name}={os.environ.get(name, '')}", file=sys.stderr, flush=True)
    return f"the key is {os.environ.get(name, '')}"


@server.tool()
def reveal_split(name: str, pad: int) -> str:
    """Write `pad` bytes and then the value of environment variable `name` to stderr as one line, in two
    writes split inside the value (a long line's reader may cut it there)."""
    value = os.environ.get(name, "")
    sys.stderr.write("x" * pad + value[:4])
    sys.stderr.flush()
    time.sleep(0.5)
    sys.stderr.write(value[4:] + "\n")
    sys.stderr.flush()
    return "written"


@server.tool()
def big(mib: float) -> str:
    """A text of `mib` MiB."""
    return "x" * int(mib * (1 << 20))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--banner", action="store_true")
    parser.add_argument("--transport", default="stdio")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    if args.banner:
        os.write(WIRE, b"fault_server v0 starting (not JSON)\n")
    if args.transport == "stdio":
        server.run()
    else:
        server.run(args.transport, host="127.0.0.1", port=args.port)
