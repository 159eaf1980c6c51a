#!/usr/bin/env bash
# Every GPU measurement the README's verl table reports, on one GPU, one JSON line per measurement.
# Each group below fits one 10-minute device call (a verl job spends ~5.5 min starting):
#   bash benchmarks/gpu_suite.sh prepare     # compile the bytecode of what verl's processes import, build the builtin
#                                            # tiny model, the random-init shapes and the long-context warm start
#                                            # once, before the jobs that use them (bytecode: only the first)
#   bash benchmarks/gpu_suite.sh bytecode    # only the bytecode step (its line: what still has none after it)
#   bash benchmarks/gpu_suite.sh step [ARGS] # 0.6B shape: phases vs vLLM / forward / forward+backward ceilings
#                                            # (+ py-spy on two more steps where py-spy is installed); ARGS go to
#                                            # gpu_step.py, e.g. --batch 32 (prompts per step; default 16); the
#                                            # second launch, in the next call: step --earlier $BENCH_RESULTS_DIR/gpu_step.jsonl
#                                            # (medians over both launches' steps: benchmarks/launches.py)
#   bash benchmarks/gpu_suite.sh ab OVERRIDE...   # the 0.6B job twice in one call, as configured then with the
#                                            # overrides (benchmarks/ab.py: each phase's B / A; AB_TIMEOUT s a job)
#                                            # (ab --a-ceilings --a-earlier $BENCH_RESULTS_DIR/gpu_step.jsonl OVERRIDE...:
#                                            # A is also the head's launch with ceilings, joined with the earlier one)
#   bash benchmarks/gpu_suite.sh trace [ARGS]    # the 0.6B job with verl's torch profiler on the actor at step 3;
#                                            # benchmarks/trace_summary.py: GPU-busy share of the update and sync
#   bash benchmarks/gpu_suite.sh profile [ARGS]  # the same job with py-spy on the actor, trainer, vLLM and agent loop
#   bash benchmarks/gpu_suite.sh startup [VARIANT ...]  # 0.6B shape, 2 steps, one launch per start-up variant (default:
#                                            # baseline fast), each with empty compile caches (STARTUP_CACHES=shared:
#                                            # the machine's); the line's `startup` says where each launch's time
#                                            # went before its first step (benchmarks/startup_variants.py lists them)
#   bash benchmarks/gpu_suite.sh learn       # the default job on verl, three seeds + LoRA (run together)
#   bash benchmarks/gpu_suite.sh learn_one seed0|seed1|seed2|lora  # one of them alone
#   bash benchmarks/gpu_suite.sh merge_eval  # learn's seed-0 verl checkpoint -> model merger -> main_eval.sh
#   bash benchmarks/gpu_suite.sh compare     # our agent loop vs verl's own tool_agent loop, same model and data
#                                            # (verl's launched 150 s after ours, to fit one call)
#   bash benchmarks/gpu_suite.sh compare_one rl_factory|verl_tool_agent [ARGS]  # each alone, one call each (ARGS: overrides)
#   bash benchmarks/gpu_suite.sh large       # 4B shape, full fine-tuning (large_lora: the same with LoRA)
#   bash benchmarks/gpu_suite.sh trl_vllm    # TRL's GRPOTrainer, vLLM colocated, on compare's job (trl on a path of its own:
#                                            # installed beside verl it breaks every verl job, and the launcher refuses)
#   bash benchmarks/gpu_suite.sh long        # 8 turns of ~1k-token observations on the 0.6B shape
#   bash benchmarks/gpu_suite.sh async tiny|0.6b [ARGS]  # async_training.py's GPU arm: k=1 then k=0, 6 steps each
#                                            # (ARGS, e.g. --h200-staleness 1: one launch); 0.6b after `prepare_shapes`;
#                                            # where two launches do not fit a call: `--h200-staleness 1`, then in the
#                                            # next call `--h200-staleness 0 --h200-earlier $BENCH_RESULTS_DIR/async_training.jsonl`
# Ours vs TRL at the Qwen3 shapes (docs/benchmarks.md's table; one 10-minute call each, SHAPE_TIMEOUT s per job):
#   bash benchmarks/gpu_suite.sh prepare_shapes      # build the 0.6B and 4B shapes once (both sides load these weights)
#   bash benchmarks/gpu_suite.sh ours_shape 0.6b|4b  # ours on verl: gpu_step.py --shape, 5 steps, no ceilings
#   bash benchmarks/gpu_suite.sh trl_shape 0.6b|4b   # TRL's GRPOTrainer + colocated vLLM on the same job and weights;
#                                            # trl from $TRL_SITE (default /tmp/trl-site), on this group's path only
#   bash benchmarks/gpu_suite.sh trl_table   # the table as docs/benchmarks.md renders it, from benchmarks/results/
#                                            # and the records these groups wrote (outputs/gpu_suite/records/)
# Two GPUs (a 2-GPU host; each part below is one verl launch, ~7 min, so each fits one 10-minute call):
#   bash benchmarks/gpu_suite.sh two_gpu [one] [tp1] [tp2]  # 0.6B shape: 1 GPU (16 prompts), 2 GPUs with two vLLM
#                                            # replicas, then with tensor parallel 2 (32 prompts: the same work per
#                                            # GPU); default all three; then the scaling efficiency of what is in $RESULTS
#   bash benchmarks/gpu_suite.sh two_gpu_checks  # arena job on 2 GPUs killed after its first checkpoint and started
#                                            # again: groups once each, servers per worker and none left, resume
#   bash benchmarks/gpu_suite.sh two_gpu_arena   # (the same without the kill: one launch)
#   bash benchmarks/gpu_suite.sh two_gpu_resume  # (the default grpo job: kill after the first checkpoint, restart)
#   bash benchmarks/gpu_suite.sh check       # CPU: bash -n, every two_gpu*, ours_shape command and start-up variant
#                                            # composed with --cfg job, and trl_shape's job printed (vs_trl.py --dry-run)
#   bash benchmarks/gpu_suite.sh collect DIR # results + logs (no weights) into DIR/gpu_suite.tgz
# Results append to $RESULTS (default outputs/gpu_suite/results.jsonl); each job's log is under outputs/.
# Needs the verl backend installed as a package (bash setup.sh --verl): verl's Ray workers load our
# estimators, losses and metrics logger through the verl.plugins entry point. Each verl job spends a few
# minutes starting (Ray, FSDP, vLLM with CUDA graphs) before its first step: each run's startup.json says where.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
export PYTHON=$PY
RESULTS=${RESULTS:-outputs/gpu_suite/results.jsonl}
mkdir -p "$(dirname "$RESULTS")"
# verl jobs run side by side in `learn`: small vLLM shares, no dashboards fighting for a port, two
# agent-loop and reward workers each instead of eight (four jobs share the machine's CPU cores). vLLM
# checks the whole GPU's free memory, which the neighbours change: at sleep ("Memory usage increased
# after sleeping", one of four seeds), and while profiling at start-up ("Error in memory profiling",
# "No available memory for the cache blocks": three of four, H200, 2026-12-01). So vLLM stays awake
# between steps, and its KV cache is a fixed 2 GiB (kv_cache_memory_bytes: no profiling-based sizing).
SHARED="actor_rollout_ref.rollout.gpu_memory_utilization=0.06 +ray_kwargs.ray_init.include_dashboard=false
        actor_rollout_ref.rollout.agent.num_workers=2 reward.num_workers=2 actor_rollout_ref.rollout.free_cache_engine=false
        +actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=2147483648"

learn_run() {  # name, overrides...: one verl run of the default job; its summary as a JSON line
  local name=$1; shift
  local code attempt
  for attempt in 1 2; do
    # shellcheck disable=SC2086
    bash main_grpo.sh trainer.backend=verl trainer.n_gpus_per_node=1 trainer.output_dir=outputs/gpu_suite/$name \
         $SHARED "$@" 2>&1 | $PY benchmarks/stamp.py outputs/gpu_suite/$name.log
    code=${PIPESTATUS[0]}
    # verl picks its FSDP rendezvous port by binding port 0, closing it and binding it again in the worker
    # (single_controller/ray/base.py get_master_addr_port); with several jobs starting on one host another
    # process can take it in between (H200, 2026-12-02: one of four). Such a job never trained: start it again.
    if [ "$code" != 0 ] && [ "$attempt" = 1 ] && grep -q EADDRINUSE "outputs/gpu_suite/$name.log" \
       && ! grep -q '"step": 1,' "outputs/gpu_suite/$name/metrics.jsonl" 2>/dev/null; then
      echo "learn_run $name: verl's rendezvous port was taken before the first step; starting it again" >&2
      mv "outputs/gpu_suite/$name.log" "outputs/gpu_suite/$name.port-race.log"
      rm -rf "outputs/gpu_suite/$name"
      continue
    fi
    break
  done
  $PY - "$name" "$code" <<'PY' >> "$RESULTS"
import json, sys
from pathlib import Path
name, code = sys.argv[1], int(sys.argv[2])
run = Path("outputs/gpu_suite") / name
lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()] if (run / "metrics.jsonl").exists() else []
log = (Path("outputs/gpu_suite") / f"{name}.log").read_text(errors="replace")
print(json.dumps({"bench": "verl_learn", "run": name, "exit_code": code, "traceback": "Traceback" in log,
                  "val_accuracy": {m["step"]: m["val/accuracy"] for m in lines if "val/accuracy" in m},
                  "step_s": [round(m["timing/step_s"], 2) for m in lines if "timing/step_s" in m],
                  # verl's old-log-prob pass logs it as training/..., our loss (algorithm.old_log_probs=update) as actor/...
                  "rollout_probs_diff_mean": [m.get("training/rollout_probs_diff_mean", m.get("actor/rollout_probs_diff_mean"))
                                              for m in lines if m["step"] > 0]}))
PY
}

# ---- two GPUs -----------------------------------------------------------------------------------------
JOB_TIMEOUT=${JOB_TIMEOUT:-480}        # seconds per verl job: the steps logged by then are still measured
SHAPE_TIMEOUT=${SHAPE_TIMEOUT:-540}    # seconds per job of the shape groups (one job a call; the steps done by then count)
TWO_GPU_BATCH=${TWO_GPU_BATCH:-32}     # prompts per step on 2 GPUs (16 = the same step split in two)
CHECK=0 FAILED=0
# the trace group's job: verl's torch profiler on the FSDP worker (rank 0) over step 3, kernels and Python frames
TRACE_JOB=($PY benchmarks/gpu_step.py --shape qwen3-0.6b --steps 4 --no-ceilings --out outputs/gpu_suite
           global_profiler.tool=torch "global_profiler.steps=[3]" "global_profiler.save_path=$PWD/outputs/gpu_suite/trace"
           actor_rollout_ref.actor.profiler.enable=true "actor_rollout_ref.actor.profiler.tool_config.torch.contents=[cuda,stack]")
run_line() {  # a command that prints one JSON line: shown and appended to $RESULTS; under `check`, composed only
  if [ "$CHECK" = 1 ]; then
    "$@" --cfg-job || FAILED=1
  else
    "$@" | tee -a "$RESULTS"
  fi
}
two_gpu_part() {
  local step=($PY benchmarks/gpu_step.py --shape qwen3-0.6b --steps 5 --no-ceilings --timeout "$JOB_TIMEOUT" --out outputs/gpu_suite)
  case $1 in
    one) run_line "${step[@]}" --gpus 1 --batch 16 ;;
    tp1) run_line "${step[@]}" --gpus 2 --tp 1 --batch "$TWO_GPU_BATCH" ;;
    tp2) run_line "${step[@]}" --gpus 2 --tp 2 --batch "$TWO_GPU_BATCH" ;;
    *) echo "two_gpu: unknown part '$1' (one, tp1, tp2)" >&2; exit 2 ;;
  esac
}
# The shape groups' records go to an ignored directory: a device call sends the tracked benchmarks/results/ again
# each time, over what the call before appended there. `collect` brings them back; append them to benchmarks/results/.
SHAPE_RECORDS=outputs/gpu_suite/records
SHAPE_STEPS=${SHAPE_STEPS:-5}
shape_size() {  # 0.6b | 4b -> the gpu_step.py / vs_trl.py shape name
  case $1 in
    0.6b|4b) echo "qwen3-$1" ;;
    *) echo "unknown shape '$1' (0.6b or 4b)" >&2; exit 2 ;;
  esac
}
ours_shape() {  # size: ours on verl, the job vs_trl.py --shape matches
  local shape; shape=$(shape_size "$1") || exit 2
  BENCH_RESULTS_DIR=$SHAPE_RECORDS run_line $PY benchmarks/gpu_step.py --shape "$shape" --steps "$SHAPE_STEPS" --no-ceilings \
      --timeout "$SHAPE_TIMEOUT" --out outputs/gpu_suite
}
trl_shape() {  # size: TRL on that job and those weights, trl on this command's path only (beside verl it breaks verl)
  local shape name code trl_path
  shape=$(shape_size "$1") || exit 2
  trl_path="${TRL_SITE:-/tmp/trl-site}${PYTHONPATH:+:$PYTHONPATH}"
  local cmd=($PY benchmarks/vs_trl.py --shape "$shape" --device cuda --vllm --steps "$SHAPE_STEPS" --timeout "$SHAPE_TIMEOUT"
             --models outputs/gpu_suite --out "outputs/gpu_suite/trl-$shape")
  if [ "$CHECK" = 1 ]; then "${cmd[@]}" --dry-run || FAILED=1; return; fi
  PYTHONPATH=$trl_path $PY -c "import trl" 2>/dev/null \
    || { echo "trl_shape: trl is not importable from ${TRL_SITE:-/tmp/trl-site} (benchmarks/README.md: TRL at the shapes)" >&2; exit 2; }
  name=outputs/gpu_suite/trl-$shape
  PYTHONPATH=$trl_path BENCH_RESULTS_DIR=$SHAPE_RECORDS "${cmd[@]}" > "$name.json" 2> "$name.log"
  code=$?; cat "$name.json" | tee -a "$RESULTS"
  [ $code = 0 ] || { tail -20 "$name.log"; tail -40 "$name/trl/worker.log" 2>/dev/null; }
  return $code
}
ASYNC_TIMEOUT=${ASYNC_TIMEOUT:-280}  # seconds per async launch: two to a 10-minute call where a launch starts in
                                     # under ~4 min (on the H200 one took 268-318 s: one a call, --h200-earlier)
watch_startup() {  # name: with py-spy installed, stacks of the next launch's processes until its first step
  # (benchmarks/startup_watch.py: what each start-up phase of startup.json ran); its pid in $STARTUP_WATCHER
  STARTUP_WATCHER=
  [ "$CHECK" = 1 ] && return 0
  command -v py-spy >/dev/null || return 0
  $PY benchmarks/startup_watch.py --runs outputs/gpu_suite --out "outputs/gpu_suite/startup-stacks/$1-$(date +%s)" >> "$RESULTS" &
  STARTUP_WATCHER=$!
}
end_watch() {  # the watcher is done at the first step; one still running means the launch never got there
  [ -n "${STARTUP_WATCHER:-}" ] && { sleep 3; kill "$STARTUP_WATCHER" 2>/dev/null; wait "$STARTUP_WATCHER" 2>/dev/null; }
  STARTUP_WATCHER=
}
async_arm() {  # model (tiny|0.6b) [async_training.py options]: its GPU arm, `fast` start-up settings on both launches
  local model=$1 extra=(); shift
  case "$model" in
    tiny) extra=(actor_rollout_ref.rollout.enforce_eager=true) ;;  # the tiny model decodes as fast without graphs
    0.6b) model=qwen3-0.6b ;;
    *) echo "async: tiny or 0.6b, not '$model'" >&2; exit 2 ;;
  esac
  local fast; fast=$($PY benchmarks/startup_variants.py --overrides fast) || exit 2
  local cmd=($PY benchmarks/async_training.py --arms h200 --h200-models "$model" --steps 6 --timeout "$ASYNC_TIMEOUT"
             --keep --out "outputs/gpu_suite/async-$model" --shapes-dir outputs/gpu_suite "$@" -- $fast "${extra[@]}")
  if [ "$CHECK" = 1 ]; then echo "async $model: ${cmd[*]}"; return; fi
  [[ " $* " == *" --dry-run "* ]] || watch_startup "async-$model"  # the first launch's
  "${cmd[@]}" | tee -a "$RESULTS"
  end_watch
}
STARTUP_TIMEOUT=${STARTUP_TIMEOUT:-270}  # seconds per start-up launch (two to a 10-minute call): a launch stopped
                                         # before its first step still reports its startup.json so far
startup_part() {  # one launch of a start-up variant; its line has the run's startup.json even if it never trained
  local caches=(--fresh-caches)
  [ "${STARTUP_CACHES:-fresh}" = shared ] && caches=()
  watch_startup "$1"
  run_line $PY benchmarks/gpu_step.py --shape qwen3-0.6b --steps 2 --no-ceilings --timeout "$STARTUP_TIMEOUT" \
      --out outputs/gpu_suite --startup-variant "$1" "${caches[@]}"
  end_watch
}
two_gpu_job() {  # name, two_gpu_checks.py options
  local name=$1; shift
  run_line $PY benchmarks/two_gpu_checks.py --gpus 2 --timeout 520 --out "outputs/gpu_suite/$name" "$@"
}

case "${1:-}" in
  two_gpu)
    shift
    parts=("$@")
    [ ${#parts[@]} -eq 0 ] && parts=(one tp1 tp2)
    for part in "${parts[@]}"; do two_gpu_part "$part"; done
    $PY benchmarks/scaling.py "$RESULTS" | tee -a "$RESULTS" ;;
  two_gpu_checks) two_gpu_job two_gpu_checks --advantage arena --kill-after-checkpoint ;;
  two_gpu_arena) two_gpu_job two_gpu_arena --advantage arena ;;
  two_gpu_resume) two_gpu_job two_gpu_resume --advantage grpo --kill-after-checkpoint ;;
  check)  # on any machine: what the two_gpu groups launch, composed by main_grpo.sh --cfg job (no GPU, no Ray)
    bash -n "$0" || exit 1
    CHECK=1
    for part in one tp1 tp2; do two_gpu_part "$part"; done
    two_gpu_job check_checks --advantage arena --kill-after-checkpoint
    two_gpu_job check_resume --advantage grpo --kill-after-checkpoint
    for size in 0.6b 4b; do ours_shape $size; trl_shape $size; done
    for variant in $($PY -c "from benchmarks.startup_variants import VARIANTS; print(*VARIANTS)"); do
      startup_part "$variant"
    done
    for model in tiny 0.6b; do async_arm $model; done  # printed: the arm's jobs compose in tests/benchmarks
    $PY benchmarks/ab.py --cfg-job actor_cache_at_sync=keep >/dev/null || FAILED=1
    "${TRACE_JOB[@]}" --cfg-job >/dev/null || FAILED=1
    [ "$FAILED" = 0 ] && echo "check: every two_gpu, shape, start-up variant, ab and trace command composes" || echo "check: FAILED" >&2
    exit "$FAILED" ;;
  startup)
    shift
    variants=("$@")
    [ ${#variants[@]} -eq 0 ] && variants=(baseline fast)
    for variant in "${variants[@]}"; do startup_part "$variant"; done ;;
  step)  # with py-spy installed, two more steps run under it (benchmarks/pyspy_watch.py); medians stay steps 2-5
    if command -v py-spy >/dev/null; then
      $PY benchmarks/pyspy_watch.py --runs outputs/gpu_suite --after-step 5 --seconds 10 --out outputs/gpu_suite/pyspy \
          >> "$RESULTS" &
      watcher=$!
      $PY benchmarks/gpu_step.py --shape qwen3-0.6b --steps 7 --measure-until 5 --out outputs/gpu_suite "${@:2}" >> "$RESULTS"
      # done long before (the ceilings run after the job); still waiting only if the job never reached step 5
      kill $watcher 2>/dev/null; wait $watcher 2>/dev/null
    else
      $PY benchmarks/gpu_step.py --shape qwen3-0.6b --steps 5 --out outputs/gpu_suite "${@:2}" >> "$RESULTS"
    fi ;;
  profile)  # the step group's job with py-spy on verl's processes for 15 s of steady steps (benchmarks/pyspy_watch.py)
    command -v py-spy >/dev/null || { echo "profile: needs py-spy (pip install py-spy; on the lent GPU: .whl/)" >&2; exit 2; }
    $PY benchmarks/pyspy_watch.py --runs outputs/gpu_suite --after-step 2 --seconds 15 --out outputs/gpu_suite/pyspy \
        >> "$RESULTS" &
    watcher=$!
    # verl's tqbridge logs each TransferQueue get/put with its time at INFO: where the old-log-prob phase's
    # time outside the actor's forward goes (py-spy, H200, 2026-12-01: half of the phase)
    $PY benchmarks/gpu_step.py --shape qwen3-0.6b --steps 7 --no-ceilings --out outputs/gpu_suite \
        +ray_kwargs.ray_init.runtime_env.env_vars.VERL_LOGGING_LEVEL=INFO "${@:2}" >> "$RESULTS"
    kill $watcher 2>/dev/null; wait $watcher 2>/dev/null ;;
  async) async_arm "${2:?async tiny|0.6b}" "${@:3}" ;;
  trace)  # verl's own torch profiler (chrome trace of the FSDP worker over step 3: kernels, copies, Python frames)
    rm -rf outputs/gpu_suite/trace
    "${TRACE_JOB[@]}" "${@:2}" >> "$RESULTS"
    $PY benchmarks/trace_summary.py outputs/gpu_suite/trace | tee -a "$RESULTS" ;;
  ab) $PY benchmarks/ab.py --timeout "${AB_TIMEOUT:-250}" "${@:2}" | tee -a "$RESULTS" ;;
  prepare_shapes)
    $PY -m rl_factory.backends.verl.bytecode --compile >> "$RESULTS" || exit 1
    $PY benchmarks/gpu_step.py --prepare --shape qwen3-0.6b --out outputs/gpu_suite || exit 1
    $PY benchmarks/gpu_step.py --prepare --shape qwen3-4b --out outputs/gpu_suite || exit 1 ;;
  ours_shape) ours_shape "${2:?ours_shape 0.6b|4b}" ;;
  trl_shape) trl_shape "${2:?trl_shape 0.6b|4b}"; exit $? ;;
  trl_table) $PY -m docsgen.trl_shapes benchmarks/results "$SHAPE_RECORDS"; exit $? ;;
  bytecode)  # compile what verl's processes import, once: an environment without bytecode (PYTHONDONTWRITEBYTECODE,
    # pip --no-compile) compiles it in every process of every launch (rl_factory/backends/verl/bytecode.py)
    $PY -m rl_factory.backends.verl.bytecode --compile | tee -a "$RESULTS" ;;
  prepare)
    $PY -m rl_factory.backends.verl.bytecode --compile >> "$RESULTS" || exit 1
    $PY benchmarks/gpu_step.py --prepare --shape qwen3-0.6b --out outputs/gpu_suite || exit 1
    $PY benchmarks/gpu_step.py --prepare --shape qwen3-4b --out outputs/gpu_suite || exit 1
    $PY benchmarks/long_context.py --prepare --shape qwen3-0.6b --out outputs/gpu_suite || exit 1 ;;
  learn)
    # The builtin model is built once, here, before the jobs start: four jobs each building it at once on
    # the same cores took minutes per 25 warm-start steps (seen on the H200 host, 2026-12-01).
    tiny=$($PY -c "from benchmarks.shapes import builtin_tokenizer_dir; print(builtin_tokenizer_dir())") || exit 1
    for seed in 0 1 2; do
      learn_run seed$seed model.path=$tiny seed=$seed trainer.total_steps=20 trainer.eval_every=5 & sleep 15
    done
    # LoRA: rollout_probs_diff_mean (vLLM's sampling log-probs vs the actor's) stays small only if vLLM
    # samples the updated adapter after every step
    learn_run lora model.path=$tiny seed=0 model.lora_rank=8 optim.lr=5e-3 trainer.total_steps=12 trainer.eval_every=6 &
    wait ;;
  learn_one)  # one of learn's jobs alone (seedN or lora): vLLM's start-up memory check fails beside other jobs
    tiny=$($PY -c "from benchmarks.shapes import builtin_tokenizer_dir; print(builtin_tokenizer_dir())") || exit 1
    case ${2:?learn_one seed0|seed1|seed2|lora} in
      seed*) learn_run "$2" model.path=$tiny seed=${2#seed} trainer.total_steps=20 trainer.eval_every=5 ;;
      lora) learn_run lora model.path=$tiny seed=0 model.lora_rank=8 optim.lr=5e-3 trainer.total_steps=12 trainer.eval_every=6 ;;
      *) echo "learn_one: seed0, seed1, seed2 or lora" >&2; exit 2 ;;
    esac ;;
  merge_eval)
    ckpt=$(ls -d outputs/gpu_suite/seed0/checkpoints/global_step_* | sort -V | tail -1)
    $PY -m rl_factory.backends.verl.model_merger merge --backend fsdp --local_dir "$ckpt/actor" --target_dir outputs/gpu_suite/seed0/hf \
        > outputs/gpu_suite/merge.log 2>&1 || { tail -5 outputs/gpu_suite/merge.log; exit 1; }
    # the merger writes bf16; the tiny model is evaluated with fp32 compute on those weights
    bash main_eval.sh model.path=outputs/gpu_suite/seed0/hf model.device=cuda model.dtype=float32 \
         eval.output_dir=outputs/gpu_suite/seed0/eval > outputs/gpu_suite/eval.log 2>&1
    $PY -c "import json; r = json.load(open('outputs/gpu_suite/seed0/eval/results.json')); print(json.dumps({'bench': 'verl_merged_eval', 'checkpoint': '$ckpt', **r.get('metrics', r)}))" >> "$RESULTS" ;;
  compare)
    # Two launches back to back take longer than one device call, so verl's loop starts COMPARE_STAGGER s after
    # ours: our measured steps run while verl's job is still starting (Ray and imports, CPU), and verl's steps
    # run after ours have ended (step_end_unix in both lines; the summary line checks it). Any contention
    # falls on our loop's steps, not on verl's.
    tiny=$($PY -c "from benchmarks.shapes import builtin_tokenizer_dir; print(builtin_tokenizer_dir())") || exit 1
    $PY benchmarks/gpu_step.py --model "$tiny" --steps 8 --no-ceilings --agent-loop rl_factory --out outputs/gpu_suite \
        > outputs/gpu_suite/compare-rl_factory.json &
    ours=$!
    sleep "${COMPARE_STAGGER:-150}"
    $PY benchmarks/gpu_step.py --model "$tiny" --steps 8 --no-ceilings --agent-loop verl_tool_agent --out outputs/gpu_suite \
        > outputs/gpu_suite/compare-verl_tool_agent.json
    wait $ours
    cat outputs/gpu_suite/compare-rl_factory.json outputs/gpu_suite/compare-verl_tool_agent.json >> "$RESULTS"
    $PY benchmarks/compare_loops.py outputs/gpu_suite/compare-rl_factory.json outputs/gpu_suite/compare-verl_tool_agent.json \
        >> "$RESULTS" ;;
  compare_one)  # one loop alone (one device call each, back to back); the second one also prints the summary line
    loop=${2:?compare_one rl_factory|verl_tool_agent}
    tiny=$($PY -c "from benchmarks.shapes import builtin_tokenizer_dir; print(builtin_tokenizer_dir())") || exit 1
    $PY benchmarks/gpu_step.py --model "$tiny" --steps 8 --no-ceilings --agent-loop "$loop" --out outputs/gpu_suite "${@:3}" \
        > "outputs/gpu_suite/compare-$loop.json" && cat "outputs/gpu_suite/compare-$loop.json" >> "$RESULTS"
    if [ -s outputs/gpu_suite/compare-rl_factory.json ] && [ -s outputs/gpu_suite/compare-verl_tool_agent.json ]; then
      $PY benchmarks/compare_loops.py outputs/gpu_suite/compare-rl_factory.json outputs/gpu_suite/compare-verl_tool_agent.json \
          >> "$RESULTS"
    fi ;;
  trl_vllm)  # compare's job (builtin tiny model, 16 x 8, 256-token turns, lr 1e-6, 8 steps) on TRL with vLLM
    $PY benchmarks/vs_trl.py --only trl --device cuda --vllm --steps 8 --skip-eval --max-response-tokens 256 --lr 1e-6 \
        --out outputs/gpu_suite/trl_vllm > outputs/gpu_suite/trl_vllm.json 2> outputs/gpu_suite/trl_vllm.log
    code=$?; cat outputs/gpu_suite/trl_vllm.json >> "$RESULTS"; [ $code = 0 ] || tail -30 outputs/gpu_suite/trl_vllm.log
    exit $code ;;
  large)
    $PY benchmarks/gpu_step.py --shape qwen3-4b --steps 3 --no-ceilings --out outputs/gpu_suite "${@:2}" >> "$RESULTS" ;;
  large_lora)
    $PY benchmarks/gpu_step.py --shape qwen3-4b --steps 3 --no-ceilings --lora-rank 64 --lr 1e-5 --out outputs/gpu_suite >> "$RESULTS" ;;
  long)
    $PY benchmarks/long_context.py --shape qwen3-0.6b --steps 2 --out outputs/gpu_suite >> "$RESULTS" ;;
  collect)  # the results and every log (small files) into one archive under $2, e.g. the device's $OUT
    tar -czf "${2:?collect DIR}/gpu_suite.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.parquet' \
        --exclude='model-*' --exclude='checkpoints' --exclude='hf' outputs/gpu_suite
    [ -d "$SHAPE_RECORDS" ] && cp -r "$SHAPE_RECORDS" "$2/records"
    cp "$RESULTS" "$2/" 2>/dev/null; exit 0 ;;
  *)
    sed -n '2,/^set /p' "$0" | grep '^#'; exit 2 ;;
esac
echo "results: $RESULTS"
