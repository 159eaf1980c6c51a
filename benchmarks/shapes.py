"""The models the GPU benchmarks run: the builtin tiny model, and randomly initialized Qwen3 shapes with its
tokenizer (`build_shape`), or their config alone for `--cfg job` and the tuning plan (`shape_config_dir`).

    python -c "from benchmarks.shapes import builtin_tokenizer_dir; print(builtin_tokenizer_dir())"
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SHAPES = {  # Qwen3 config fields (hub config.json of Qwen/Qwen3-0.6B and Qwen/Qwen3-4B)
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128),
    # with Qwen3's own vocabulary size (the builtin tokenizer uses its first ids): 4.0B parameters as the hub
    # model, and vLLM's LoRA slot for the tied lm_head is sized as in real use (with the 635-token builtin
    # vocabulary, smaller than the hidden size, vLLM 0.24's LoRA profile run failed on the H200, 2026-12-01)
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936),
    # not a benchmark: two small layers, for CPU checks of a shape's code path (vs_trl.py --shape qwen3-smoke)
    "qwen3-smoke": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16),
}


def builtin_tokenizer_dir() -> Path:
    import asyncio

    from rl_factory.components import EnvConfig, open_env
    from rl_factory.policy import resolve_model_path

    async def tools():
        async with open_env(EnvConfig(tools=str(ROOT / "configs/tools/calculator.yaml"))) as env:
            return await env.list_tools()

    return Path(resolve_model_path("builtin:tiny-calculator", asyncio.run(tools()), 0, log=lambda *a: None))


def shape_config(shape: str, tok=None, **fields):
    """The Qwen3 config of `shape`: the tokenizer's vocabulary size and special ids where `tok` is given (else the
    shape's own vocabulary or `fields`'), `fields` over the rest (`vocab_size`, `attn_implementation`)."""
    from transformers import Qwen3Config

    ids = {} if tok is None else {"vocab_size": len(tok), "bos_token_id": tok.bos_token_id,
                                  "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    return Qwen3Config(max_position_embeddings=40960, rope_theta=1_000_000, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, **{**ids, **SHAPES[shape], **fields})


def shape_config_dir(shape: str, out: Path) -> Path:
    """config.json and tokenizer of `shape`, no weights: enough for `--cfg job` and the tuning plan.

    Its own directory: a `model-<shape>` with a config but no weights would pass for a built model.
    """
    from rl_factory.models.tiny import tiny_tokenizer

    target = out / f"config-{shape}"
    if not (target / "config.json").exists():
        tok = tiny_tokenizer()  # the builtin model's tokenizer, without training it
        shape_config(shape, tok).save_pretrained(target)
        tok.save_pretrained(target)
    return target


def build_shape(shape: str, out: Path) -> Path:
    """A randomly initialized Qwen3 of `shape` with the builtin tokenizer and chat template (bf16)."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    target = out / f"model-{shape}"
    if (target / "config.json").exists():
        return target
    source = builtin_tokenizer_dir()
    tok = AutoTokenizer.from_pretrained(source)
    cfg = shape_config(shape, tok)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(target)
    tok.save_pretrained(target)
    GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).save_pretrained(target)
    for extra in ("chat_template.jinja",):
        if (source / extra).exists() and not (target / extra).exists():
            shutil.copy(source / extra, target / extra)
    return target
