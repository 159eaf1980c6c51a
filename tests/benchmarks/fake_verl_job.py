"""A stand-in for `bash main_grpo.sh trainer.backend=verl ...` in tests of benchmarks/two_gpu_checks.py.

What the checker looks at, done the way the real job does it: two "agent-loop workers" (processes titled
ray::AgentLoopWorkerTQ, in the job's session) each start the manifest's calculator server in its own
session with a stdin pipe; one metrics.jsonl line per step; arena rows per worker; a checkpoint marker
every trainer.save_every steps; a restarted job continues after the marker. FAKE_WAIT_FOR_KILL=1: a
first (not resumed) job waits after its first checkpoint, where the checker kills it. FAKE_LEAK=1: one worker also starts a
"server" that ignores its stdin closing, which the checker must report.
"""
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def worker(manifest: str, index: str, python: str) -> None:
    spec = json.loads(Path(manifest).read_text())["mcpServers"]["calculator"]
    env = {**os.environ, **spec["env"]}
    server = subprocess.Popen([python, *spec["args"]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env=env, start_new_session=True)
    if os.environ.get("FAKE_LEAK") == "1" and index == "0":
        subprocess.Popen([python, "-c", "import time; time.sleep(60)", spec["args"][1]], env=env,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    sys.stdin.read()  # until the job ends (or is killed with it)
    server.stdin.close()
    server.wait()


def main() -> None:
    args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a and not a.startswith("+"))
    run = Path(args["trainer.output_dir"])
    total, every = int(args["trainer.total_steps"]), int(args["trainer.save_every"])
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text(json.dumps({
        "actor_rollout_ref": {"rollout": {"agent": {"num_workers": 2}, "n": 3}}, "data": {"train_batch_size": 2},
        "rl_factory": {"algorithm": {"arena": {"topology": "round_robin"}}}}))
    marker = run / "checkpoints" / "latest_checkpointed_iteration.txt"
    resumed = int(marker.read_text()) if marker.exists() else 0
    title = f'exec -a ray::AgentLoopWorkerTQ "{sys.executable}" "{__file__}" --worker {args["env.tools"]}'
    workers = [subprocess.Popen(["bash", "-c", f'{title} {i} "{sys.executable}"'], stdin=subprocess.PIPE)
               for i in range(2)]
    time.sleep(2)  # the servers start (the checker samples every half second)
    rankings = run / "arena" / f"host-{os.getpid()}" / "rankings.csv"
    rankings.parent.mkdir(parents=True, exist_ok=True)
    with (run / "metrics.jsonl").open("a") as metrics, rankings.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "group", "prompt", "rollout", "matches", "wins", "losses", "rank", "score"])
        if not resumed:
            metrics.write(json.dumps({"step": 0, "val/accuracy": 0.0}) + "\n")
        for step in range(resumed + 1, total + 1):
            for group in range(2):
                writer.writerows([step, f"uid{step}-{group}", group, r, 2, 1, 1, r + 1, 0.5] for r in range(3))
            f.flush()
            metrics.write(json.dumps({"step": step, "timing/step_s": 0.1, "reward/mean": 0.5}) + "\n")
            metrics.flush()
            if step % every == 0 or step == total:
                marker.parent.mkdir(exist_ok=True)
                marker.write_text(str(step))
                if not resumed and os.environ.get("FAKE_WAIT_FOR_KILL") == "1":
                    time.sleep(60)  # killed here by the checker
    for w in workers:
        w.stdin.close()
        w.wait()


if __name__ == "__main__":
    worker(*sys.argv[2:5]) if sys.argv[1:2] == ["--worker"] else main()  # exec -a leaves sys.executable empty
