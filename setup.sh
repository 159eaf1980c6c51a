#!/usr/bin/env bash
# Create .venv and install rl_factory into it (editable). Safe to run again.
#   bash setup.sh          # what main_grpo.sh / main_eval.sh need
#   bash setup.sh --dev       # plus the test dependencies and the docs site's (.[docs]), verl's CPU parts included
#                             # (its backend is tested on CPU), qwen-agent (its tool classes are tested), and the
#                             # third-party MCP servers the tests run (tests/servers/install.sh: PyPI + npm)
#   bash setup.sh --verl      # plus the verl backend for GPU nodes (verl 0.9.1, vLLM 0.24, torch 2.11 CUDA)
#   bash setup.sh --verl-cpu  # plus verl without vLLM (the plugin and `--cfg job` on a CPU machine)
# TORCH_SPEC picks the PyTorch build (default torch==2.13.0, the CPU wheel; torch==2.11.0 with --verl, as
# verl pins it). An existing torch in .venv is kept.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install --disable-pip-version-check -q)

extras=()
test_servers=0
torch_default="torch==2.13.0"
for arg in "$@"; do
  case "$arg" in
    --dev) extras+=(dev docs verl-cpu qwen-agent); test_servers=1 ;;
    --verl) extras+=(verl); torch_default="torch==2.11.0" ;;
    --verl-cpu) extras+=(verl-cpu) ;;
    *) echo "setup.sh: unknown option $arg (use --dev, --verl or --verl-cpu)" >&2; exit 2 ;;
  esac
done

# torch first and pinned: an unpinned requirement would resolve to the newest (multi-GB CUDA) build.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  "${PIP[@]}" "${TORCH_SPEC:-$torch_default}"
fi
spec="."
[ ${#extras[@]} -gt 0 ] && spec=".[$(IFS=,; echo "${extras[*]}")]"

# The project and its extras go in through uv (from PyPI, into .venv) where it can: the same packages as pip
# resolves, in a quarter of the time (the whole `bash setup.sh --dev` on a 2-core VM, pip's cache warm: 63 s against
# 244 s). uv reads no pip settings, so pip's (`pip config list`: index, extra indexes, find-links, constraints,
# certificate) become uv's flags, and the torch installed above is a constraint, so no extra pulls another torch
# build. Where uv cannot be installed or fails, pip installs as before; RL_FACTORY_INSTALLER=pip skips uv.
uv_install() {
  "${PIP[@]}" "uv>=0.5" > /dev/null 2>&1 || return 1
  local settings pins rc
  settings=$(.venv/bin/python - <<'PY'
import os, shlex, subprocess, sys
from urllib.parse import urlparse
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
flag = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
        "constraint": "--constraint", "constraints": "--constraint"}
out = []
for line in listed.splitlines():
    key, _, value = line.partition("=")
    name, value = key.rsplit(".", 1)[-1], value.strip().strip("'\"")
    if name == "cert" and not os.environ.get("SSL_CERT_FILE"):
        print(f"export SSL_CERT_FILE={shlex.quote(value)};")
    for item in value.split() if name in flag else []:
        local = urlparse(item).path if item.startswith("file:") else item if "://" not in item else None
        if local is None or os.path.exists(local):  # pip skips a missing local index with a warning; uv stops
            out += [flag[name], item]
print("uv_flags=(" + " ".join(map(shlex.quote, out)) + ")")
PY
  ) || return 1
  local uv_flags=()
  eval "$settings"
  pins=$(mktemp)
  .venv/bin/python -c 'import torch; print("torch==" + torch.__version__)' 2> /dev/null > "$pins"
  rc=0
  # unsafe-best-match: the best version over all indexes, as pip picks (uv's default stops at the first index
  # that has the package at all)
  .venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode --index-strategy unsafe-best-match \
    --constraint "$pins" "${uv_flags[@]}" -e "$spec" || rc=$?
  rm -f "$pins"
  return $rc
}
if [ "${RL_FACTORY_INSTALLER:-uv}" = pip ]; then
  "${PIP[@]}" -e "$spec"
elif ! uv_install; then
  echo "setup.sh: uv did not install the project; pip does (slower)" >&2
  "${PIP[@]}" -e "$spec"
fi
echo "rl_factory installed in .venv ($(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "/ transformers", transformers.__version__)'))"
command -v bwrap > /dev/null || echo "note: bubblewrap is not installed: the Python sandbox uses its slower" \
  "fallback engine (Debian: apt-get install bubblewrap; docs/security.md)"
# The tests run real third-party servers (mcp-server-time from PyPI, npm's server-memory and server-everything)
# from every test worker: installed here once, not raced for by parallel workers.
if [ "$test_servers" = 1 ]; then
  bash tests/servers/install.sh
fi
