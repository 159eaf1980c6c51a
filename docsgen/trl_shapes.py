"""The benchmarks page's table of ours against TRL at the Qwen3 shapes, one row per shape.

One row per shape and GPU model TRL ran it on: TRL's newest `vs_trl --shape` record of the shape on that GPU, and
ours the newest `gpu_step` record of the shape on its default job (one GPU, our agent loop, no LoRA, no overrides
but the run guard's: they change what is checked, not the work) on the same GPU model. Where both exist, ours must
have trained TRL's job (prompts x n, tokens a turn and a trajectory, turns, lr) on the same machine (the records'
`machine.boot_id`; records from before it was kept: within an hour of TRL's record), not another host of the same
GPU model (TRL alone took 3.47-4.53 s a step at the 0.6B shape on
three H100 hosts). A record of another job or another sitting is not put beside it. A side without such a record
says "not measured yet".

    .venv/bin/python -m docsgen.trl_shapes benchmarks/results [more record directories]   # the table, printed
"""
from __future__ import annotations

import datetime
import sys
from pathlib import Path
from typing import Any

from docsgen.records import fmt, load, machine_text
from docsgen.records import get as get_path

SHAPES = ("qwen3-0.6b", "qwen3-4b")
JOB_KEYS = ("prompts", "n", "max_response_tokens", "max_total_tokens", "max_turns", "lr")
MISSING = "not measured yet"
SAME_SITTING_S = 3600  # records an hour apart or more may come from two hosts of the same GPU model

INTRO = """## ours vs TRL at the Qwen3 shapes

The same job on one GPU: ours on verl (`benchmarks/gpu_step.py --shape S --steps 5 --no-ceilings`) and TRL's
`GRPOTrainer` with vLLM colocated (`benchmarks/vs_trl.py --shape S --device cuda --vllm --steps 5`), on the same
random-init weights, data, reward and calculator tool, 16 prompts x 8, 3 turns of 256 tokens, 512 tokens a
trajectory, lr 1e-6, no KL, no old-log-prob pass on either side. `bash benchmarks/gpu_suite.sh ours_shape 0.6b`
and `trl_shape 0.6b` (then `4b`) run them; benchmarks/README.md has the device commands. Seconds are medians
over steps 2 to the last (step 1 compiles and captures graphs; the commands say how many steps ran). Rollout: generation, tools and reward (TRL's without the
weight copy into vLLM, which is its own column on both sides). Memory in GiB: the device's peak used memory while
the job ran (nvidia-smi: every process, vLLM's included), each side's torch allocator peak (ours: the FSDP
actor's process; TRL: its one process, vLLM's tensors included), and vLLM's budget (gpu_memory_utilization x
the GPU). Ours asks vLLM for each sampled token's log-prob only on the steps whose checks read them (1, 11, ...:
`sampling_logprobs_every`, from `44739e0fb2b6` on); TRL's `GRPOTrainer` asks on every step (`logprobs=0`, with its
importance-sampling correction off too). Target: ours / TRL <= 1 at both shapes.
"""

HEAD = ["shape", "step s ours / TRL", "ours / TRL (target <= 1)", "rollout s", "update s", "weight sync s",
        "old log-probs s", "peak GPU used GiB", "torch peak allocated, reserved GiB", "vLLM budget GiB",
        "tokens a trajectory (ours generated / TRL completion)", "machine", "commands", "commit", "date"]


# overrides that leave the job's work as it is: what the guard checks, the actor's cache at the sync (keep, the
# default, was given on the command line by the launches that measured it against release), a log switch
JOB_NEUTRAL = ("trainer.guard.", "actor_cache_at_sync=",
               # vLLM logging its engine core's garbage collections (the launches that looked for pauses there)
               "ray_kwargs.ray_init.runtime_env.env_vars.VLLM_GC_DEBUG=")
VLLM = "actor_rollout_ref.rollout.engine_kwargs.vllm."
# and the settings the tuning plans for this job on one GPU, given on the command line by the launches that measured
# them before the tuning chose them (vLLM's full graphs for mixed steps, rl_factory/backends/verl/tuning.py), with
# vLLM's log line for each of its steps beside them
AS_TUNED = {f"{VLLM}compilation_config.mode=NONE", f"{VLLM}compilation_config.cudagraph_mode=FULL",
            "actor_rollout_ref.rollout.cudagraph_capture_sizes=[1,2,4,8,16,32,64,128,256,512,1024]",
            f"{VLLM}enable_logging_iteration_details=true"}


def neutral(override: str) -> bool:
    bare = str(override).lstrip("+")
    return bare.startswith(JOB_NEUTRAL) or bare in AS_TUNED


def ours_matches(r: dict[str, Any], shape: str) -> bool:
    neutral_only = all(neutral(o) for o in r.get("overrides") or [])
    return (r.get("shape") == shape and "job" in r and r.get("gpus", 1) == 1 and not r.get("lora_rank")
            and r.get("agent_loop", "rl_factory") == "rl_factory" and neutral_only and bool(r.get("step_s")))


def trl_matches(r: dict[str, Any], shape: str) -> bool:
    """A GPU record of TRL at `shape` that timed steps, or that says why it ran none (`trl.failed`: out of GPU
    memory is a result too)."""
    trl = r.get("trl") or {}
    return r.get("shape") == shape and r.get("device") == "cuda" and bool(trl.get("median_s") or trl.get("failed"))


def failure(trl: dict[str, Any]) -> str:
    """A failed TRL run in a few words: its last exception's type, and the message's first sentence."""
    error = str(trl.get("error") or trl.get("failed"))
    kind, _, message = error.partition(": ")
    return f"{kind.rsplit('.', 1)[-1]}: {message.split('. ')[0]}" if message else error


def ours_job(r: dict[str, Any]) -> dict[str, Any]:
    return {"prompts": r.get("batch"), "n": r.get("n"), **r["job"]}


def newest(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest record; of a launch and its join with the launch before it (`python -m benchmarks.launches`:
    the same date), the join, whose medians are over both."""
    return max(records, key=lambda r: (str(r.get("date", "")), r.get("launches") or 1), default=None)


def gpu_of(record: dict[str, Any]) -> str | None:
    return (record.get("machine") or {}).get("gpu")


def gpus(records: dict[str, list[dict[str, Any]]], shape: str) -> list[str | None]:
    """The GPUs TRL ran `shape` on, the newest run's first ([None] where it never ran on one)."""
    trl = sorted((r for r in records.get("vs_trl", []) if trl_matches(r, shape)), key=lambda r: str(r.get("date", "")),
                 reverse=True)
    return list(dict.fromkeys(gpu_of(r) for r in trl)) or [None]


def pair(records: dict[str, list[dict[str, Any]]], shape: str,
         gpu: str | None = None) -> tuple[dict | None, dict | None]:
    """(ours, TRL) for `shape` on `gpu`: TRL's newest record there, and ours' newest on the same job and GPU (any
    GPU where `gpu` is None)."""
    trl = newest([r for r in records.get("vs_trl", []) if trl_matches(r, shape) and gpu in (None, gpu_of(r))])
    ours = [r for r in records.get("gpu_step", []) if ours_matches(r, shape) and gpu in (None, gpu_of(r))]
    if trl is not None:
        ours = [r for r in ours if beside(r, trl)]
    return newest(ours), trl


def beside(ours: dict[str, Any], trl: dict[str, Any]) -> bool:
    """Whether ours' record may stand beside TRL's: TRL's job (JOB_KEYS), on the same machine (`same_sitting`)."""
    return ({k: ours_job(ours).get(k) for k in JOB_KEYS} == {k: trl.get("job", {}).get(k) for k in JOB_KEYS}
            and same_sitting(ours, trl))


def same_sitting(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two records were made on one machine: the same `machine.boot_id` where both have one (one without
    it is from before records carried it: another sitting), else within SAME_SITTING_S of each other (records
    without a date never are)."""
    boots = [(r.get("machine") or {}).get("boot_id") for r in (a, b)]
    if any(boots):
        return boots[0] == boots[1]
    try:
        dates = [datetime.datetime.fromisoformat(str(r.get("date"))) for r in (a, b)]
        return abs((dates[0] - dates[1]).total_seconds()) <= SAME_SITTING_S
    except (TypeError, ValueError):  # no date, or one with a zone beside one without
        return False


def get(record: dict[str, Any] | None, path: str) -> Any:
    return get_path(record, path) if record else None


def num(value: Any) -> str:
    return "-" if value is None else value if isinstance(value, str) else fmt(value)


def both(ours: dict | None, trl: dict | None, ours_value: Any, trl_value: Any, missing: str = "-") -> str:
    """"ours / TRL"; a side without a record shows `missing` (the step column says so in words)."""
    return f"{num(ours_value) if ours else missing} / {num(trl_value) if trl else missing}"


def vllm_budget(ours: dict | None) -> float | None:
    # the tuned keys hold dots themselves: read the key whole, not as a dotted path
    share = ((ours or {}).get("tuned") or {}).get("actor_rollout_ref.rollout.gpu_memory_utilization")
    total = get(ours, "memory_gb.device_total")
    return round(share * total, 1) if share and total else None


def tokens_per_trajectory(ours: dict | None) -> float | None:
    tokens, trajectories = get(ours, "phases.generate.generated_tokens"), get(ours, "trajectories_per_step")
    return round(tokens / trajectories, 1) if tokens and trajectories else None


def row(shape: str, ours: dict | None, trl: dict | None) -> list[str]:

    if ours is None and trl is None:
        return [shape, MISSING] + [""] * (len(HEAD) - 2)
    ratio = ""
    if trl and trl["trl"].get("failed"):
        ratio = f"TRL did not finish a step ({failure(trl['trl'])})"
    elif ours and trl:
        value = ours["step_s"] / trl["trl"]["median_s"]
        ratio = f"{value:.2f} ({'met' if value <= 1 else 'not met'})"
    sides = [r for r in (ours, trl) if r]
    machines = list(dict.fromkeys(machine_text(r.get("machine", {})) for r in sides))
    commands = "<br>".join(f"{name}: `{r.get('command', '')}`" for name, r in (("ours", ours), ("TRL", trl)) if r)
    cells = [
        shape, both(ours, trl, get(ours, "step_s"), get(trl, "trl.median_s") or "failed", MISSING), ratio,
        both(ours, trl, get(ours, "phases.generate.s"), get(trl, "trl.phases.rollout")),
        both(ours, trl, get(ours, "phases.update.s"), get(trl, "trl.phases.update")),
        both(ours, trl, get(ours, "phases.update_weights.s"), get(trl, "trl.phases.update_weights")),
        both(ours, trl, get(ours, "phases.old_log_prob.s"), get(trl, "trl.phases.old_log_prob")),
        both(ours, trl, get(ours, "memory_gb.device_peak_used"), get(trl, "trl.memory_gb.device_peak_used")),
        both(ours, trl, f"{num(get(ours, 'memory_gb.max_allocated'))}, {num(get(ours, 'memory_gb.max_reserved'))}",
             f"{num(get(trl, 'trl.memory_gb.max_allocated_gb'))}, {num(get(trl, 'trl.memory_gb.max_reserved_gb'))}"),
        both(ours, trl, vllm_budget(ours), get(trl, "trl.memory_gb.vllm_budget_gb")),
        both(ours, trl, tokens_per_trajectory(ours), get(trl, "trl.mean_completion_tokens")),
        " / ".join(machines), commands,
        " / ".join(f"`{r.get('commit', '')}`" for r in sides),
        " / ".join(str(r.get("date", ""))[:16].replace("T", " ") for r in sides),
    ]
    return [c.replace("|", "\\|") for c in cells]


def table(records: dict[str, list[dict[str, Any]]]) -> list[str]:
    out = [INTRO, "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    for shape in SHAPES:  # a row per GPU TRL ran the shape on: ours beside it from the same GPU only
        for gpu in gpus(records, shape):
            out.append("| " + " | ".join(row(shape, *pair(records, shape, gpu))) + " |")
    return out + [""]


if __name__ == "__main__":
    merged: dict[str, list[dict[str, Any]]] = {}
    for directory in sys.argv[1:] or ["benchmarks/results"]:
        for name, rows in load(Path(directory)).items() if Path(directory).is_dir() else []:
            merged.setdefault(name, []).extend(rows)
    print("\n".join(table(merged)))
