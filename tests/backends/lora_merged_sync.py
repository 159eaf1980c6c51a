"""The weights verl sends vLLM each step under LoRA with `lora.merge=true`, on CPU: `python lora_merged_sync.py MODEL_DIR`.

verl's FSDP engine streams them from `_merged_lora_per_tensor_param`: inside `merged_lora_context`, the
state dict through `normalize_peft_param_name` (verl/workers/engine/fsdp/transformer_impl.py). Here the
same two verl calls run on the same wrapping (`apply_fsdp2`, one gloo rank) of a peft model whose adapters
have moved off their zero init, as after an update. Prints one JSON line: the largest difference between
what would be sent and peft's own merged weights, the logits of a model built from the sent weights
against the adapted policy's, and whether the base weights and adapters are back after the sync.
"""
import json
import os
import sys

import torch
import torch.distributed as dist
from peft import LoraConfig, TaskType, get_peft_model
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoModelForCausalLM
from verl.utils.fsdp_utils import apply_fsdp2, merged_lora_context, normalize_peft_param_name

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
dist.init_process_group("gloo", rank=0, world_size=1)
model_dir = sys.argv[1]
torch.manual_seed(0)
base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
peft = get_peft_model(base, LoraConfig(task_type=TaskType.CAUSAL_LM, r=8, lora_alpha=16, target_modules="all-linear"))
with torch.no_grad():  # an update has moved every adapter: B is no longer zero
    for name, p in peft.named_parameters():
        if "lora_B" in name:
            p.normal_(0, 0.05)
ids = torch.randint(3, base.config.vocab_size, (1, 24))
with torch.no_grad():
    adapted_logits = peft(input_ids=ids).logits
# peft's own merge, on a copy, is the reference for what vLLM should load
copy = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                      LoraConfig(task_type=TaskType.CAUSAL_LM, r=8, lora_alpha=16, target_modules="all-linear"))
copy.load_state_dict(peft.state_dict())
reference = copy.merge_and_unload().state_dict()
base_before = {k: v.detach().clone() for k, v in peft.named_parameters() if "lora" not in k}
lora_before = {k: v.detach().clone() for k, v in peft.named_parameters() if "lora" in k}

full = lambda t: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()  # noqa: E731  (DTensor or not)
apply_fsdp2(peft, {"mesh": init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))}, {})
with merged_lora_context(peft, backup_adapters=True):
    sent = {k: full(v).clone() for k, v in normalize_peft_param_name(peft.state_dict()).items()}

after = dict(peft.named_parameters())
vllm_side = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
missing, unexpected = vllm_side.load_state_dict(sent, strict=False)
with torch.no_grad():
    sent_logits = vllm_side(input_ids=ids).logits
    base_logits = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)(input_ids=ids).logits
print(json.dumps({
    "sent_keys": len(sent), "reference_keys": len(reference), "missing": list(missing), "unexpected": list(unexpected),
    "max_weight_diff": max((sent[k] - reference[k]).abs().max().item() for k in reference),
    "max_logit_diff_vs_adapted": (sent_logits - adapted_logits).abs().max().item(),
    "max_logit_diff_base_vs_adapted": (base_logits - adapted_logits).abs().max().item(),
    "base_restored": max((full(after[k]) - v).abs().max().item() for k, v in base_before.items()),
    "adapters_kept": max((full(after[k]) - v).abs().max().item() for k, v in lora_before.items()),
}))
dist.destroy_process_group()
