"""benchmarks/long_context.py's verl job: its arguments come from gpu_step.py's parser, and the command they make
composes (main_grpo.sh --cfg job: no GPU, no Ray). On the H200 (2026-12-01) a hand-built namespace lacked a field
gpu_step.py had gained since, and the long run stopped before launching."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import long_context
from benchmarks.gpu_step import verl_overrides

pytestmark = pytest.mark.slow  # main_grpo.sh composing a verl job

ROOT = Path(__file__).resolve().parents[2]


def test_long_context_job_composes_with_eight_turns(tmp_path):
    pytest.importorskip("verl")
    manifest, data = long_context.write_task(tmp_path)
    args = long_context.job_args(2, 8, 60, manifest, data, ["seed=3"])
    overrides = verl_overrides(args, ROOT / "outputs" / "no-model", tmp_path / "run")
    assert "env.max_turns=8" in overrides and "trainer.n_gpus_per_node=1" in overrides
    assert "rollout.max_total_tokens=9216" in overrides and overrides[-1] == "seed=3"
    assert f"env.tools={manifest}" in overrides
    proc = subprocess.run(["bash", "main_grpo.sh", *overrides, "--cfg", "job"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "max_turns: 8" in proc.stdout or "max_assistant_turns: 8" in proc.stdout, proc.stdout[-3000:]
