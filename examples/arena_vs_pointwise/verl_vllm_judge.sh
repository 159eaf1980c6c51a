#!/usr/bin/env bash
# The experiment's arena arm on the verl backend, its pairwise judge served by a second vLLM process on the
# same GPU: the judge path (rewards/judge.py -> rewards/chat.py -> vLLM's OpenAI server) under a training
# job's load. Needs one GPU and the verl backend (bash setup.sh --verl).
#
#   bash examples/arena_vs_pointwise/verl_vllm_judge.sh [JUDGE_MODEL] [main_grpo.sh overrides ...]
#
# JUDGE_MODEL: a model directory vLLM loads offline; default the builtin tiny model (built here if needed).
# JUDGE_MAX_LEN: the judge's context (1024: the tiny model has 1024 positions, and vLLM refuses a longer one).
# JUDGE_VLLM_ARGS: more arguments of the judge's server (e.g. --enforce-eager: no CUDA graphs, a faster start).
# The judge's replies are constrained to the verdict's JSON schema (algorithm.arena.judge.extra_body ->
# vLLM's structured outputs), so the builtin tiny model, which never learnt to judge, still answers
# {"winner": ...}: the run measures the judge path under load (requests, latency, parsed verdicts), not the
# quality of the verdicts. Replies vLLM cannot constrain are judge failures (arena/judge_failures,
# on_judge_failure=tie, no retries).
# Prints one JSON line (summary.py beside this script) and records it in benchmarks/results/arena_vllm_judge.jsonl:
# per step the arena requests, failures and ties, step seconds, the guard's findings; the judge's own count.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-outputs/arena_vllm_judge}
PORT=${JUDGE_PORT:-8020}
JUDGE=${1:-}
GIVEN=$JUDGE  # as given (empty: the builtin model), for the record's command
[ $# -gt 0 ] && shift
if [ -z "$JUDGE" ]; then
  # the path is the last line: a first build prints its progress on stdout too
  JUDGE=$($PY -c "from rl_factory.models.tiny import ensure_tiny_model; print(ensure_tiny_model())" | tail -n 1)
fi
mkdir -p "$OUT"
# vLLM decodes the judge's reply under this JSON schema (structured outputs), so even a model that never learnt
# the prompt's form answers with a verdict
VERDICT_SCHEMA='{response_format:{type:json_schema,json_schema:{name:verdict,schema:{type:object,properties:{winner:{type:string,enum:[A,B,tie]}},required:[winner]}}}}'
# The judge: a second vLLM process with a small, fixed share of the GPU beside verl's own rollout engine.
$PY -m vllm.entrypoints.openai.api_server --model "$JUDGE" --served-model-name judge --port "$PORT" \
    --gpu-memory-utilization 0.08 --max-model-len "${JUDGE_MAX_LEN:-1024}" --max-num-seqs 64 --dtype bfloat16 ${JUDGE_VLLM_ARGS:-} > "$OUT/judge.log" 2>&1 &
judge_pid=$!
trap 'kill $judge_pid 2>/dev/null; wait $judge_pid 2>/dev/null' EXIT
up() { $PY -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" "http://127.0.0.1:$PORT/v1/models" 2>/dev/null; }
for _ in $(seq 300); do
  up && break
  kill -0 $judge_pid 2>/dev/null || { tail -30 "$OUT/judge.log" >&2; exit 1; }
  sleep 1
done
up || { echo "the judge did not start in 300 s" >&2; exit 1; }

bash main_grpo.sh experiment_name=arena_vllm_judge trainer.output_dir="$OUT/run" trainer.backend=verl \
     trainer.n_gpus_per_node=1 trainer.total_steps=6 trainer.eval_every=3 data.train_batch_size=16 rollout.n=8 \
     reward.function=examples/arena_vs_pointwise/task.py:reward algorithm.advantage=arena \
     algorithm.arena.topology=swiss algorithm.arena.on_judge_failure=tie algorithm.arena.judge.type=llm \
     algorithm.arena.judge.base_url="http://127.0.0.1:$PORT/v1" algorithm.arena.judge.model=judge \
     algorithm.arena.judge.api_key_env=null algorithm.arena.judge.max_retries=0 \
     algorithm.arena.judge.max_concurrency=32 algorithm.arena.judge.max_tokens=64 \
     algorithm.arena.judge.prompt=examples/arena_vs_pointwise/pairwise_prompt.txt \
     "++algorithm.arena.judge.extra_body=$VERDICT_SCHEMA" \
     actor_rollout_ref.rollout.gpu_memory_utilization=0.3 "$@" 2>&1 | tee "$OUT/train.log"

RLF_JUDGE="$GIVEN" RLF_ARGS="${*@Q}" $PY - "$OUT" "$JUDGE" "$PORT" <<'PY'
import json, os, shlex, sys, urllib.request
from pathlib import Path
sys.path.insert(0, os.getcwd())
from examples.arena_vs_pointwise.summary import summarize
from benchmarks.record import append, make_record
out, judge, port = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
served = sum(float(l.split()[-1]) for l in metrics.splitlines() if l.startswith("vllm:request_success_total"))
result = summarize(out / "run", judge, served)
print(json.dumps(result), flush=True)
argv = ["examples/arena_vs_pointwise/verl_vllm_judge.sh", os.environ["RLF_JUDGE"], *shlex.split(os.environ["RLF_ARGS"])]
record = make_record("arena_vllm_judge", result, argv)
record["command"] = shlex.join(["bash", *argv])  # a shell script, not a Python one
append("arena_vllm_judge", record)
PY
