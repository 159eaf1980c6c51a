"""The policy: a causal LM and its tokenizer on one device, plus the log-prob computation.

`model.path` is a Hugging Face hub id, a local directory, or `builtin:<name>` for a model the
project builds itself (the registry `BUILTIN_MODELS`; `builtin:tiny-calculator` is the embedded
default, one model for every manifest; `builtin:tiny-calculator-task` the same warm start with the
task's own tool schemas, built once per tool set; `builtin:tiny-guess` plays examples/guess). Weights stay fp32 so AdamW updates keep full
precision; on GPU, compute runs under bf16 autocast for checkpoints published in half precision
(`model.dtype=auto`).
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from rl_factory.base.errors import ConfigError
from rl_factory.hub import check_hub_model
from rl_factory.packing import MASK_KINDS, MIN_SHARED_PREFIX, build_packs, gather_logprobs, pack_inputs
from rl_factory.base.registry import Registry

BUILTIN_MODELS: Registry[Callable[..., Path]] = Registry("builtin model")
register_builtin_model = BUILTIN_MODELS.register
# The tokenizer each builtin model would have, made in about a second without training it (`--doctor`)
BUILTIN_TOKENIZERS: Registry[Callable[..., Any]] = Registry("builtin tokenizer")
register_builtin_tokenizer = BUILTIN_TOKENIZERS.register


@dataclass
class BuildPlan:
    """Where a builtin model is cached, and `estimate() -> (steps at most, seconds a step here)` of its build."""

    path: Path
    estimate: Callable[[], tuple[int, float]]
    reused_by: str = "every task"  # who reuses the build once it is made (words for --doctor)

    @property
    def built(self) -> bool:
        return (self.path / "config.json").exists()


# What building each builtin model would cost, for `--doctor` (one with no plan is not described)
BUILTIN_PLANS: Registry[Callable[..., BuildPlan]] = Registry("builtin build plan")
register_builtin_plan = BUILTIN_PLANS.register


@register_builtin_model("tiny-calculator")
def _tiny_calculator(tools: list[dict], seed: int, log) -> Path:
    from rl_factory.models.tiny import TinyModelConfig, ensure_tiny_model

    # One model for every manifest (`tools` only reach it through the chat template at run time).
    # Always built on the CPU: the same seed gives the same model on every machine (GPU kernels
    # would give a slightly different one).
    return ensure_tiny_model(TinyModelConfig(seed=seed), log=log)


@register_builtin_tokenizer("tiny-calculator")
def _tiny_calculator_tokenizer(tools: list[dict], seed: int):
    from rl_factory.models.tiny import TinyModelConfig, tiny_tokenizer

    return tiny_tokenizer(TinyModelConfig(seed=seed))


@register_builtin_plan("tiny-calculator")
def _tiny_calculator_plan(tools: list[dict], seed: int) -> BuildPlan:
    from rl_factory.models.tiny import TinyModelConfig, build_estimate, built_dir

    cfg = TinyModelConfig(seed=seed)
    return BuildPlan(built_dir(cfg), lambda: build_estimate(cfg))


@register_builtin_model("tiny-calculator-task")
def _tiny_calculator_task(tools: list[dict], seed: int, log) -> Path:
    from rl_factory.models.tiny import TinyModelConfig, ensure_tiny_model

    # Chosen explicitly: a build per tool set, so that the task's schemas tokenize as compactly as the
    # calculator's do for tiny-calculator (the model still learned the format on the calculator).
    return ensure_tiny_model(TinyModelConfig(seed=seed), log=log, tools=tools)


@register_builtin_tokenizer("tiny-calculator-task")
def _tiny_calculator_task_tokenizer(tools: list[dict], seed: int):
    from rl_factory.models.tiny import TinyModelConfig, tiny_tokenizer

    return tiny_tokenizer(TinyModelConfig(seed=seed), tools)


@register_builtin_plan("tiny-calculator-task")
def _tiny_calculator_task_plan(tools: list[dict], seed: int) -> BuildPlan:
    from rl_factory.models.tiny import TinyModelConfig, build_estimate, built_dir

    cfg = TinyModelConfig(seed=seed)
    return BuildPlan(built_dir(cfg, tools), lambda: build_estimate(cfg), "every run with these tool schemas")


@register_builtin_model("tiny-guess")
def _tiny_guess(tools: list[dict], seed: int, log) -> Path:
    from rl_factory.models.guess import GuessModelConfig, ensure_guess_model

    # The number-guessing game of examples/guess: no tools (its template renders no tool preamble).
    if tools:
        raise ValueError("model.path=builtin:tiny-guess plays examples/guess, which has no tools: set env.tools=null")
    return ensure_guess_model(GuessModelConfig(seed=seed), log=log)


@register_builtin_tokenizer("tiny-guess")
def _tiny_guess_tokenizer(tools: list[dict], seed: int):
    from rl_factory.models.guess import GuessModelConfig, guess_tokenizer

    return guess_tokenizer(GuessModelConfig(seed=seed))


@dataclass
class ModelConfig:
    """`model.*`: what to load and where to run it."""

    path: str = "builtin:tiny-calculator"
    device: str = "auto"
    dtype: str = "auto"
    num_threads: int = 0
    # LoRA (peft): train low-rank adapters instead of every weight; 0 = full fine-tuning
    lora_rank: int = 0
    lora_alpha: int = 16
    lora_target_modules: Any = "all-linear"


class Policy:
    """A causal LM, its tokenizer, and the device/precision it runs at."""

    def __init__(self, model, tokenizer, device: torch.device, autocast_dtype: torch.dtype | None, path: str):
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.autocast_dtype = autocast_dtype
        self.path = path
        self._can_pack: bool | None = None  # see can_pack()

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def sequence_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          model=None) -> torch.Tensor:
        """Log-prob of every token given its prefix.

        Args:
            input_ids: [B, T] right-padded token ids.
            attention_mask: [B, T] 1 for real tokens.
        Returns:
            [B, T] where column t holds log p(input_ids[:, t] | input_ids[:, :t]); column 0 is 0.
        """
        model = model or self.model
        with self.autocast():
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        return _pick_logprobs(logits, input_ids)

    def logprobs_and_hidden(self, input_ids: torch.Tensor,
                            attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`sequence_logprobs` plus the last hidden state [B, T, H] from the same forward pass (the critic's input)."""
        with self.autocast():
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        return _pick_logprobs(out.logits, input_ids), out.hidden_states[-1]

    def packed_logprobs(self, packed: dict[str, torch.Tensor], targets: torch.Tensor, model=None,
                        hidden: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`sequence_logprobs` of samples laid out in packs (rl_factory.packing.pack_inputs), and with
        `hidden` their last hidden states [B, T, H]; `targets` [B, T] are the samples' own token ids."""
        model = model or self.model
        with self.autocast():
            out = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"],
                        attention_mask=packed["attention_mask"], output_hidden_states=hidden)
        logprobs = gather_logprobs(out.logits, packed["index"], targets)
        if not hidden:
            return logprobs, None
        return logprobs, out.hidden_states[-1].flatten(0, 1)[packed["index"]]

    def can_pack(self) -> bool:
        """Whether this model gives packed rows the log-probs of plain ones (rl_factory.packing); checked once.

        It needs an attention implementation that takes a 4-D mask and positions from `position_ids`; a
        model without them (flash-attn's kernels, a custom architecture) trains on plain rows.
        """
        if self._can_pack is None:
            self._can_pack = self._check_packing()
            if not self._can_pack:
                logging.getLogger("rl_factory").warning(
                    "optim.shared_prefix: this model (attention %s) does not give packed rows the log-probs of plain "
                    "ones; the update computes every sample in a row of its own",
                    getattr(self.model.config, "_attn_implementation", None))
        return self._can_pack

    def _check_packing(self) -> bool:
        from types import SimpleNamespace

        config = self.model.config
        kind = MASK_KINDS.get(getattr(config, "_attn_implementation", None))
        # A 4-D mask replaces every layer's own, so sliding-window layers would attend past their window
        # on long rows (the short check below could not see it).
        sliding = getattr(config, "sliding_window", None) and (
            "sliding_attention" in (getattr(config, "layer_types", None) or [])
            or getattr(config, "use_sliding_window", False))
        if kind is None or sliding:
            return False
        vocab = config.vocab_size
        gen = torch.Generator().manual_seed(0)

        def tokens(n: int) -> list[int]:
            return torch.randint(vocab, (n,), generator=gen).tolist()

        # a small tree: two samples share a branch past the common prefix, a third leaves at the prefix
        stem, branch = tokens(MIN_SHARED_PREFIX + 4), tokens(5)
        seqs = [stem + branch + tokens(4), stem + branch + tokens(6), stem + tokens(9)]
        packs = build_packs([SimpleNamespace(token_ids=t) for t in seqs], [0, 0, 0], ratio=0.0)
        order = [x.token_ids for p in packs for x in p.samples]
        pad = self.tokenizer.pad_token_id
        packed = pack_inputs(packs, pad, self.device, kind)
        ids = torch.full((len(order), max(map(len, order))), pad, dtype=torch.long, device=self.device)
        mask = torch.zeros_like(ids)
        for i, t in enumerate(order):
            ids[i, :len(t)] = torch.tensor(t, device=self.device)
            mask[i, :len(t)] = 1
        was_training = self.model.training
        self.model.eval()  # dropout would make the two forwards differ by chance
        try:
            with torch.no_grad():
                plain = self.sequence_logprobs(ids, mask)
                packed_lp, _ = self.packed_logprobs(packed, ids)
        except Exception:  # an architecture that refuses the 4-D mask or the position ids
            return False
        finally:
            self.model.train(was_training)
        # bf16 autocast rounds both forwards differently; a wrong mask or ignored positions is off by far more
        tol = 1e-3 if self.autocast_dtype is None else 5e-2
        return bool(((plain - packed_lp).abs() * mask).max() <= tol)

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The last hidden state [B, T, H] alone: the base model without the LM head (no vocab-sized logits)."""
        from rl_factory.lora import trunk

        with self.autocast():
            return trunk(self.model)(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def _pick_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logprobs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"model.device={name} but no CUDA device is available (use model.device=cpu)")
    return device


def resolve_model_path(path: str, tools: list[dict], seed: int, log=print) -> str:
    """A hub id or directory as is; `builtin:<name>` built (on the CPU, once, cached) and its directory."""
    if path.startswith("builtin:"):
        name = path.split(":", 1)[1]
        if name not in BUILTIN_MODELS:
            raise ConfigError(f"model.path: unknown builtin model {name!r} "
                              f"(valid: {', '.join(sorted(BUILTIN_MODELS))})")
        return str(BUILTIN_MODELS[name](tools=tools, seed=seed, log=log))
    return path


def load_policy(cfg: ModelConfig, tools: list[dict], seed: int = 0, log=print) -> Policy:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl_factory.lora import base_model_path

    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    device = resolve_device(cfg.device)
    if device.type == "cpu":  # GPU tensors have torch's caching allocator; CPU ones only glibc's
        from rl_factory.allocator import keep_freed_memory

        keep_freed_memory()
    path = resolve_model_path(cfg.path, tools, seed, log=log)
    check_hub_model(path)  # a hub id with no network: one line now, not a minute of retries
    local = path.startswith(("/", ".", "~")) or Path(path).exists()
    if local and not Path(path).expanduser().is_dir():
        raise ConfigError(f"model.path: local directory {path} does not exist (looked at {Path(path).expanduser().resolve()})")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        # read before loading (loading in fp32 rewrites the config's dtype); a LoRA checkpoint's is its base's
        saved_dtype = _saved_dtype(base_model_path(path))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
    except OSError as exc:  # not a model dir, unknown hub id, no network: say which key is wrong
        raise ConfigError(f"model.path: cannot load {path!r}: {str(exc).splitlines()[0]}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if cfg.lora_rank > 0:
        from rl_factory.lora import apply_lora

        model = apply_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_target_modules)
    return Policy(model, tokenizer, device, _autocast_dtype(cfg.dtype, device, saved_dtype), path)


def _saved_dtype(path: str) -> str:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    saved = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return str(saved).replace("torch.", "")


def _autocast_dtype(name: str, device: torch.device, saved: str) -> torch.dtype | None:
    """bf16 autocast on GPU for checkpoints published in half precision (Qwen3 & co.); fp32 otherwise.

    "auto" follows the checkpoint: the embedded tiny model is saved in fp32 and loses its ability to
    copy numbers exactly under bf16, while billion-parameter models are trained and shipped in bf16.
    """
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" and saved in ("bfloat16", "float16") else None
    dtypes = {"float32": None, "bfloat16": torch.bfloat16}
    if name not in dtypes:
        raise ConfigError(f"model.dtype: {name!r} is not one of auto, {', '.join(dtypes)}")
    return dtypes[name]


def load_tokenizer_only(cfg: ModelConfig, tools: list[dict], seed: int = 0, log=print) -> Policy:
    """A policy without weights, for evaluating a model served elsewhere (the `openai` engine)."""
    from transformers import AutoTokenizer

    path = resolve_model_path(cfg.path, tools, seed, log=log)
    check_hub_model(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as exc:
        raise ConfigError(f"model.path: cannot load a tokenizer from {path!r}: {str(exc).splitlines()[0]}") from None
    return Policy(None, tokenizer, torch.device("cpu"), None, path)
