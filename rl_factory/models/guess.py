"""`builtin:tiny-guess`: the tiny model warm-started to play the number-guessing game of examples/guess.

The game: the user thinks of a number from `low` to `high`; every assistant turn is one number; the
user answers "higher" or "lower" until a guess is right or the turns run out. The rules and their
wording live here (`prompt_text`, `feedback`, `parse_guess`) because the model is trained on them;
examples/guess/environment.py plays by the same functions.

The warm start has two phases, like tiny-calculator's (mechanics, then a weak decision):

1. *rules*: games whose every guess is drawn uniformly from the numbers the feedback still allows,
   so the model learns the format (one number in range, then end of turn) and what "higher" and
   "lower" mean;
2. *weak strategy*: a short pass on games of which only `feedback_share` follow the feedback, the
   rest guessing anywhere in the range. It pulls sampling back toward random guessing (about 65%
   of sampled guesses are still possible, 45% of games are solved in 4 turns) while what phase 1
   learned about reading the feedback stays in the weights for RL to amplify.

No game aims for the middle, so greedy decoding plays a poor search (8, 7, 1, 2, ...: half the
secrets found in 4 turns). A warm start whose guesses all ignore the feedback gives RL nothing to
amplify: it stayed at the random-guessing success rate (examples/guess/README.md).

Architecture, tokenizer (byte-level BPE with single-digit tokens, trained on the rendered games) and
cache (`RL_FACTORY_CACHE`, keyed by a hash of everything that shapes the model) are tiny-calculator's
(rl_factory/models/tiny.py).
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rl_factory.chat import ChatFormat
from rl_factory.models.tiny import CHAT_TEMPLATE, build_tokenizer, cache_root, cached_build, new_model, save_model
from rl_factory.models.warmstart import WarmStartConfig, supervised_pass, tokenize_transcript

HIGHER, LOWER = "higher", "lower"
BUILD_VERSION = 1  # bump when the build procedure changes, so stale caches are rebuilt


def prompt_text(low: int, high: int) -> str:
    """The user's opening message (the dataset's `prompt`)."""
    return f"I am thinking of a number from {low} to {high}. Guess it."


def feedback(guess: int, secret: int) -> str:
    """The user's answer to a wrong guess."""
    return HIGHER if secret > guess else LOWER


def invalid_text(low: int, high: int) -> str:
    """The user's answer to a turn that is not one number in range."""
    return f"Say one number from {low} to {high}."


def parse_guess(text: str, low: int, high: int) -> int | None:
    """The guess a turn makes: its text is one integer in [low, high]; anything else is None."""
    text = text.strip()
    if not re.fullmatch(r"\d{1,4}", text):
        return None
    guess = int(text)
    return guess if low <= guess <= high else None


@dataclass
class GuessModelConfig:
    """Game range, architecture (tiny-calculator's) and warm start of `builtin:tiny-guess`."""

    seed: int = 0
    low: int = 1
    high: int = 8
    # Guesses per warm-start game at most (examples/guess trains with env.max_turns=4)
    max_turns: int = 4
    vocab_size: int = 384
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 512
    num_games: int = 4000
    batch_size: int = 32
    # Phase 1 (how the game goes): every guess is one of the numbers the feedback still allows, so the
    # model learns to read "higher"/"lower" at all
    rules_steps: int = 300
    rules_lr: float = 3e-3
    # Phase 2 (a weak strategy on top): only `feedback_share` of the games follow the feedback, the
    # rest guess anywhere in the range
    weak_steps: int = 100
    weak_lr: float = 1e-3
    feedback_share: float = 0.3


def play(rng: random.Random, cfg: GuessModelConfig, follow_feedback: bool) -> list[dict]:
    """One warm-start game: a random secret, random guesses, feedback after each wrong one."""
    secret = rng.randint(cfg.low, cfg.high)
    messages = [{"role": "user", "content": prompt_text(cfg.low, cfg.high)}]
    lo, hi = cfg.low, cfg.high
    for turn in range(cfg.max_turns):
        guess = rng.randint(lo, hi) if follow_feedback else rng.randint(cfg.low, cfg.high)
        messages.append({"role": "assistant", "content": str(guess)})
        if guess == secret or turn == cfg.max_turns - 1:
            break
        messages.append({"role": "user", "content": feedback(guess, secret)})
        lo, hi = (max(lo, guess + 1), hi) if secret > guess else (lo, min(hi, guess - 1))
    return messages


def games(cfg: GuessModelConfig, feedback_share: float) -> list[list[dict]]:
    rng = random.Random(f"guess-{cfg.seed}-{feedback_share}")
    return [play(rng, cfg, rng.random() < feedback_share) for _ in range(cfg.num_games)]


def build_key(cfg: GuessModelConfig) -> str:
    game_text = [prompt_text(cfg.low, cfg.high), HIGHER, LOWER]
    blob = json.dumps({"cfg": asdict(cfg), "v": BUILD_VERSION, "tpl": CHAT_TEMPLATE, "text": game_text},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def ensure_guess_model(cfg: GuessModelConfig | None = None, log=print) -> Path:
    """The directory of the built model, building and caching it on first use (about 70 s of one CPU core)."""
    cfg = cfg or GuessModelConfig()
    out = cache_root() / f"tiny-guess-{build_key(cfg)}"
    return cached_build(out, lambda tmp: build_guess_model(tmp, cfg, log=log), log, what="builtin:tiny-guess")


def guess_tokenizer(cfg: GuessModelConfig | None = None):
    """The tokenizer the built model has (from the cache if built, else in about a second): for `--doctor`."""
    from transformers import AutoTokenizer

    cfg = cfg or GuessModelConfig()
    built = cache_root() / f"tiny-guess-{build_key(cfg)}"
    if (built / "config.json").exists():
        return AutoTokenizer.from_pretrained(built)
    return _tokenizer_and_games(cfg)[0]


def _tokenizer_and_games(cfg: GuessModelConfig):
    from transformers.utils.chat_template_utils import render_jinja_template

    rules, weak = games(cfg, 1.0), games(cfg, cfg.feedback_share)
    corpus, _ = render_jinja_template(rules + weak, chat_template=CHAT_TEMPLATE)
    return build_tokenizer(corpus, cfg.vocab_size), rules, weak


def build_guess_model(out: Path, cfg: GuessModelConfig, log=print) -> None:
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    tokenizer, rules, weak = _tokenizer_and_games(cfg)
    model = new_model(cfg, tokenizer)
    log(f"tiny-guess model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
        f"vocab {len(tokenizer)}")
    fmt = ChatFormat(tokenizer)
    ws = WarmStartConfig(batch_size=cfg.batch_size, seed=cfg.seed)
    pad = tokenizer.pad_token_id
    supervised_pass(model, [tokenize_transcript(fmt, g) for g in rules], cfg.rules_steps, cfg.rules_lr, ws, pad,
                    log=log, name="warm start (rules: guesses follow the feedback)", decay=False)
    supervised_pass(model, [tokenize_transcript(fmt, g) for g in weak], cfg.weak_steps, cfg.weak_lr, ws, pad,
                    log=log, name=f"warm start (weak strategy: {cfg.feedback_share:.0%} follow it)")
    save_model(out, model, tokenizer, {"config": asdict(cfg)})
