"""Write a checkpoint exactly as verl's FSDP actor does, on CPU: `python fsdp_checkpoint.py MODEL_DIR OUT_DIR`.

verl's training engine (verl/workers/engine/fsdp/transformer_impl.py) wraps the model with FSDP2 over a
device mesh named ("fsdp",) and saves with `FSDPCheckpointManager`; here the same manager saves the
same wrapping of a Hugging Face model, with one gloo rank instead of NCCL ranks on GPUs. The model's config
carries `attn_implementation=rl_factory_varlen` as verl sets it from our tuned `override_config` when
flash-attn is missing (verl/workers/config/model.py: `update_model_config`), so config.json holds it too.
"""
import os
import sys

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM, AutoTokenizer
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.model import update_model_config

import rl_factory.models.varlen_attention as varlen

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
dist.init_process_group("gloo", rank=0, world_size=1)
model_dir, out_dir = sys.argv[1], sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
update_model_config(model.config, override_config_kwargs={"attn_implementation": varlen.NAME})
fully_shard(model, mesh=init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",)))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
manager = FSDPCheckpointManager(model, optimizer, processing_class=AutoTokenizer.from_pretrained(model_dir),
                                checkpoint_config=OmegaConf.create({"save_contents": ["model", "optimizer", "extra"],
                                                                    "load_contents": ["model"]}))
manager.save_checkpoint(out_dir, global_step=1)
dist.destroy_process_group()
