"""The benchmarks page, generated from the records in benchmarks/results/*.jsonl (benchmarks/record.py).

One table per benchmark: for each command (and machine), its newest record; each row says its command,
machine, commit and date. Older records stay in the files and in git; the page shows the current numbers.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from docsgen import gpu_targets, trl_shapes
from docsgen.records import fmt, get, load, machine_text  # noqa: F401 - load: the page's records, for its callers

# The columns each benchmark's table shows: (header, dotted path into the record). A benchmark without an
# entry shows its top-level numbers.
COLUMNS: dict[str, list[tuple[str, str]]] = {
    "tool_calls": [("in flight", "in_flight"), ("transport", "transport"), ("throughput vs ideal", "throughput_vs_ideal"),
                   ("calls/s", "calls_per_s"), ("p50 / p99 overhead ms", "overhead_p50_ms,overhead_p99_ms"),
                   ("net p50 ms", "net_overhead_p50_ms"), ("burst wall s (ideal: latency)", "burst_wall_s_median"),
                   ("sequential p50 ms", "sequential_overhead_p50_ms"), ("failed", "failed_calls")],
    "rollout": [("engine", "engine"), ("lockstep s", "lockstep_s"), ("async s", "async_s"), ("ideal s", "ideal_s"),
                ("speedup vs lockstep", "speedup_vs_lockstep"), ("ratio to ideal", "ratio_to_ideal")],
    "async_training": [("steps x prompts x n", "steps,batch,n"), ("tool +ms", "tool_latency_ms"),
                       ("slow tools s/step k=0 / 1 / 2", "cpu_slow_tools.k0.mean_step_s,cpu_slow_tools.k1.mean_step_s,"
                        "cpu_slow_tools.k2.mean_step_s"),
                       ("speedup k=1 / 2", "cpu_slow_tools.k1.speedup,cpu_slow_tools.k2.speedup"),
                       ("val accuracy k=0 / 1 / 2", "cpu_slow_tools.k0.val_accuracy_mean,"
                        "cpu_slow_tools.k1.val_accuracy_mean,cpu_slow_tools.k2.val_accuracy_mean"),
                       ("k=0 accuracy spread", "cpu_slow_tools.accuracy_spread_k0"),
                       ("fast tools s/step k=0 / 1", "cpu_fast_tools.k0.mean_step_s,cpu_fast_tools.k1.mean_step_s"),
                       ("fast tools speedup", "cpu_fast_tools.k1.speedup"), ("H200", "h200.skipped,h200.gpu"),
                       ("GPU tiny s/step k=0 / 1", "h200.tiny.k0.mean_step_s,h200.tiny.k1.mean_step_s"),
                       ("GPU tiny speedup", "h200.tiny.speedup"),
                       ("GPU 0.6B s/step k=0 / 1", "h200.qwen3-0_6b.k0.mean_step_s,h200.qwen3-0_6b.k1.mean_step_s"),
                       ("GPU 0.6B speedup", "h200.qwen3-0_6b.speedup")],
    "vs_trl": [("shape", "shape"), ("device", "device"), ("seed", "job.seed"), ("steps", "steps"), ("ours s/step", "ours.s_per_step"),
               ("ours spread", "ours.spread"), ("TRL s/step", "trl.s_per_step"), ("TRL spread", "trl.spread"),
               ("ours / TRL", "ours_vs_trl_step_time"), ("val accuracy ours / TRL", "ours.val_accuracy,trl.val_accuracy"),
               ("work spread (repeats)", "ours_repeats.work_spread"), ("TRL median s", "trl.median_s"),
               ("TRL peak GPU used GiB", "trl.memory_gb.device_peak_used")],
    "packing": [("device", "device"), ("batch", "batch.groups,batch.n"), ("forward tokens plain / packed",
                "forward_tokens.plain,forward_tokens.packed"), ("update plain / packed s", "plain_s,packed_s"),
                ("speedup", "speedup"), ("gradient apart", "grad_max_diff")],
    "episodes": [("open + close p50 ms: handle / session / process / pool",
                  "open_close_ms.handle.p50,open_close_ms.session.p50,open_close_ms.process.p50,open_close_ms.pool.p50"),
                 ("rollout s shared / pooled", "rollout_s.shared,rollout_s.pooled"), ("overhead", "overhead"),
                 ("target", "target")],
    "sandbox": [("calls", "calls"), ("p50 ms: bare / process / bwrap / unshare",
                 "engines.bare.p50_ms,engines.process.p50_ms,engines.namespaces_bwrap.p50_ms,"
                 "engines.namespaces_unshare.p50_ms"),
                ("CPU ms a call: bare / process / bwrap / unshare",
                 "engines.bare.cpu_p50_ms,engines.process.cpu_p50_ms,engines.namespaces_bwrap.cpu_p50_ms,"
                 "engines.namespaces_unshare.cpu_p50_ms")],
    "parsers": [("text chars", "text_chars"), ("worst s: hermes / qwen3_xml", "worst_s.hermes,worst_s.qwen3_xml")],
    "manifest_load": [("s: alias bomb / 500k nested / 9,000 servers",
                       "files.aliases.best_s,files.nesting.best_s,files.servers.best_s"), ("worst s", "worst_s")],
    "guard": [("steps", "steps"), ("step s off / on", "off_step_s,on_step_s"), ("on / off", "on_vs_off"),
              ("guard s a step", "guard_s"), ("guard share of step (target 0.02)", "guard_share"),
              ("violations", "guard_violations")],
    "arena_vs_pointwise": [("full sweep", "full_sweep"), ("noise swept", "noise"), ("seeds x steps", "n_seeds,steps"),
                           ("prompts x rollouts", "batch"),
                           ("final greedy quality per arm (one per noise)", "final_quality"),
                           ("judge requests per step", "judge_requests_per_step"),
                           ("arena beats pointwise from noise: final / mean over training",
                            "advantage_appears_at_noise.final,advantage_appears_at_noise.mean_over_training"), ("wall s", "wall_s")],
    "arena_vllm_judge": [("steps", "steps"), ("judge calls a step", "per_step.arena/judge_calls"),
                         ("judge requests a step", "per_step.arena/judge_requests"),
                         ("judge failures", "per_step.arena/judge_failures"), ("tie share", "tie_share"),
                         ("requests vLLM served", "judge_served_requests"), ("step s", "per_step.timing/step_s"),
                         ("guard violations", "guard_violations"),
                         ("vLLM syncs a step", "per_step.guard/receipts/engine_syncs"),
                         ("syncs that did not land", "per_step.guard/receipts/engine_unlanded"),
                         ("launch to first step s", "launch_to_first_step_s")],
    "first_task": [("fresh cache", "fresh_cache"), ("model prep s", "model_prep_s"),
                   ("first step since scaffold s", "first_step_since_scaffold_s"), ("3 steps s", "three_steps_s"),
                   ("doctor s", "doctor_s")],
    "soak": [("trajectories x turns", "trajectories,turns"), ("lost", "lost_trajectories"), ("tool calls", "tool_calls"),
             ("tool errors", "tool_errors"), ("reward errors", "reward_errors"), ("wall s", "wall_s"),
             ("fds growth", "fds_growth"), ("processes growth", "processes_growth"), ("RSS MiB", "rss_mib")],
    "gpu_step": [("model", "model"), ("old log-probs", "phases.old_log_prob.mode"), ("launches", "launches"),
                 ("step s", "step_s"),
                 ("generation s", "phases.generate.s"), ("vLLM log-probs", "phases.generate.sampling_logprobs"),
                 ("agent loops' span s", "phases.generate.trajectories_span_s"),
                 ("old log-probs s", "phases.old_log_prob.s"),
                 ("update s", "phases.update.s"), ("weight sync s", "phases.weight_sync.s|phases.update_weights.s"),
                 ("serial limit s", "ratio_to_ceiling.serial_limit_s"),
                 ("step / serial limit (target 1.6)", "ratio_to_ceiling.step_vs_serial_limit"),
                 ("generation vs vLLM at its fastest, same work (target 0.85)", "ratio_to_ceiling.generate_vs_vllm"),
                 ("generation vs vLLM with log-probs", "ratio_to_ceiling.generate_vs_vllm_with_logprobs"),
                 ("generation vs vLLM as configured", "ratio_to_ceiling.generate_vs_vllm_configured"),
                 ("old log-probs vs forward", "ratio_to_ceiling.old_log_prob_vs_forward"),
                 ("update vs forward+backward (target 0.7)", "ratio_to_ceiling.update_vs_forward_backward"),
                 ("peak GPU used GiB", "memory_gb.device_peak_used"), ("start-up variant", "startup_variant"),
                 ("launch to first step s", "startup.launch_to_first_step_s")],
    "ab": [("shape", "shape"), ("B's overrides", "overrides"), ("order", "order"),
           ("step s A / B", "a.step_s,b.step_s"), ("step B / A", "b_over_a.step_s"),
           ("generation B / A", "b_over_a.generate"), ("update B / A", "b_over_a.update"),
           ("weight sync s A / B", "a.update_weights,b.update_weights"), ("weight sync B / A", "b_over_a.update_weights"),
           ("peak GPU used GiB A / B", "a.memory_gb.device_peak_used,b.memory_gb.device_peak_used")],
    "trace": [("update s / GPU busy", "windows.actor_update.wall_s,windows.actor_update.gpu_busy_share"),
              ("weight sync s / GPU busy", "windows.update_weights.wall_s,windows.update_weights.gpu_busy_share"),
              ("update: kernel s by launcher", "windows.actor_update.kernel_s_by_launcher"),
              ("update: GPU idle s by host part", "windows.actor_update.gpu_idle_s.by_part"),
              ("optimizer step s", "windows.optimizer_step.wall_s"), ("empty_cache s", "windows.empty_cache.wall_s"),
              ("whole trace s / GPU busy", "windows.trace.wall_s,windows.trace.gpu_busy_share")],
    "compare_loops": [("model", "model"), ("ours step s", "rl_factory.step_s"), ("verl's step s", "verl_tool_agent.step_s"),
                      ("ours / verl's", "step_ratio"), ("target", "target"), ("met", "met"),
                      ("tokens per step ratio", "tokens_per_step_ratio")],
    "worker_fetch": [("prompts x n", "prompts,n"),
                     ("our loop, every field: fields / fetch ms / split ms",
                      "rl_factory.all.num_fields,rl_factory.all.fetch_ms_median,rl_factory.all.split_ms_median"),
                     ("our loop, the fields read", "rl_factory.needed.num_fields,rl_factory.needed.fetch_ms_median,"
                      "rl_factory.needed.split_ms_median"),
                     ("verl's loop, every field", "verl_tool_agent.all.num_fields,verl_tool_agent.all.fetch_ms_median,"
                      "verl_tool_agent.all.split_ms_median"),
                     ("verl's loop, the fields read", "verl_tool_agent.needed.num_fields,"
                      "verl_tool_agent.needed.fetch_ms_median,verl_tool_agent.needed.split_ms_median")],
    "old_log_prob_call": [("prompts x n", "prompts,n"),
                          ("call ms: every field / UNREAD / needed", "all.call_ms,common_unread.call_ms,needed.call_ms"),
                          ("trainer put ms", "all.trainer_put_ms,common_unread.trainer_put_ms,needed.trainer_put_ms"),
                          ("worker fetch ms", "all.worker_fetch_ms,common_unread.worker_fetch_ms,needed.worker_fetch_ms")],
    "verl_loop_overhead": [("prompts x n", "prompts,n"), ("ours step s", "rl_factory.median_s"),
                           ("verl's step s", "verl_tool_agent.median_s"), ("ours / verl's", "ours_vs_verl"),
                           ("CPU s per step ours / verl's", "rl_factory.cpu_s_per_step,verl_tool_agent.cpu_s_per_step"),
                           ("CPU ratio", "ours_vs_verl_cpu")],
    "ceiling_variants": [("requests", "requests"),
                         ("configured s, with / without log-probs",
                          "runs.configured.seconds,runs.configured.without_logprobs_seconds"),
                         ("each variant / configured, with log-probs", "over_configured"),
                         ("without log-probs", "over_configured_without_logprobs")],
    "fused_logprob": [("tokens x hidden x vocab", "tokens,hidden,vocab"),
                      ("torch fwd / fwd+bwd s", "torch.forward_s,torch.forward_backward_s"),
                      ("triton fwd / fwd+bwd s", "triton.forward_s,triton.forward_backward_s"),
                      ("plain fwd / fwd+bwd s", "plain.forward_s,plain.forward_backward_s")],
    "update_variants": [("shape / tokens / checkpointing", "shape,tokens,checkpointing"),
                        ("AdamW / micro-batch tokens: fwd+bwd s, step s, peaks GiB", "variants")],
}

INTRO = """# Benchmarks

Generated from the records in `benchmarks/results/` when the site is built. Every script in `benchmarks/`
prints one JSON line and appends it, with the machine, the commit, the date and the command, to
`benchmarks/results/<benchmark>.jsonl` (`benchmarks/record.py`). Each table shows, for every command and
machine, the newest record; older records stay in the files and in git. `load` is the 1-minute load average
when the record was written (the machines are shared: compare rows of one load). Records moved over from
earlier hand-written tables name their source. What each field means: the script's docstring and
`benchmarks/README.md`.
"""


def current(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest record of each (command, machine), in the order those first appear."""
    newest: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        key = (r.get("command", ""), machine_text(r.get("machine", {})))
        if key not in newest or str(r.get("date", "")) >= str(newest[key].get("date", "")):
            newest[key] = r
    return list(newest.values())


def cell(record: dict[str, Any], paths: str) -> str:
    values = [get(record, p) for p in paths.split(",")]
    if all(v is None for v in values):
        return ""
    return " / ".join(fmt(v) for v in values).replace("|", "\\|")


def load_text(record: dict[str, Any]) -> str:
    value = get(record, "machine.loadavg_1m")
    if value is None:
        value = record.get("loadavg_1m")
    return fmt(value)


def columns(name: str, records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    if name in COLUMNS:
        return COLUMNS[name]
    skip = {"date", "commit", "command", "machine", "benchmark", "bench", "source", "loadavg_1m", "cpu_count", "cpus"}
    keys: list[str] = []
    for r in records:
        for k, v in r.items():
            if k not in skip and k not in keys and isinstance(v, (int, float)) and not isinstance(v, bool):
                keys.append(k)
    return [(k, k) for k in keys[:8]]


def table(name: str, records: list[dict[str, Any]]) -> list[str]:
    rows = current(records)
    cols = columns(name, rows)
    out = [f"## {name}", ""]
    script = Path("benchmarks") / f"{name}.py"
    if not script.exists() and rows:  # a benchmark run by another script (an example's): the one its command names
        words = [w for w in rows[-1].get("command", "").split() if "=" not in w or "/" in w.split("=", 1)[0]]
        script = next((Path(w) for w in words if w.endswith((".py", ".sh")) and "/" in w), script)
    out += [f"Script: `{script}`. {len(records)} record(s) in `benchmarks/results/{name}.jsonl`.", ""]
    head = ["command", *(h for h, _ in cols), "machine", "load", "commit", "date"]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        command = str(r.get("command", "")).replace("|", "\\|")
        date = str(r.get("date", ""))[:16].replace("T", " ")
        commit = str(r.get("commit", ""))
        # a record moved over from a hand-written table: "<file> at <commit>"
        source = f" (from {str(r['source']).rsplit(' at ', 1)[0]})" if r.get("source") else ""
        values = [f"`{command}`", *(cell(r, p) for _, p in cols), machine_text(r.get("machine", {})),
                  load_text(r), f"`{commit}`{source}", date]
        out.append("| " + " | ".join(values) + " |")
    notes = [r for r in rows if r.get("note")]
    if notes:
        out.append("")
        out += [f"- `{r.get('command', '')}`: {r['note']}" for r in notes]
    return out + [""]


def render(root: Path) -> str:
    records = load(root / "benchmarks" / "results")
    out = [INTRO, *gpu_targets.table(records), *trl_shapes.table(records)]
    if not records:
        out.append("No records yet: run a script in `benchmarks/`.")
    for name in sorted(records):
        out += table(name, records[name])
    return "\n".join(out).rstrip() + "\n"
