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
"${PIP[@]}" -e "$spec"
echo "rl_factory installed in .venv ($(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "/ transformers", transformers.__version__)'))"
command -v bwrap > /dev/null || echo "note: bubblewrap is not installed: the Python sandbox uses its slower" \
  "fallback engine (Debian: apt-get install bubblewrap; docs/security.md)"
# The tests run real third-party servers (mcp-server-time from PyPI, npm's server-memory and server-everything)
# from every test worker: installed here once, not raced for by parallel workers.
if [ "$test_servers" = 1 ]; then
  bash tests/servers/install.sh
fi
