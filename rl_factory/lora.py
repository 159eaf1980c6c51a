"""LoRA on the embedded backend: peft adapters on the policy, saved and resumed with the run.

`model.lora_rank > 0` wraps the loaded model in a peft `PeftModel`; only the adapters train (the
optimizer sees only parameters that require grad). Generation uses the same module object, so the
embedded engine always samples the current adapters: there is no weight copy to fall out of sync (the
failure known from LoRA + a separate inference engine, which verl handles by re-sending the adapter
to vLLM after each update).

A LoRA checkpoint directory holds the adapter (`adapter_model.safetensors`, `adapter_config.json`
naming the base model by path), the tokenizer and the trainer state. With peft installed,
`AutoModelForCausalLM.from_pretrained(checkpoint)` loads base + adapter, so
`main_eval.sh model.path=<checkpoint>` works as for a full checkpoint.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_factory.base.errors import ConfigError

ADAPTER_WEIGHTS = "adapter_model.safetensors"


def apply_lora(model: Any, rank: int, alpha: int, target_modules: Any) -> Any:
    """`model` with rank-`rank` adapters on `target_modules` ("all-linear" or a list of module names)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:  # pragma: no cover - peft is a core dependency
        raise ConfigError(f"model.lora_rank={rank} needs peft (pip install peft): {exc}") from None
    if isinstance(target_modules, str) and target_modules != "all-linear":
        target_modules = [m.strip() for m in target_modules.split(",")]
    elif not isinstance(target_modules, str):
        target_modules = list(target_modules)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=target_modules, lora_dropout=0.0,
                        bias="none", task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, config)
    except ValueError as exc:  # e.g. a module name the model does not have
        raise ConfigError(f"model.lora_target_modules={target_modules!r}: {exc}") from None


def is_lora(model: Any) -> bool:
    return hasattr(model, "peft_config")


def trunk(model: Any) -> Any:
    """The transformer body (no LM head) of a plain causal LM, a peft `PeftModel`, or a model whose
    adapters transformers injected in place (a LoRA checkpoint loaded with `from_pretrained`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.base_model


def base_model_path(path: str) -> str:
    """The base model of an adapter directory (its adapter_config.json), else `path` itself."""
    import json

    config = Path(path) / "adapter_config.json"
    if config.is_file():
        return json.loads(config.read_text()).get("base_model_name_or_path") or path
    return path


def load_adapter(model: Any, directory: Path) -> None:
    """Restore the adapter weights of checkpoint `directory` into the (already wrapped) `model`."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    result = set_peft_model_state_dict(model, load_file(str(Path(directory) / ADAPTER_WEIGHTS)))
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ConfigError(f"checkpoint {directory}: adapter weights the model does not have: {unexpected[:3]}")
