"""What an agent loop itself costs inside verl, on CPU: our loop against verl's own ToolAgentLoop.

    .venv/bin/python benchmarks/verl_loop_overhead.py --prompts 16 --n 8 --repeats 5
    .venv/bin/python benchmarks/verl_loop_overhead.py --request-ms 20   # each model request takes 20 ms

verl's V1 rollout machinery runs for real (Ray, TransferQueue, AgentLoopManagerTQ and its
AgentLoopWorkerTQ actors, verl's RewardLoopWorker), with the builtin tiny model's tokenizer and chat
template, on the calculator task; only the model is replaced, by a server that answers every trajectory
with the same two turns at once (a calculator call, then an answer), so the measured time is the loops'
own: prompt rendering, tool calls, bookkeeping, reward, and verl's post-processing into TransferQueue.
Our loop calls the MCP calculator server (stdio, one per worker); verl's calls the same arithmetic as a
verl `BaseTool` in-process (benchmarks/verl_tool_agent/), with the same prompt.

Prints one JSON line: for each loop the seconds from `generate_sequences` until every group of the
step is finished in TransferQueue (median and all repeats, after one warm-up step), for ours when the last step's
trajectories began and sent their first requests (`timing`: the spread over all and inside one worker), the CPU
seconds a step cost every process of the run (by process: agent-loop workers, reward workers, TransferQueue, MCP
servers, the driver's polling), and the ratios. `--workers-from prestart` (the default) runs the agent-loop
workers our launcher starts (rl_factory/backends/verl/prestart.py), `verl` verl's own. On a machine with few cores the CPU seconds are the
steadier number: the wall clock of a CPU-bound step swings with whatever else runs. On the
GPU the loops run beside vLLM, where `gpu_suite.sh compare` measures them; this is the part of that
comparison a CPU can check, and where to look when ours is the slower one.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.record import emit  # noqa: E402

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "347 * 29"}}\n</tool_call>'
ANSWER = "The answer is 10063."


class InstantServer:
    """verl's LLM server client: turn k of every trajectory gets SCRIPT[k] (after `delay_s`), distinct log-probs."""

    def __init__(self, tokenizer, delay_s: float = 0.0):
        self.turns: dict[str, int] = {}
        self.delay_s = delay_s
        self.script = [tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id] for t in (CALL, ANSWER)]

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        turn = self.turns.get(request_id, 0)
        self.turns[request_id] = turn + 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        ids = self.script[min(turn, len(self.script) - 1)]
        return TokenOutput(token_ids=ids, log_probs=[-0.001 * (k + 1) for k in range(len(ids))],
                           stop_reason="completed", num_preempted=0, extra_fields={})


def cpu_seconds() -> dict[str, float]:
    """Process name -> CPU seconds (user + system) of this process and every process below it (Linux /proc):
    Ray's workers, TransferQueue's actors and the MCP servers all descend from the driver's local Ray."""
    tick, procs = os.sysconf("SC_CLK_TCK"), {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        procs[int(entry.name)] = (int(stat[1]), cmd, (int(stat[11]) + int(stat[12])) / tick)
    mine, todo = set(), [os.getpid()]
    while todo:
        pid = todo.pop()
        mine.add(pid)
        todo += [child for child, (parent, _, _) in procs.items() if parent == pid and child not in mine]
    out: dict[str, float] = {}
    for pid in mine:
        if pid not in procs:
            continue
        _, cmd, cpu = procs[pid]
        # the driver first: its own command line names the model directory (tiny-calculator-...)
        name = "driver" if pid == os.getpid() else cmd.split()[0] if cmd.startswith("ray::") else \
            "calculator server" if "servers/calculator" in cmd or "servers.calculator" in cmd else \
            Path(cmd.split()[0]).name if cmd else "?"
        out[name] = out.get(name, 0.0) + cpu
    return out


def note(text: str) -> None:
    print(f"verl_loop_overhead: {text}", file=sys.stderr, flush=True)


def compose(loop: str, prompts: int, n: int, work: Path, workers: int, model: str | None = None):
    """verl's config for the calculator job with `loop`, composed the way main_grpo.sh composes it."""
    from omegaconf import OmegaConf

    from benchmarks import verl_tool_agent
    from benchmarks.shapes import builtin_tokenizer_dir
    from rl_factory.backends.verl.config import compose_verl
    from rl_factory.backends.verl.data import convert
    from rl_factory.backends.verl.launcher import absolute
    from rl_factory.config import load_config, parse

    data = work / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {347 + k} * 29?", "answer": str((347 + k) * 29)}) + "\n"
                            for k in range(prompts)))
    ours = absolute(parse(load_config("grpo", ["trainer.backend=verl", f"data.train_files={data}",
                                               f"data.val_files={data}", f"trainer.output_dir={work / loop}",
                                               f"rollout.n={n}", f"data.train_batch_size={prompts}"])))
    raw = verl_tool_agent.overrides(ours.env.max_turns) if loop == "verl_tool_agent" else []
    files = {k: str(v) for k, v in convert(ours.data, work / f"{loop}_data").items()}
    cfg = compose_verl(ours, raw, files, model or str(builtin_tokenizer_dir()))
    OmegaConf.resolve(cfg)
    # CPU-sized: one TransferQueue storage actor; agent-loop and reward workers as many as the cores
    OmegaConf.update(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 1)
    OmegaConf.update(cfg, "actor_rollout_ref.rollout.agent.num_workers", workers)
    OmegaConf.update(cfg, "reward.num_workers", workers)
    return cfg, files


def measure(loop: str, args: argparse.Namespace, work: Path, then=None) -> dict:
    """The loop's steps; `then(keys, cfg)`, if given, runs on the last step's trajectories while TransferQueue
    holds them (cfg: the composed verl config)."""
    import numpy as np
    import ray
    import transfer_queue as tq
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
    from verl.utils.tokenizer import hf_tokenizer

    cfg, files = compose(loop, args.prompts, args.n, work, args.workers, args.model)
    manager_cls = AgentLoopManagerTQ
    if args.workers_from == "prestart":  # as our TaskRunner does, before TransferQueue (prestart.py)
        from rl_factory.backends.verl import prestart

        prestart.start(cfg)
        manager_cls = prestart.PrestartedAgentLoopManager
    tokenizer = hf_tokenizer(cfg.actor_rollout_ref.model.path)
    dataset = RLHFDataset(data_files=files["train"], tokenizer=tokenizer, config=cfg.data)
    rows = collate_fn([dataset[i] for i in range(len(dataset))])
    note(f"{loop}: config composed, starting TransferQueue")
    tq.init(cfg.transfer_queue)
    manager, reward_workers = None, []
    try:
        reward_workers = [ray.remote(RewardLoopWorker).remote(cfg) for _ in range(cfg.reward.num_workers)]
        note(f"{loop}: {len(reward_workers)} reward workers, starting the agent-loop manager")
        manager = manager_cls.create(config=cfg, llm_client=InstantServer(tokenizer, args.request_ms / 1000),
                                     teacher_client=None, reward_loop_worker_handles=reward_workers)
        times, cpu_before = [], {}
        for step in range(1 + args.repeats):  # step 0 warms up: workers import, tool servers start
            if step == 1:
                cpu_before = cpu_seconds()
            uids = [f"s{step}-p{k}" for k in range(args.prompts)]
            batch_dict = dict(rows, uid=np.array(uids, dtype=object))
            batch = tu.get_tensordict(batch_dict)
            tu.assign_non_tensor_data(batch, "global_steps", step + 1)
            tq.kv_batch_put(keys=uids, partition_id="train",
                            tags=[{"is_prompt": True, "status": "pending", "global_steps": step + 1}] * len(uids))
            note(f"{loop}: step {step}")
            t0 = time.perf_counter()
            manager.generate_sequences(batch)
            deadline = time.time() + 300
            while time.time() < deadline:
                listing = tq.kv_list(partition_id="train").get("train", {})
                status = [listing.get(u, {}).get("status") for u in uids]
                if all(s in ("finished", "failure") for s in status):
                    break
                time.sleep(0.005)
            else:
                raise TimeoutError(f"{loop}: step {step} not finished after 300 s: {status}")
            if "failure" in status:
                raise RuntimeError(f"{loop}: {status.count('failure')} groups failed at step {step}")
            if step:
                times.append(time.perf_counter() - t0)
        cpu_after = cpu_seconds()
        keys = sorted(k for k in tq.kv_list(partition_id="train").get("train", {}) if k.startswith(f"s{args.repeats}-") and "_" in k)
        scores = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["rm_scores"])["rm_scores"]
        reward = float(sum(float(s.sum()) for s in scores.unbind(0)) / max(1, len(keys)))
        extra = then(keys, cfg) if then else None
        timing = last_step_timing(Path(cfg.rl_factory.trainer.output_dir), args.repeats + 1) if loop == "rl_factory" \
            else None
    finally:
        tq.close()
        for actor in [*getattr(manager, "agent_loop_workers", []), *reward_workers]:
            ray.kill(actor)  # the next loop's run starts its own
    cpu = {name: round((cpu_after[name] - cpu_before.get(name, 0.0)) / args.repeats, 3) for name in cpu_after}
    cpu = {name: v for name, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if v > 0.001}
    return {"median_s": statistics.median(times), "all_s": [round(t, 3) for t in times],
            "cpu_s_per_step": sum(cpu.values()), "cpu_s_per_step_by_process": cpu,
            "trajectories": len(keys), "reward_mean": reward, **({"then": extra} if then else {}),
            **({"timing": timing} if timing else {})}


def last_step_timing(run: Path, step: int) -> dict[str, float]:
    """Our loop's trajectory timing of `step` (rl_factory/backends/verl/run_dir.py's `trajectory_timing`), from the
    rollouts lines the reward workers wrote: when the trajectories began, in each worker and over all, and when
    their first requests left."""
    from rl_factory.backends.verl.run_dir import gather, trajectory_timing

    return {k.removeprefix("timing/"): round(v, 4) for k, v in trajectory_timing(gather(run, "train", step)).items()}


def parser(description: str, repeats: int, repeats_help: str) -> argparse.ArgumentParser:
    """The arguments every benchmark of a verl rollout step on CPU takes (this one, worker_fetch, old_log_prob_call)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=repeats, help=repeats_help)
    ap.add_argument("--workers", type=int, default=max(1, min(8, os.cpu_count() or 1)),
                    help="agent-loop and reward workers (verl's default on a GPU node is 8)")
    # only its tokenizer and chat template are used (the model is scripted); building the builtin one
    # trains it for minutes on a 2-core machine with an empty cache
    ap.add_argument("--model", default=None, help="a model directory (default: the builtin tiny model, built if missing)")
    ap.add_argument("--request-ms", type=float, default=0.0, help="each model request's simulated duration")
    ap.add_argument("--workers-from", choices=["prestart", "verl"], default="prestart",
                    help="the agent-loop workers our launcher starts (prestart.py, as in a run) or verl's own")
    return ap


def each_loop(tool: str, args: argparse.Namespace, loops: list[str], then=None) -> dict:
    """{loop: measure(loop, ...)} with Ray started for it and stopped after; `then` as measure's."""
    try:
        import ray
    except ImportError:
        sys.exit(f"{tool}: needs verl and ray (bash setup.sh --dev installs the CPU build)")
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the scripted server travels by value
    os.environ["PYTHONPATH"] = f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"  # Ray's workers import benchmarks.*
    ray.init(num_cpus=2 * args.workers + 4, include_dashboard=False, log_to_driver=bool(os.environ.get("RL_FACTORY_BENCH_LOGS")))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return {loop: measure(loop, args, Path(tmp), then) for loop in loops}
    finally:
        ray.shutdown()


def main() -> None:
    ap = parser(__doc__, 5, "measured steps of each loop, after a warm-up step")
    ap.add_argument("--loops", nargs="+", default=["rl_factory", "verl_tool_agent"],
                    choices=["rl_factory", "verl_tool_agent"])
    args = ap.parse_args()
    out = {"bench": "verl_loop_overhead", "prompts": args.prompts, "n": args.n, "request_ms": args.request_ms,
           "workers": args.workers, "workers_from": args.workers_from, "cpu_count": os.cpu_count(),
           **each_loop("verl_loop_overhead", args, args.loops)}
    if "rl_factory" in out and "verl_tool_agent" in out:
        out["ours_vs_verl"] = out["rl_factory"]["median_s"] / out["verl_tool_agent"]["median_s"]
        # what the loops cost the machine, whatever the wall clock's noise: CPU seconds of every process per step
        out["ours_vs_verl_cpu"] = out["rl_factory"]["cpu_s_per_step"] / out["verl_tool_agent"]["cpu_s_per_step"]
    emit("verl_loop_overhead", out)


if __name__ == "__main__":
    main()
