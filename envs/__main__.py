"""Tools CLI: inspect and try a manifest's tools without a model.

    python -m envs list MANIFEST [--json]          each tool: server, name, description, schema
                                                   (functions show as [functions])
    python -m envs call MANIFEST TOOL '{"a": 1}'   the result text
    ... --sample '{"db_path": "x.db"}'             a dataset row: `scope: episode` servers are started for it,
                                                   hidden arguments filled from it (call runs in its episode)
    python -m envs new-server NAME [--dir DIR]     write DIR/NAME/ (server, manifest, reward, data) and print
                                                   the commands that check, train and evaluate it (envs.scaffold)

Exit codes: 0 ok; 1 the tool returned an error (its text is still printed); 2 a bad manifest, a
server that does not start, or bad CLI input, reported as one line on stderr without traceback (a
server that does not start: its last stderr lines follow, indented, and the path of its log).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from envs.episode import EpisodeError
from envs.manifest import ManifestError
from envs.mcp_client import ToolEnvError
from envs.tool_env import ToolEnv
from rl_factory.base.types import ToolCall


class CLIError(Exception):
    """Bad input on the command line; printed as one line."""


def _json_object(text: str, what: str, example: str) -> dict:
    """`text` parsed as a JSON object, or one CLIError line naming `what` (the argument) and how it should look."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise CLIError(f"{what}: not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise CLIError(f"{what} must be a JSON object{example}")
    return value


def _sample(args: argparse.Namespace) -> dict | None:
    return None if args.sample is None else _json_object(args.sample, "--sample", " (a dataset row)")


async def list_tools(args: argparse.Namespace) -> int:
    async with ToolEnv.from_manifest(args.manifest, log_dir=args.log_dir, probe_sample=_sample(args)) as env:
        tools = await env.list_tools()
        if args.json:
            print(json.dumps(tools, indent=2, ensure_ascii=False))
            return 0
        for schema in tools:
            fn = schema["function"]
            print(f"[{env.server_of(fn['name'])}] {fn['name']}: {fn['description']}")
            print(f"    {json.dumps(fn['parameters'], ensure_ascii=False)}")
        if not tools:
            print("(no tools)")
    return 0


async def call_tool(args: argparse.Namespace) -> int:
    arguments = _json_object(args.arguments, "arguments", ", e.g. '{\"expression\": \"2+3\"}'")
    sample = _sample(args)
    async with ToolEnv.from_manifest(args.manifest, log_dir=args.log_dir, probe_sample=sample) as env:
        if sample is None:
            result = await env.call(ToolCall(name=args.tool, arguments=arguments))
        else:
            try:
                async with env.episode(sample) as episode:
                    result = await episode.call(ToolCall(name=args.tool, arguments=arguments))
            except EpisodeError as err:
                raise CLIError(f"the sample's episode did not open: {err}") from None
    print(result.text)
    return 0 if result.ok else 1


async def new_server(args: argparse.Namespace) -> int:
    from envs.scaffold import print_next_steps, scaffold

    try:
        task = scaffold(args.name, Path(args.dir))
    except (ValueError, FileExistsError) as err:
        raise CLIError(str(err)) from None
    print_next_steps(task, args.name)
    return 0


COMMANDS = {"list": list_tools, "call": call_tool, "new-server": new_server}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m envs", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in [("list", "print every tool of the manifest"),
                            ("call", "call one tool and print its result")]:
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("manifest", help="tool manifest (YAML or JSON, mcpServers shape)")
        if name == "call":
            cmd.add_argument("tool", help="tool name")
            cmd.add_argument("arguments", nargs="?", default="{}", help="JSON object of arguments")
        else:
            cmd.add_argument("--json", action="store_true", help="print the OpenAI-shape schemas")
        cmd.add_argument("--log-dir", default=None, help="write stdio servers' stderr here")
        cmd.add_argument("--sample", default=None, help="a dataset row as JSON, for scope: episode servers "
                                                        "and hidden arguments that name ${sample.*}")
    new = sub.add_parser("new-server", help="write a new task (MCP server, manifest, reward, data) to train")
    new.add_argument("name", help="the task's and its server's name (letters, digits, _)")
    new.add_argument("--dir", default=".", help="where DIR/NAME/ is written (default: the working directory)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(COMMANDS[args.command](args))
    except (ManifestError, ToolEnvError, CLIError) as err:
        first, *quoted = str(err).split("\n")
        # One line; a server's stderr, when the error quotes it, on indented lines after it
        print(f"python -m envs {args.command}: error: {' '.join(first.split())}", *quoted, sep="\n", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
