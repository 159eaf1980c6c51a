"""Start-up variants of a verl launch: the settings that shorten a phase of `startup.json`, one launch each.

    python benchmarks/startup_variants.py                    # the variants: overrides, the phases they cut, the cost
    python benchmarks/startup_variants.py --cfg-job          # compose each with the 0.6B shape (main_grpo.sh --cfg job)
    bash benchmarks/gpu_suite.sh startup [VARIANT ...]       # on the GPU: gpu_step.py --startup-variant NAME, each

Every verl run writes `<output_dir>/startup.json` (rl_factory/backends/verl/startup.py: phase -> seconds from
the process's start to the first step's metrics line); gpu_step.py copies it into its JSON line. A variant is
the 0.6B job of `gpu_suite.sh step` with a few verl keys changed. Which phase each one shortens is what the
record shows; what it costs beyond start-up (slower steps, GPU memory) is in the same line's step phases.

What start-up spends that no setting cuts: Python imports in every process (the launcher, the TaskRunner,
each FSDP, vLLM, agent-loop and reward worker), FSDP's process group, loading the tokenizer. What a launch
leaves on the machine (vLLM's model-info cache under `~/.cache/vllm`, Inductor's and Triton's caches) shortens
the next launch of the same shape; vLLM's own compile cache does not, since verl turns it off
(`VLLM_DISABLE_COMPILE_CACHE=1`). `--fresh-caches` (gpu_step.py) gives each launch its own empty vLLM, Inductor
and Triton caches, so that variants launched one after another compare as first launches; what such a launch
compiled is then added to the machine's own caches (`keep_fresh_caches`), so that the next launch without
`--fresh-caches` starts as a user's second launch would, not as another first one.
"""
from __future__ import annotations

import argparse
import getpass
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Variant:
    overrides: tuple[str, ...]
    phases: str  # the startup.json phases it shortens
    cost: str  # what it changes beyond start-up


VARIANTS = {
    "baseline": Variant((), "-", "gpu_suite.sh step's job as it is"),
    # verl passes enforce_eager to vLLM, which then neither compiles (torch.compile, Inductor) nor captures
    # CUDA graphs
    "eager": Variant(("actor_rollout_ref.rollout.enforce_eager=true",), "rollout_servers",
                     "decode runs without CUDA graphs: a slower generate phase every step"),
    # the tuning starts a one-GPU replica without torch.compile (full CUDA graphs for decode over vLLM's own
    # kernels, tuning.COMPILATION_CONFIG); this is vLLM's default, which verl asks for: compiled, piecewise and
    # full graphs
    "compiled": Variant(("+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.mode=VLLM_COMPILE",
                         "+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_mode="
                         "FULL_AND_PIECEWISE"), "rollout_servers (added)",
                        "Inductor's fused kernels inside the CUDA graphs: what the generate phase gains by them"),
    # verl's default keeps vLLM asleep between rollouts (weights and KV cache released for the trainer): the
    # replicas sleep before the checkpoint load and wake for the first weight sync. The tuning plan keeps it awake
    # where the trainer loses nothing by it (the 0.6B shape on an H200): there this variant is the baseline
    "awake": Variant(("actor_rollout_ref.rollout.free_cache_engine=false",), "rollout_sleep, weight_sync",
                     "vLLM's weights and KV cache stay on the GPU beside the trainer's state (fine for small models)"),
    "no_dashboard": Variant(("+ray_kwargs.ray_init.include_dashboard=false",), "ray_init",
                            "no Ray dashboard (http://127.0.0.1:8265) for the run"),
    # verl starts agent.num_workers agent-loop workers (8) and reward.num_workers reward workers, each a process
    # that imports verl and (ours) starts its own tool servers
    "few_workers": Variant(("actor_rollout_ref.rollout.agent.num_workers=2", "reward.num_workers=2"),
                           "agent_loop_manager, reward_workers",
                           "fewer processes run the agent loops and rewards: a step's tool calls and scoring "
                           "share fewer cores"),
    "offload": Variant(("actor_rollout_ref.actor.fsdp_config.param_offload=true",
                        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true"), "actor_init",
                       "parameters and optimizer state on the CPU between uses: slower updates"),
    # configs/verl.yaml validates before training (verl's default); gpu_suite.sh step's job does not
    "validate_first": Variant(("trainer.val_before_train=true",),
                              "validation (added)", "what a validation before step 1 adds (the default for users)"),
}
# every setting above that changes nothing a step computes, together
VARIANTS["fast"] = Variant(VARIANTS["awake"].overrides + VARIANTS["no_dashboard"].overrides
                           + VARIANTS["few_workers"].overrides,
                           "rollout_sleep, weight_sync, ray_init, agent_loop_manager, reward_workers",
                           "awake + no_dashboard + few_workers")
VARIANTS["fast_eager"] = Variant(VARIANTS["fast"].overrides + VARIANTS["eager"].overrides,
                                 VARIANTS["fast"].phases + ", rollout_servers", "fast + eager")
CACHE_VARS = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def overrides(name: str) -> list[str]:
    if name not in VARIANTS:
        raise SystemExit(f"unknown start-up variant {name!r} (known: {', '.join(VARIANTS)})")
    return list(VARIANTS[name].overrides)


def fresh_cache_env(run_dir: Path) -> dict[str, str]:
    """Empty compile caches of this launch's own (its driver's environment, which a local Ray's workers inherit),
    outside the run directory, which `gpu_suite.sh collect` archives."""
    root = Path(tempfile.gettempdir()) / "gpu_step-caches" / run_dir.name
    return {var: str(root / var.lower()) for var in CACHE_VARS}


def machine_cache_dirs(env: Mapping[str, str]) -> dict[str, Path]:
    """Where each of CACHE_VARS points for a launch without caches of its own: the variable where `env` sets it, else
    the library's default (vLLM: $XDG_CACHE_HOME/vllm; Inductor: <tmp>/torchinductor_<user>; Triton:
    $TRITON_HOME/.triton/cache)."""
    home = Path.home()
    defaults = {"VLLM_CACHE_ROOT": Path(env.get("XDG_CACHE_HOME") or home / ".cache") / "vllm",
                "TORCHINDUCTOR_CACHE_DIR": Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}",
                "TRITON_CACHE_DIR": Path(env.get("TRITON_HOME") or home) / ".triton" / "cache"}
    return {var: Path(env[var]) if env.get(var) else defaults[var] for var in CACHE_VARS}


def keep_fresh_caches(run_dir: Path, env: Mapping[str, str] = os.environ) -> list[str]:
    """After a `--fresh-caches` launch: what it compiled, added to the machine's own caches (a file already there
    stays), so that the next launch starts as a user's second launch would. Without it the next one compiles it all
    again: an H100 launch after a fresh one initialised vLLM's engine in 16.9 s, the launch after that in 2.4.
    Returns the variables whose caches were added."""
    def copy_new(src: str, dst: str) -> str:
        if not os.path.exists(dst):
            shutil.copy2(src, dst)
        return dst

    kept = []
    for var, fresh in fresh_cache_env(run_dir).items():
        if Path(fresh).is_dir():
            shutil.copytree(fresh, machine_cache_dirs(env)[var], dirs_exist_ok=True, copy_function=copy_new)
            kept.append(var)
    return kept


def compile_cache(env: Mapping[str, str]) -> str:
    """`warm` where vLLM's torch.compile cache or Triton's cache already holds something, else `cold`. With vLLM's
    compile off (the tuning, one GPU a replica), Triton's is the one a launch fills: vLLM's model runner compiles its
    Triton kernels in its warm-up (~20 s on an empty cache, H200)."""
    dirs = machine_cache_dirs(env)
    caches = (dirs["VLLM_CACHE_ROOT"] / "torch_compile_cache", dirs["TRITON_CACHE_DIR"])
    return "warm" if any(c.is_dir() and any(c.iterdir()) for c in caches) else "cold"


# what vLLM's server says of its own start (vLLM 0.24's log lines): seconds of each part, as vLLM measured them
VLLM_TIMES = {
    "weights_s": r"Loading weights took ([\d.]+) seconds",
    "model_load_s": r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds",
    "dynamo_s": r"Dynamo bytecode transform time: ([\d.]+) s",
    "compile_total_s": r"torch.compile took ([\d.]+) s in total",
    "graph_capture_s": r"Graph capturing finished in ([\d.]+) secs",
    "init_engine_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+)",
}


def vllm_engine_times(log: Path) -> dict[str, list[float]]:
    """Each of VLLM_TIMES in the job's log, one value per server (and per launch of one), in order."""
    import re

    try:
        text = log.read_text(errors="replace")
    except OSError:
        return {}
    found = {name: [float(x) for x in re.findall(pattern, text)] for name, pattern in VLLM_TIMES.items()}
    return {name: values for name, values in found.items() if values}


def startup_record(run_dir: Path) -> dict | None:
    """The launch's startup.json (None if the launch never reached our TaskRunner's first mark), with how much
    of what its processes import had compiled bytecode (rl_factory/backends/verl/bytecode.py: without it, each
    process compiles its imports from source) and the launcher's background inspection of the model for vLLM
    (rl_factory/backends/verl/vllm_model_info.py: whether vLLM's cache had it, when it ended)."""
    path = run_dir / "startup.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    from rl_factory.backends.verl.bytecode import survey

    found = survey()
    record["bytecode"] = {"writes_bytecode": found["writes_bytecode"],
                          "without": {name: f"{p['without_bytecode']}/{p['modules']}"
                                      for name, p in found["packages"].items()}}
    from rl_factory.backends.verl.vllm_model_info import FILE
    from rl_factory.jsonl import read_records

    inspected = read_records(run_dir / FILE, torn_ok=True)  # the process may have been killed mid-line
    if inspected:
        record["vllm_model_info"] = inspected
    engine = vllm_engine_times(run_dir / "bench_stdout.log")
    if engine:
        record["vllm_engine"] = engine
    return record


def main(argv: list[str] | None = None) -> int:
    """The variants, one line each (with --cfg-job: whether each composes with the 0.6B shape)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cfg-job", action="store_true", help="compose each variant's command (no GPU, no Ray)")
    ap.add_argument("--overrides", action="store_true",
                    help="print only the variants' overrides, space-separated (for a script's command line)")
    ap.add_argument("variants", nargs="*", default=list(VARIANTS))
    args = ap.parse_args(argv)
    if args.overrides:
        print(" ".join(o for name in args.variants for o in overrides(name)))
        return 0
    failed = 0
    for name in args.variants:
        variant = VARIANTS.get(name) or sys.exit(f"unknown start-up variant {name!r} (known: {', '.join(VARIANTS)})")
        status = ""
        if args.cfg_job:
            proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_step.py"), "--shape", "qwen3-0.6b",
                                   "--steps", "2", "--cfg-job", "--startup-variant", name], cwd=ROOT,
                                  capture_output=True, text=True, env=dict(os.environ))
            failed |= proc.returncode != 0
            status = "composes; " if proc.returncode == 0 else f"FAILS to compose: {(proc.stderr or proc.stdout)[-1500:]}\n  "
        print(f"{name}: {status}{' '.join(variant.overrides) or '(as it is)'}\n  shortens: {variant.phases}; "
              f"costs: {variant.cost}")
    return int(failed)

if __name__ == "__main__":
    sys.exit(main())
