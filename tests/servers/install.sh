#!/usr/bin/env bash
# Install the third-party MCP servers that tests/envs/test_real_servers.py runs, the way users run them:
#   .venv-time/     mcp-server-time (PyPI), in its own virtual environment (stdio)
#   node_modules/   @modelcontextprotocol/server-memory (stdio) and server-everything (streamable HTTP),
#                   pinned by package.json + package-lock.json
# Idempotent: each part leaves a stamp of what it installed and is skipped while the stamp matches.
# Needs python3 (>= 3.10), node and npm (both on the CI machine), and the package registries.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

TIME_SPEC="mcp-server-time==2026.10.19"
PY="${PYTHON:-python3}"

if [ "$(cat .venv-time/.installed 2>/dev/null)" != "$TIME_SPEC" ]; then
  rm -rf .venv-time
  "$PY" -m venv .venv-time
  .venv-time/bin/python -m pip install --disable-pip-version-check -q "$TIME_SPEC"
  echo "$TIME_SPEC" > .venv-time/.installed
fi

command -v npm >/dev/null || { echo "tests/servers/install.sh: npm not found (apt-get install nodejs npm)" >&2; exit 1; }
LOCK_SUM="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [ "$(cat node_modules/.installed 2>/dev/null)" != "$LOCK_SUM" ]; then
  npm ci --no-audit --no-fund --loglevel=error
  echo "$LOCK_SUM" > node_modules/.installed
fi
echo "test MCP servers ready: $TIME_SPEC; $(node -p 'Object.entries(require("./package.json").dependencies).map(([k, v]) => k + "@" + v).join(", ")')"
