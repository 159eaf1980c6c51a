"""ArenaRL's claim on the embedded default: pointwise judge (grpo) vs pairwise tournaments (arena) vs oracle.

    .venv/bin/python benchmarks/arena_vs_pointwise.py                       # the sweep of config.yaml
    .venv/bin/python benchmarks/arena_vs_pointwise.py --seeds 0 --steps 2 --noise 1.0 \
        --arms pointwise,round_robin --batch 2 --n 4 --val-limit 4          # a smoke run

Every arm trains the calculator task with a graded hidden quality (examples/arena_vs_pointwise/task.py)
on `builtin:tiny-calculator`, same prompts (the seed picks the data order), same steps, against a
stand-in judge server speaking the OpenAI chat API (judge_server.py: true quality squashed into a band
of the 0-10 scale, per-call noise, drift). One invocation runs every arm, seed and noise level, each
run a process of its own (`--parallel` at once), and prints one JSON line: per arm and noise the greedy
policy's true quality at every validation step (mean and 95% bootstrap interval over seeds), the judge
requests per training step, the tournament matches per group against the topology's schedule, and
whether (from which noise on) an arena topology beats the pointwise judge, as a bootstrap interval of
the seed-paired difference that excludes 0, in final quality and in mean quality over training. `--out` keeps every run's record
(runs.json) for examples/arena_vs_pointwise/plot.py.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, fields
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.record import emit  # noqa: E402
from examples.arena_vs_pointwise.experiment import ARMS, Settings, run_arm  # noqa: E402
from examples.arena_vs_pointwise.judge_server import CONFIG, StandInConfig  # noqa: E402

RESAMPLES = 2000
MIN_SEEDS = 3  # paired seeds an arena-vs-pointwise difference needs before it is called significant


def expected_matches(topology: str, n: int) -> int:
    """Judge matches per group of n that the topology's schedule plays (rl_factory/algorithms/arena.py)."""
    rounds = min(n - 1, max(1, math.ceil(math.log2(n))))
    return {"anchor": n - 1, "round_robin": n * (n - 1) // 2, "swiss": rounds * (n // 2),
            "single_elimination": 2 * n - 2, "double_elimination": 2 * n - 2}[topology]


def bootstrap(values: list[float], seed: int = 0) -> list[float]:
    """[mean, low, high]: the mean and its 95% percentile bootstrap interval (resampling the values)."""
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(RESAMPLES))
    return [round(statistics.fmean(values), 4), round(means[int(0.025 * RESAMPLES)], 4),
            round(means[int(0.975 * RESAMPLES) - 1], 4)]


def summarize_arm(runs: list[dict], n: int, groups: int) -> dict:
    """Curves and counts of one arm at one noise level, over its seeds."""
    steps = [step for step, _ in runs[0]["val"]]
    curve = [[step, *bootstrap([r["val"][k][1] for r in runs])] for k, step in enumerate(steps)]
    cumulative = [[sum(r["judge_requests"][:step]) for r in runs] for step in steps]
    out = {"seeds": len(runs), "curve": curve, "final": curve[-1][1:],
           "mean_after_start": bootstrap([statistics.fmean(q for _, q in r["val"][1:]) for r in runs]),
           "judge_requests_at_val": [round(statistics.fmean(c), 1) for c in cumulative],
           "judge_requests_per_step": round(statistics.fmean(x for r in runs for x in r["judge_requests"]), 1),
           "wall_s": round(statistics.fmean(r["wall_s"] for r in runs), 1)}
    arena = [r["arena"] for r in runs if r["arena"].get("judge_calls")]
    if arena:
        calls = [x for a in arena for x in a["judge_calls"]]
        out["matches_per_group"] = round(statistics.fmean(calls) / groups, 3)
        out["expected_matches_per_group"] = expected_matches(runs[0]["arm"], n)
        out["ties_per_step"] = round(statistics.fmean(x for a in arena for x in a["ties"]), 2)
        rhos = [x for a in arena for x in a.get("reward_spearman", []) if x is not None]
        out["spearman_with_quality"] = round(statistics.fmean(rhos), 3) if rhos else None
        requests = [x for a in arena for x in a["judge_requests"]]
        out["server_requests_match_metrics"] = sum(requests) == sum(x for r in runs for x in r["judge_requests"])
    return out


# What an arm is compared on: the greedy quality at the last step, and its mean over the validation steps
# after step 0 (how fast it got there).
MEASURES = {"final": lambda r: r["val"][-1][1],
            "mean_over_training": lambda r: statistics.fmean(q for _, q in r["val"][1:])}


def advantage(by_arm: dict[str, dict[float, list[dict]]], noise: float, arm: str, measure: str) -> dict | None:
    """The seed-paired difference in `measure`, arena arm minus pointwise, with its interval."""
    of = MEASURES[measure]
    mine = {r["seed"]: of(r) for r in by_arm.get(arm, {}).get(noise, [])}
    base = {r["seed"]: of(r) for r in by_arm.get("pointwise", {}).get(noise, [])}
    seeds = sorted(set(mine) & set(base))
    if not seeds:
        return None
    diff = bootstrap([mine[s] - base[s] for s in seeds])
    # Below MIN_SEEDS the interval is no interval (one seed: a point); with 3 it excludes 0 only when
    # every seed's difference is above 0.
    return {"difference": diff[0], "ci": diff[1:], "seeds": len(seeds),
            "significant": diff[1] > 0 if len(seeds) >= MIN_SEEDS else None}


def summarize(results: list[dict], exp: Settings, noises: list[float], arms: list[str]) -> dict:
    by_arm: dict[str, dict[float | None, list[dict]]] = {}
    for r in results:
        by_arm.setdefault(r["arm"], {}).setdefault(r["noise"], []).append(r)
    arms_out = {arm: {("any" if noise is None else f"{noise:g}"): summarize_arm(rs, exp.n, exp.train_batch_size)
                      for noise, rs in sorted(by_noise.items(), key=lambda kv: -1 if kv[0] is None else kv[0])}
                for arm, by_noise in by_arm.items()}
    topologies = [a for a in arms if a not in ("oracle", "pointwise")]
    adv = {m: {f"{noise:g}": {t: advantage(by_arm, noise, t, m) for t in topologies} for noise in noises}
           for m in MEASURES}
    appears = {m: {t: next((float(k) for k, v in adv[m].items() if v[t] and v[t]["significant"]), None)
                   for t in topologies} for m in MEASURES}
    final = {arm: [v["final"][0] for v in arms_out[arm].values()] for arm in arms if arm in arms_out}
    per_step = {arm: next(iter(arms_out[arm].values()))["judge_requests_per_step"] for arm in arms
                if arm in arms_out and arm != "oracle"}
    return {"final_quality": final, "judge_requests_per_step": per_step, "advantage": adv,
            "advantage_appears_at_noise": appears, "arms": arms_out}


def main(argv: list[str] | None = None) -> dict:
    config = yaml.safe_load(CONFIG.read_text())["experiment"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default=",".join(config["arms"]), help=f"comma-separated, of {list(ARMS)}")
    parser.add_argument("--seeds", default=",".join(map(str, config["seeds"])))
    parser.add_argument("--noise", default=",".join(map(str, config["noise"])), help="judge noise levels swept")
    parser.add_argument("--steps", type=int, default=config["steps"])
    parser.add_argument("--batch", type=int, default=config["train_batch_size"], help="prompts per step")
    parser.add_argument("--n", type=int, default=config["n"], help="rollouts per prompt")
    parser.add_argument("--eval-every", type=int, default=config["eval_every"])
    parser.add_argument("--val-limit", type=int, default=config["val_limit"])
    parser.add_argument("--model", default="builtin:tiny-calculator", help="the policy (model.path)")
    parser.add_argument("--parallel", type=int, default=config["parallel"], help="training runs at once")
    parser.add_argument("--finished-only", action="store_true",
                        help="train nothing: summarize the runs under --out finished with these settings")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "arena_vs_pointwise",
                        help="run directories and runs.json")
    args = parser.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"--arms: unknown arm {unknown[0]!r}; valid: {list(ARMS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    noises = [float(x) for x in args.noise.split(",")]
    exp = Settings(steps=args.steps, model=args.model, train_batch_size=args.batch, n=args.n,
                   eval_every=args.eval_every, val_limit=args.val_limit)
    judge = StandInConfig.load(CONFIG)
    # seed by seed, so that a sweep stopped early has every arm and noise level for its first seeds
    jobs = [(arm, None if arm == "oracle" else noise, seed) for seed in seeds
            for arm in arms for noise in ([None] if arm == "oracle" else noises)]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        results = list(pool.map(lambda job: run_arm(*job, exp, judge, args.out, train=not args.finished_only), jobs))
    missing = [f"{arm}-noise{noise}-s{seed}" for (arm, noise, seed), r in zip(jobs, results) if r is None]
    results = [r for r in results if r is not None]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "runs.json").write_text(json.dumps({"settings": asdict(exp), "judge": asdict(judge),
                                                    "noise": noises, "runs": results}, indent=1))
    full = (not missing and arms == config["arms"] and seeds == config["seeds"]
            and noises == [float(x) for x in config["noise"]]
            and args.steps == config["steps"] and args.model == "builtin:tiny-calculator"
            and args.batch == config["train_batch_size"] and args.n == config["n"])
    return {"task": "calculator, graded quality", "model": args.model, "full_sweep": full,
            "arms_run": arms, "seeds": seeds, "n_seeds": len(seeds), "noise": noises, "steps": args.steps,
            "batch": [args.batch, args.n], "val_rows": args.val_limit,
            "judge": {f.name: getattr(judge, f.name) for f in fields(judge) if f.name not in ("noise", "seed")},
            "runs": len(results), "runs_missing": missing, "wall_s": round(time.perf_counter() - started, 1),
            **summarize(results, exp, noises, arms)}


if __name__ == "__main__":
    emit("arena_vs_pointwise", main())
