#!/usr/bin/env bash
# Train a tool-using agent with GRPO. Any config key can be overridden Hydra-style:
#   bash main_grpo.sh                                   # the embedded default: tiny model + calculator (CPU)
#   bash main_grpo.sh model.device=cuda trainer.total_steps=100
#   bash main_grpo.sh env.tools=tools.yaml reward.function=my_reward.py:reward data.train_files=train.jsonl
# Config: configs/grpo.yaml. Outputs: outputs/<experiment_name>/ (metrics.jsonl, rollouts/, checkpoints/).
# A killed run continues from its last checkpoint when started again with the same arguments.
set -euo pipefail
# Relative paths in the arguments are the caller's (rl_factory/paths.py); the config's defaults the project's.
export RL_FACTORY_CALLER_CWD="$PWD"
cd "$(dirname "${BASH_SOURCE[0]}")"

# --- environment --------------------------------------------------------------------------------
# Use $PYTHON if set, else the project's virtual environment (made by the README's setup command).
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  [ -x .venv/bin/python ] && PYTHON=.venv/bin/python
fi
# No hub downloads unless the user asks for a hub model; tokenizers' thread pool fights torch's.
export TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1

# --- train --------------------------------------------------------------------------------------
exec "$PYTHON" -m rl_factory.cli train "$@"
