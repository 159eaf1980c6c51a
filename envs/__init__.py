"""The environment side: MCP tool manifests, server connections, the tool env and call parsers.

    async with ToolEnv.from_manifest("configs/tools/calculator.yaml") as env:   # starts nothing
        tools = await env.list_tools()             # starts the servers, once; OpenAI-shape schemas
        content, calls = get_parser("hermes", tools=tools).parse(model_text)
        results = await env.call_batch(calls)      # one ToolResult per call, never an exception
        async with env.episode(sample) as ep:      # a trajectory's own handle: scope: episode servers,
            results = await ep.call_batch(calls)   # hidden arguments filled from `sample`

Nothing here imports torch or the trainer. Exports resolve lazily (PEP 562) so that
`python -m envs.servers.calculator`, which imports this package first, starts without loading
the client stack.
"""
from importlib import import_module

_EXPORTS = {
    "Episode": "envs.episode",
    "EpisodeError": "envs.episode",
    "ManifestError": "envs.manifest",
    "load_manifest": "envs.manifest",
    "ServerStartError": "envs.mcp_client",
    "ToolEnvError": "envs.mcp_client",
    "get_parser": "envs.parsers",
    "register_parser": "envs.parsers",
    "ToolEnv": "envs.tool_env",
    "ToolLimits": "envs.limits",
    "load_function": "envs.function_tools",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'envs' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return __all__
