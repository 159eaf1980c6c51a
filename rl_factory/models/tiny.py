"""The embedded default model: a tiny Qwen3-architecture LM and tokenizer the project builds itself.

Built on first use, deterministically from a seed, and cached under `~/.cache/rl_factory/models`
(override with RL_FACTORY_CACHE) keyed by a hash of everything that shapes it, so later runs reuse it.
There is one such model whatever the manifest: the warm start teaches the tool-call *format* with
the calculator's schema (`CALCULATOR_TOOLS`), and a task's own tools reach the model through the
tool schemas its chat template renders into the system turn. A new manifest therefore never waits on
a build; the build itself shows a progress bar with an ETA (warmstart.BuildProgress). The tokenizer
merges what it was trained on, so another task's schemas take more prompt tokens than the
calculator's; `builtin:tiny-calculator-task` is the explicit choice of a model warm-started (and its
tokenizer trained) with the task's own schemas, built once per tool set.
The result is an ordinary Hugging Face directory: `AutoModelForCausalLM.from_pretrained` and
`AutoTokenizer.from_pretrained` load it, with a chat template in the Qwen3/Hermes tool format.

The tokenizer is a byte-level BPE trained on the warm-start transcripts. Digits are always single
tokens (as in Qwen) so the model can copy numbers digit by digit; merges may span spaces, which folds
the long, constant tool preamble of the system turn into a handful of tokens and keeps sequences
short enough to train on two CPU cores.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from rl_factory.chat import ChatFormat
from rl_factory.interrupt import interruptible
from rl_factory.models.warmstart import (BuildProgress, WarmStartConfig, supervised_pass, tokenize_transcript,
                                         transcript_texts)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added but not special (as in Qwen3): decode(skip_special_tokens=True) keeps them, parsers see them.
TAG_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
CHAT_TEMPLATE = (Path(__file__).parent / "chat_template.jinja").read_text()
BUILD_VERSION = 1  # bump when the build procedure changes, so stale caches are rebuilt
# The calculator server's tool as `ToolEnv.list_tools` reports it (envs.servers.calculator; a test
# checks they agree): the one schema the builtin model is warm-started with, whatever the task.
CALCULATOR_TOOLS: list[dict] = [{"type": "function", "function": {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
    "parameters": {"properties": {"expression": {"title": "Expression", "type": "string"}},
                   "required": ["expression"], "type": "object", "title": "calculatorArguments"}}}]


@dataclass
class TinyModelConfig:
    """Architecture and build recipe of the embedded default model."""

    seed: int = 0
    vocab_size: int = 768
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    tool_name: str = "calculator"
    tool_argument: str = "expression"
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)


def cache_root() -> Path:
    return Path(os.environ.get("RL_FACTORY_CACHE", Path.home() / ".cache" / "rl_factory")) / "models"


def build_key(cfg: TinyModelConfig, tools: list[dict]) -> str:
    blob = json.dumps({"cfg": asdict(cfg), "tools": tools, "v": BUILD_VERSION, "tpl": CHAT_TEMPLATE},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def built_dir(cfg: TinyModelConfig | None = None, tools: list[dict] | None = None) -> Path:
    """Where the builtin model of `cfg` is (or will be) cached; `tools`: warm-started with these
    schemas instead of the calculator's (`builtin:tiny-calculator-task`)."""
    cfg = cfg or TinyModelConfig()
    return cache_root() / f"tiny-{cfg.tool_name}-{build_key(cfg, CALCULATOR_TOOLS if tools is None else tools)}"


def ensure_tiny_model(cfg: TinyModelConfig | None = None, log=print, device: str = "cpu",
                      tools: list[dict] | None = None) -> Path:
    """Return the directory of the built model, building and caching it on first use: once per cache
    for the calculator's schemas (every manifest uses that model), once per tool set with `tools`."""
    cfg = cfg or TinyModelConfig()
    steps = cfg.warmstart.mechanics_steps + cfg.warmstart.decision_steps
    what = ("the embedded default model (once: every task reuses it" if tools is None else
            "a tiny model warm-started with this task's tool schemas (once per tool set")
    schemas = CALCULATOR_TOOLS if tools is None else tools
    return cached_build(built_dir(cfg, tools), lambda tmp: build_tiny_model(tmp, schemas, cfg, log=log, device=device),
                        log, what=f"{what}; at most {steps} warm-start steps, a progress bar shows the ETA)")


def cached_build(out: Path, build, log=print, what: str = "a builtin model") -> Path:
    """`out` if it holds a built model, else `build(tmp_dir)` and the result renamed to `out`.

    One process builds at a time (a lock file beside `out`): several first runs on one machine wait for
    the first one's build and reuse it. Ctrl-C and SIGTERM stop the build at once (rl_factory.interrupt).
    """
    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with interruptible(), build_lock(out, log, what):
        if (out / "config.json").exists():  # built by the run this one waited for
            return out
        log(f"building {what} (first use) into {out}")
        # Build in a sibling temp dir and rename: a run killed mid-build never leaves a half-built cache.
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".building-"))
        try:
            build(tmp)
            os.replace(tmp, out)
        except OSError:
            if not (out / "config.json").exists():  # lost a race with a concurrent build: theirs is fine
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


@contextlib.contextmanager
def build_lock(out: Path, log=print, what: str = "a builtin model") -> Iterator[None]:
    """Hold the lock on building `out` (`.<name>.lock` beside it; released when the process dies)."""
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another process building {what} into {out}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build_tokenizer(corpus: list[str], vocab_size: int):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS + TAG_TOKENS, max_token_length=48,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)  # the trainer's tokens come first: ids 0-8, all special
    # The tags must be plain added tokens (decode(skip_special_tokens=True) keeps them). Re-adding them
    # changes their flag but not the set of special tokens that decode consults, which is only rebuilt
    # from the tokenizer's JSON: rebuild it here, so this object decodes as the saved and reloaded one.
    tok.add_tokens([AddedToken(t, special=False, normalized=True) for t in TAG_TOKENS])
    tok = Tokenizer.from_str(tok.to_str())
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=[], chat_template=CHAT_TEMPLATE,
                                   model_max_length=1 << 20, clean_up_tokenization_spaces=False)


def _tokenizer_and_transcripts(tools: list[dict], cfg: TinyModelConfig):
    from transformers.utils.chat_template_utils import render_jinja_template

    ws = cfg.warmstart
    mechanics = transcript_texts(ws, cfg.tool_name, cfg.tool_argument, tool_share=1.0)
    decision = transcript_texts(ws, cfg.tool_name, cfg.tool_argument, tool_share=ws.tool_share)
    corpus, _ = render_jinja_template(mechanics + decision, tools=tools or None, chat_template=CHAT_TEMPLATE)
    return build_tokenizer(corpus, cfg.vocab_size), mechanics, decision


def tiny_tokenizer(cfg: TinyModelConfig | None = None, tools: list[dict] | None = None):
    """The tokenizer the built model has (from the cache if built; else in about a second, without
    training the model): what `--doctor` needs to check the chat template."""
    from transformers import AutoTokenizer

    built = built_dir(cfg, tools)
    if (built / "config.json").exists():
        return AutoTokenizer.from_pretrained(built)
    return _tokenizer_and_transcripts(CALCULATOR_TOOLS if tools is None else tools, cfg or TinyModelConfig())[0]


def build_estimate(cfg: TinyModelConfig | None = None, probe_steps: int = 3) -> tuple[int, float]:
    """(warm-start steps at most, seconds one step takes on this machine now), from `probe_steps`
    timed steps on a fresh model: what `--doctor` quotes before a build."""
    cfg = cfg or TinyModelConfig()
    ws = cfg.warmstart
    tokenizer, mechanics, _ = _tokenizer_and_transcripts(CALCULATOR_TOOLS, cfg)
    model = new_model(cfg, tokenizer)
    fmt = ChatFormat(tokenizer, CALCULATOR_TOOLS)
    examples = [tokenize_transcript(fmt, m) for m in mechanics[: ws.batch_size * 4]]
    supervised_pass(model, examples, 1, ws.lr, ws, tokenizer.pad_token_id, log=lambda *_: None)  # warm-up
    t0 = time.perf_counter()
    supervised_pass(model, examples, probe_steps, ws.lr, ws, tokenizer.pad_token_id, log=lambda *_: None)
    return ws.mechanics_steps + ws.decision_steps, (time.perf_counter() - t0) / probe_steps


def new_model(cfg, tokenizer, device: str = "cpu"):
    """A freshly initialised Qwen3 of `cfg`'s shape (hidden_size, layers, heads, ...) for `tokenizer`."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    model_cfg = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.hidden_size // cfg.num_attention_heads,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    return Qwen3ForCausalLM(model_cfg).to(device)


def save_model(out: Path, model, tokenizer, build_info: dict) -> None:
    """The model and tokenizer as a Hugging Face directory, plus `build.json` (how it was made)."""
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.cpu().save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "build.json").write_text(json.dumps(build_info, indent=2))


def build_tiny_model(out: Path, tools: list[dict], cfg: TinyModelConfig, log=print, device: str = "cpu") -> None:
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    ws = cfg.warmstart
    tokenizer, mechanics, decision = _tokenizer_and_transcripts(tools, cfg)
    model = new_model(cfg, tokenizer, device)
    log(f"tiny model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
        f"vocab {len(tokenizer)}")
    fmt = ChatFormat(tokenizer, tools)
    pad = tokenizer.pad_token_id
    progress = BuildProgress(ws.mechanics_steps + ws.decision_steps, log, desc="building the default model")
    try:
        supervised_pass(model, [tokenize_transcript(fmt, m) for m in mechanics], ws.mechanics_steps, ws.lr, ws,
                        pad, log=log, name="warm start (tool mechanics)", stop_below=ws.mechanics_loss, decay=False,
                        progress=progress)
        supervised_pass(model, [tokenize_transcript(fmt, m) for m in decision], ws.decision_steps, ws.decision_lr,
                        ws, pad, log=log, name="warm start (weak decision)", progress=progress)
    finally:
        progress.close()
    save_model(out, model, tokenizer, {"config": asdict(cfg), "tools": tools})
