#!/usr/bin/env bash
# Evaluate a model or checkpoint with the same tools and reward as training (greedy by default):
#   bash main_eval.sh                  # the last checkpoint of the run main_grpo.sh trains (same overrides)
#   bash main_eval.sh model.path=outputs/calculator_grpo/checkpoints/step_000040
#   bash main_eval.sh model.path=Qwen/Qwen3-0.6B eval.files=test.jsonl eval.n=4 eval.temperature=1.0
# Prints accuracy, mean reward, average turns, tool-call rates (with tools) and how episodes stopped
# (with env.environment), and the failures by cause; writes results.json and rollouts.jsonl to
# eval.output_dir (default: <checkpoint>/eval). Config: configs/eval.yaml.
set -euo pipefail
# Relative paths in the arguments are the caller's (rl_factory/paths.py); the config's defaults the project's.
export RL_FACTORY_CALLER_CWD="$PWD"
cd "$(dirname "${BASH_SOURCE[0]}")"

if [ -z "${PYTHON:-}" ]; then  # $PYTHON if set, else the project's .venv
  PYTHON=python3
  [ -x .venv/bin/python ] && PYTHON=.venv/bin/python
fi
export TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1

exec "$PYTHON" -m rl_factory.cli eval "$@"
