#!/usr/bin/env bash
# Create .venv and install rl_factory into it (editable). Safe to run again.
#   bash setup.sh          # what main_grpo.sh / main_eval.sh need
#   bash setup.sh --dev    # plus the test dependencies, verl included (its backend is tested on CPU)
#   bash setup.sh --verl   # plus the verl backend (Ray, FSDP; trainer.backend=verl)
#   bash setup.sh --vllm   # plus verl's pinned vLLM for GPU nodes (torch 2.11 CUDA: set TORCH_SPEC too)
# TORCH_SPEC picks the PyTorch build (default torch==2.13.0; e.g. TORCH_SPEC="torch==2.13.0" with
# PIP_INDEX_URL pointing at a CUDA index on a GPU machine). An existing torch in .venv is kept.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install --disable-pip-version-check -q)

# torch first and pinned: an unpinned requirement would resolve to the newest (multi-GB CUDA) build.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  "${PIP[@]}" "${TORCH_SPEC:-torch==2.13.0}"
fi
extras=()
for arg in "$@"; do
  case "$arg" in
    --dev) extras+=(dev verl) ;;
    --verl) extras+=(verl) ;;
    --vllm) extras+=(verl vllm) ;;
    *) echo "setup.sh: unknown option $arg (use --dev, --verl or --vllm)" >&2; exit 2 ;;
  esac
done
spec="."
[ ${#extras[@]} -gt 0 ] && spec=".[$(IFS=,; echo "${extras[*]}")]"
"${PIP[@]}" -e "$spec"
echo "rl_factory installed in .venv ($(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "/ transformers", transformers.__version__)'))"
