"""The default verl job on several GPUs, checked from outside: ArenaRL groups, stdio servers, resume.

    python benchmarks/two_gpu_checks.py --advantage arena --kill-after-checkpoint   # all three, two launches
    python benchmarks/two_gpu_checks.py --advantage arena                           # arena + servers, one launch
    python benchmarks/two_gpu_checks.py --advantage grpo --kill-after-checkpoint    # resume of the default job
    python benchmarks/two_gpu_checks.py --cfg-job ...                               # compose only (CPU)

It runs `bash main_grpo.sh trainer.backend=verl trainer.n_gpus_per_node=N` on the builtin model (built
here first) with checkpoints every `--save-every` steps, the calculator manifest copied with a marker
variable in the server's environment, vLLM eager (these are checks, not timings: no compile or CUDA
graphs at start-up) and, every half second while it runs, a look at /proc for the marked servers.

- servers: each agent-loop worker (`rollout.agent.num_workers` of them) runs its own calculator server
  (one per parent process, the parents being verl's AgentLoopWorker actors), and none is alive 20 s
  after a launch ended or was killed; nor is any process of the launch's session, nor a GPU process.
- resume (`--kill-after-checkpoint`): the launch is killed (SIGKILL to its process group) as soon as its
  first checkpoint is written, then started again with the same arguments; metrics.jsonl must hold steps
  0..total once each, and the second launch's first trained step is the checkpoint's + 1.
- arena (`--advantage arena`): for every trained step, the rankings.csv files of all agent-loop workers
  (`<run>/arena/<host>-<pid>/`, one per worker process and launch) hold each of the step's
  `data.train_batch_size` groups exactly once, complete: every rollout 0..n-1 in one worker's file, and
  n-1 matches each under the default round robin.

Prints one JSON line (`bench: two_gpu_checks`) with each check's findings and `ok`; exit 0 only if ok.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.record import emit  # noqa: E402
from benchmarks.gpu_memory import LEFTOVER_WAIT_S, gpu_processes, wait_gone  # noqa: E402
from benchmarks.job_config import select  # noqa: E402
from benchmarks.stamp import stamp_lines  # noqa: E402
from rl_factory.jsonl import read_lines  # noqa: E402

SERVER_MODULE = "envs.servers.calculator"
MARK_VAR = "RLF_RUN_MARK"
GPU_FREE_WAIT_S = 60


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--advantage", default="arena", help="algorithm.advantage (arena checks the rankings)")
    ap.add_argument("--kill-after-checkpoint", action="store_true", help="the resume check: kill, start again")
    ap.add_argument("--steps", type=int, default=4, help="trainer.total_steps")
    ap.add_argument("--save-every", type=int, default=2, help="trainer.save_every (the first checkpoint)")
    ap.add_argument("--no-eager", action="store_true", help="let vLLM compile and capture CUDA graphs")
    ap.add_argument("--timeout", type=float, default=540, help="seconds for everything (launches are killed then)")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "two_gpu_checks")
    ap.add_argument("--model", help="model directory (default: the builtin model, built here first)")
    ap.add_argument("--cfg-job", action="store_true", help="compose the job only (main_grpo.sh --cfg job)")
    ap.add_argument("--job-command", help=argparse.SUPPRESS)  # tests: a stand-in for `bash main_grpo.sh`
    ap.add_argument("overrides", nargs="*", help="more main_grpo.sh overrides")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.kill_after_checkpoint and not 0 < args.save_every < args.steps:
        ap.error(f"--save-every {args.save_every} must be below --steps {args.steps}: the job is killed after its "
                 "first checkpoint and must have steps left to resume")
    return args


def manifest(out: Path, marker: str) -> Path:
    """configs/tools/calculator.yaml's server, with the marker in its environment."""
    path = out / "tools.yaml"
    path.write_text(json.dumps({"mcpServers": {"calculator": {
        "command": "python", "args": ["-m", SERVER_MODULE], "timeout_s": 10, "max_concurrency": 64,
        "env": {MARK_VAR: marker}}}}))
    return path


def job_overrides(args: argparse.Namespace, model: str, run_dir: Path, tools: Path) -> list[str]:
    out = [f"model.path={model}", "trainer.backend=verl", f"trainer.n_gpus_per_node={args.gpus}",
           f"trainer.output_dir={run_dir}", f"trainer.total_steps={args.steps}", f"trainer.save_every={args.save_every}",
           f"env.tools={tools}", f"algorithm.advantage={args.advantage}", "trainer.logger=[console,jsonl]",
           "+ray_kwargs.ray_init.include_dashboard=false",
           f"+ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH={ROOT}:{os.environ.get('PYTHONPATH', '')}"]
    if not args.no_eager:
        out.append("actor_rollout_ref.rollout.enforce_eager=true")
    return out + list(args.overrides)


# ---- looking at processes ---------------------------------------------------------------------------

def _read(path: str, binary: bool = False):
    with open(path, "rb" if binary else "r") as f:
        return f.read()


def _stat(pid: str) -> list[str]:
    """Fields of /proc/PID/stat after the command name: [state, ppid, pgrp, session, ...]."""
    return _read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()


def marked_servers(marker: str, proc: str = "/proc") -> dict[int, dict]:
    """pid -> {ppid, parent}: the live calculator servers started with the marker (parent: its argv[0])."""
    found = {}
    for pid in filter(str.isdigit, os.listdir(proc)):
        try:
            if SERVER_MODULE.encode() not in _read(f"{proc}/{pid}/cmdline", True):
                continue
            if f"{MARK_VAR}={marker}".encode() not in _read(f"{proc}/{pid}/environ", True):
                continue
            ppid = int(_stat(pid)[1])
            # argv[0]: Ray titles an actor's process "ray::<ActorClass>[.<method>]"
            parent = _read(f"{proc}/{ppid}/cmdline", True).split(b"\0")[0].decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        found[int(pid)] = {"ppid": ppid, "parent": parent[:80]}
    return found


def session_processes(sid: int) -> list[int]:
    """Live processes of session `sid` (a launch is started as its own session)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(_stat(pid)[3]) == sid and _stat(pid)[0] != "Z":
                out.append(int(pid))
        except (OSError, IndexError, ValueError):
            continue
    return out


# ---- one launch ---------------------------------------------------------------------------------------

def launch(command: list[str], out: Path, run_dir: Path, marker: str, name: str, deadline: float,
           kill_after_checkpoint: bool) -> dict:
    """Run the job once (its own session), sample the servers, maybe kill it after its first checkpoint."""
    log = out / f"{name}.log"
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}")
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    writer = threading.Thread(target=stamp_lines, args=(proc.stdout, log, t0), daemon=True)
    writer.start()
    marker_file = run_dir / "checkpoints" / "latest_checkpointed_iteration.txt"
    seen: dict[int, dict] = {}
    result: dict = {"name": name, "killed_after_checkpoint": None, "timed_out": False}
    while proc.poll() is None:
        for pid, info in marked_servers(marker).items():
            seen.setdefault(pid, info)
        if kill_after_checkpoint and marker_file.exists() and marker_file.read_text().strip().isdigit():
            result["killed_after_checkpoint"] = int(marker_file.read_text().strip())
            result["metrics_at_kill"] = read_metrics(run_dir)
            os.killpg(proc.pid, signal.SIGKILL)
            break
        if time.time() > deadline:
            result["timed_out"] = True
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.5)
    code = proc.wait()
    writer.join(timeout=10)
    result.update(exit_code=code, wall_s=round(time.perf_counter() - t0, 1), servers_seen=seen)
    result["left"] = {
        "servers": sorted(wait_gone(lambda: marked_servers(marker), LEFTOVER_WAIT_S)),
        "session": wait_gone(lambda: session_processes(proc.pid), LEFTOVER_WAIT_S),
        "gpu": wait_gone(gpu_processes, GPU_FREE_WAIT_S),
    }
    for pid in result["left"]["gpu"] + result["left"]["session"]:  # a leftover must not spoil the next launch
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return result


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    out = []
    for text in read_lines(path):
        try:
            out.append(json.loads(text))
        except ValueError:
            out.append({"torn_line": text[:80]})
    return out


# ---- the checks (pure: tested on made-up run directories) -----------------------------------------------

def servers_check(launches: list[dict], workers: int) -> dict:
    """One server per agent-loop worker in each launch, and nothing left after any launch."""
    out = {"workers": workers, "launches": []}
    ok = True
    for run in launches:
        parents = defaultdict(set)
        for pid, info in run["servers_seen"].items():
            parents[info["ppid"]].add(info["parent"])
        names = sorted({p for ps in parents.values() for p in ps})
        this = {"servers_seen": len(run["servers_seen"]), "parent_processes": len(parents), "parent_names": names[:4],
                "left_servers": run["left"]["servers"], "left_session_processes": run["left"]["session"],
                "left_gpu_processes": run["left"]["gpu"]}
        this["ok"] = (len(parents) == workers and all("AgentLoopWorker" in n for n in names)
                      and not run["left"]["servers"] and not run["left"]["session"] and not run["left"]["gpu"])
        ok &= this["ok"]
        out["launches"].append(this)
    out["ok"] = ok
    return out


def _train_steps(lines: list[dict]) -> list[int]:
    """Steps that trained (verl logs its timing with them), in file order; validation-only lines are not."""
    return [m["step"] for m in lines if isinstance(m.get("step"), int) and m["step"] > 0
            and any(k.startswith("timing/") or k in ("reward/mean", "training/global_step") for k in m)]


def resume_check(at_kill: list[dict], final: list[dict], checkpoint: int | None, total_steps: int) -> dict:
    """metrics.jsonl after the restart: steps 0..total once each, and the restart began after the checkpoint."""
    steps = [m.get("step") for m in final]
    before = set(_train_steps(at_kill))
    after_restart = [s for s in _train_steps(final) if checkpoint is not None and s > checkpoint]
    out = {"checkpoint_step": checkpoint, "steps_at_kill": sorted(s for s in before), "steps": steps,
           "duplicates": sorted({s for s in steps if steps.count(s) > 1}),
           "missing": sorted(set(range(total_steps + 1)) - set(steps)),
           "torn_lines": sum("torn_line" in m for m in final),
           "first_step_after_restart": min(after_restart) if after_restart else None}
    out["ok"] = (checkpoint is not None and not out["duplicates"] and not out["missing"] and not out["torn_lines"]
                 and out["first_step_after_restart"] == checkpoint + 1 and steps == sorted(steps))
    return out


def arena_check(run_dir: Path, steps: list[int], groups_per_step: int, n: int, topology: str) -> dict:
    """Every trained step's groups exactly once across the workers' rankings.csv files, each complete."""
    rows: dict[tuple[int, str], list[tuple[str, dict]]] = defaultdict(list)
    files = sorted((run_dir / "arena").glob("*/rankings.csv"))
    for path in files:
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                rows[(int(row["step"]), row["group"])].append((path.parent.name, row))
    per_step = defaultdict(int)
    problems = []
    for (step, group), found in sorted(rows.items()):
        per_step[step] += 1
        workers = {w for w, _ in found}
        rollouts = sorted(int(r["rollout"]) for _, r in found)
        if len(workers) != 1:
            problems.append(f"step {step} group {group}: in {len(workers)} workers' files")
        if rollouts != list(range(n)):
            problems.append(f"step {step} group {group}: rollouts {rollouts} (want 0..{n - 1} once each)")
        if topology == "round_robin" and any(int(r["matches"]) != n - 1 for _, r in found):
            problems.append(f"step {step} group {group}: not every rollout played all {n - 1} others")
    for step in steps:
        if per_step.get(step, 0) != groups_per_step:
            problems.append(f"step {step}: {per_step.get(step, 0)} groups ranked, want {groups_per_step}")
    extra = sorted(set(per_step) - set(steps))
    if extra:
        problems.append(f"rankings of steps that did not train: {extra}")
    return {"files": len(files), "workers_with_rankings": len({p.parent.name for p in files}),
            "groups_per_step": dict(sorted(per_step.items())), "problems": problems[:20], "ok": not problems and bool(files)}


# ---- main -----------------------------------------------------------------------------------------------

def cfg_job(args: argparse.Namespace, overrides: list[str]) -> dict:
    proc = subprocess.run(["bash", str(ROOT / "main_grpo.sh"), *overrides, "--cfg", "job"], cwd=ROOT,
                          capture_output=True, text=True)
    out = {"bench": "two_gpu_checks_cfg_job", "exit_code": proc.returncode, "command": ["bash", "main_grpo.sh", *overrides]}
    if proc.returncode != 0:
        return {**out, "error": proc.stderr[-1500:]}
    import yaml

    cfg = yaml.safe_load(proc.stdout)
    return {**out, "n_gpus_per_node": select(cfg, "trainer.n_gpus_per_node"),
            "adv_estimator": select(cfg, "algorithm.adv_estimator"), "save_freq": select(cfg, "trainer.save_freq"),
            "resume_mode": select(cfg, "trainer.resume_mode"),
            "enforce_eager": select(cfg, "actor_rollout_ref.rollout.enforce_eager"),
            "agent_loop_workers": select(cfg, "actor_rollout_ref.rollout.agent.num_workers")}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    marker = f"two-gpu-{os.getpid()}-{time.time_ns()}"
    tools = manifest(args.out, marker)
    run_dir = args.out / "run"
    if args.cfg_job:
        result = cfg_job(args, job_overrides(args, args.model or "builtin:tiny-calculator", run_dir, tools))
        print(json.dumps(result))
        return 0 if result["exit_code"] == 0 else 1
    deadline = time.time() + args.timeout
    if args.model:
        model = args.model
    else:
        from benchmarks.shapes import builtin_tokenizer_dir

        model = str(builtin_tokenizer_dir())  # built once, before the clock of the launches matters
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)  # a fresh run: the first launch must not resume
    job = args.job_command.split() if args.job_command else ["bash", str(ROOT / "main_grpo.sh")]
    command = [*job, *job_overrides(args, model, run_dir, tools)]
    launches = [launch(command, args.out, run_dir, marker, "launch1", deadline, args.kill_after_checkpoint)]
    if args.kill_after_checkpoint and launches[0]["killed_after_checkpoint"] is not None:
        launches.append(launch(command, args.out, run_dir, marker, "launch2", deadline, False))  # the same arguments
    import yaml

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").exists() else {}
    final = read_metrics(run_dir)
    result = {"bench": "two_gpu_checks", "gpus": args.gpus, "advantage": args.advantage, "steps": args.steps,
              "command": command,
              "launches": [{k: v for k, v in r.items() if k not in ("servers_seen", "metrics_at_kill")} for r in launches],
              "servers": servers_check(launches, int(select(cfg, "actor_rollout_ref.rollout.agent.num_workers", 0) or 0))}
    checks = [result["servers"]["ok"]]
    finished = launches[-1]["exit_code"] == 0 and not launches[-1]["timed_out"]
    result["finished"] = finished
    if args.kill_after_checkpoint:
        result["resume"] = resume_check(launches[0].get("metrics_at_kill", []), final,
                                        launches[0]["killed_after_checkpoint"], args.steps)
        checks.append(result["resume"]["ok"])
    if args.advantage == "arena":
        result["arena"] = arena_check(run_dir, sorted(set(_train_steps(final))),
                                      int(select(cfg, "data.train_batch_size", 0) or 0),
                                      int(select(cfg, "actor_rollout_ref.rollout.n", 0) or 0),
                                      str(select(cfg, "rl_factory.algorithm.arena.topology", "round_robin")))
        checks.append(result["arena"]["ok"])
    result["ok"] = finished and all(checks)
    emit("two_gpu_checks", result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
