"""SLOW TIER (about 3 minutes on 2 cores): exactly-once resume while rollouts run ahead of the update.

A real `main_grpo.sh` job (tiny model, the calculator server, 12 prompts = one epoch of 6 steps of 2) is
killed with SIGKILL (its whole process group: trainer and tool servers) at three points while the
generation of later steps is in flight, and resumed each time (trainer.resume=auto) until it finishes.
Then every prompt of the epoch was trained exactly once (its n rollouts in exactly one step's rollouts
file), and metrics.jsonl holds each step once. Run for k=0 (on-policy) and k=2 (two batches drawn ahead:
a checkpoint that kept the sampler's current position would skip them on resume).
"""
import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.test_main_scripts import REPO, marked_manifest, script_env, tiny_overrides  # noqa: F401
from tests.records import jsonl

PROMPTS, BATCH, N, STEPS = 12, 2, 2, 6
KILL_AFTER_STEPS = (2, 3, 5)  # the step whose metrics line is written, then a random moment later


def _logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line)["step"])
        except (ValueError, KeyError):  # a line being written
            pass
    return steps


def _start(overrides: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(["bash", "main_grpo.sh", *overrides], cwd=REPO, env=script_env(),
                            stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.slow
@pytest.mark.parametrize("staleness", [0, 2])
def test_sigkill_during_async_training_trains_every_prompt_exactly_once(tiny_model_dir, tmp_path, marked_manifest,
                                                                        staleness):
    manifest, _ = marked_manifest
    rows = (REPO / "examples" / "calculator" / "data" / "train.jsonl").read_text().splitlines()[:PROMPTS]
    train = tmp_path / "train.jsonl"
    train.write_text("\n".join(rows) + "\n")
    run_dir = tmp_path / "run"
    overrides = [*tiny_overrides(tiny_model_dir, run_dir, manifest), f"data.train_files={train}",
                 f"data.train_batch_size={BATCH}", f"rollout.n={N}", f"trainer.total_steps={STEPS}",
                 "trainer.save_every=2", "data.val_limit=2", f"trainer.max_staleness={staleness}",
                 "rollout.max_response_tokens=24",
                 # the tiny model earns reward 0 on every trajectory here: the run guard's constant-reward streak,
                 # kept across the resumes, would stop the run at step 5 (this test is about the data, not rewards)
                 "trainer.guard.reward_constant.action=warn"]
    log, rng = tmp_path / "runs.log", random.Random(staleness)
    kills = 0
    for target in KILL_AFTER_STEPS:
        proc = _start(overrides, log)
        deadline = time.monotonic() + 300
        while max(_logged_steps(run_dir), default=-1) < target and proc.poll() is None:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.02)
        assert proc.poll() is None, f"the run ended before step {target}:\n{log.read_text()[-3000:]}"
        time.sleep(rng.uniform(0.0, 0.5))  # somewhere in the next step: rollouts, update or checkpoint
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
    final = _start(overrides, log)
    assert final.wait(timeout=600) == 0, log.read_text()[-3000:]
    assert kills == 3

    # metrics.jsonl: every step once, in order (a resumed run drops the lines past its checkpoint)
    assert _logged_steps(run_dir) == list(range(STEPS + 1))
    # rollouts/: one file per step, and every prompt of the epoch in exactly one of them, with its n rollouts
    files = sorted(p.name for p in (run_dir / "rollouts").glob("step_*.jsonl"))
    assert files == [f"step_{s:06d}.jsonl" for s in range(1, STEPS + 1)]
    trained = Counter()
    for s in range(1, STEPS + 1):
        lines = jsonl(run_dir / "rollouts" / f"step_{s:06d}.jsonl")
        assert len(lines) == BATCH * N
        trained.update(line["sample_index"] for line in lines)
    assert trained == Counter({i: N for i in range(PROMPTS)})
    if staleness:
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert max(m["async/staleness/max"] for m in metrics[1:]) <= staleness
