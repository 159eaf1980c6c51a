"""MCP servers bundled with rl_factory; each runs as `python -m envs.servers.<name>`."""
