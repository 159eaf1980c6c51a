"""LoRA on the verl backend syncs merged weights to vLLM (`actor_rollout_ref.model.lora.merge=true`, our
mapping's choice): what verl sends after an update is the adapted policy, not the initial weights.

verl's adapter path (vLLM's own LoRA layers) lost the adapter on the H200 (vLLM 0.24: `add_lora` got no
layers); with merging, vLLM loads plain weights as in full fine-tuning, whose sync the GPU runs check
(rollout vs actor log-probs within ~1e-3). Here verl's merge-and-stream calls run on CPU, on verl's FSDP2
wrapping of the builtin model (tests/backends/lora_merged_sync.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # verl's FSDP engine on the built model, in a subprocess

pytest.importorskip("verl", reason="verl is an extra: bash setup.sh --dev (verl-cpu)")


def test_merged_sync_sends_the_adapted_policy(tiny_model_dir):
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("lora_merged_sync.py")), str(tiny_model_dir)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    r = json.loads(run.stdout.strip().splitlines()[-1])
    assert r["sent_keys"] == r["reference_keys"] and not r["missing"] and not r["unexpected"]
    assert r["max_weight_diff"] < 1e-6                       # the sent weights are peft's merge of the adapters
    assert r["max_logit_diff_base_vs_adapted"] > 0.1         # the adapters change the policy ...
    assert r["max_logit_diff_vs_adapted"] < 1e-4             # ... and a model loaded from what is sent is that policy
    assert r["base_restored"] == 0.0 and r["adapters_kept"] == 0.0  # training goes on from unmerged weights

