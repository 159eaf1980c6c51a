"""Synthetic transcripts and the short supervised pass that warm-starts the embedded default model.

The warm start teaches the *mechanics* of tool use (the call format, copying the question's
expression into the call, copying the tool's result into the answer) but deliberately leaves the
*decision* to call weak: only `tool_share` of the transcripts call the calculator, the rest answer
directly with the right number, which a model this size cannot compute. Greedy decoding then answers
directly (and is almost always wrong) while sampling at temperature 1 still calls the tool in about
`tool_share` of trajectories: exactly the signal GRPO needs to learn *when* to use the tool.
"""
from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import dataclass

import torch

from rl_factory.chat import ChatFormat


@dataclass
class WarmStartConfig:
    """Knobs of the synthetic supervised pass (calibrated for ~1 minute on 2 CPU cores)."""

    num_transcripts: int = 6000
    # Phase 1: every transcript calls the tool, so the format and both copies are learned fast.
    # It stops once the loss falls below `mechanics_loss` (copying learned), at most after
    # `mechanics_steps`.
    mechanics_steps: int = 900
    mechanics_loss: float = 0.05
    # Phase 2: only `tool_share` of transcripts call it; this sets the (weak) decision to call.
    decision_steps: int = 100
    tool_share: float = 0.3
    batch_size: int = 32
    lr: float = 3e-3
    decision_lr: float = 1e-3
    seed: int = 0


# (operator, digits of a, digits of b): the same mix as examples/calculator's questions.
QUESTION_KINDS = [("*", 3, 2), ("*", 3, 3), ("+", 4, 4), ("+", 3, 4)]


def make_question(rng: random.Random) -> tuple[str, int]:
    """A multi-digit product or sum, phrased like examples/calculator's data."""
    op, da, db = QUESTION_KINDS[rng.randrange(len(QUESTION_KINDS))]
    a, b = rng.randint(10 ** (da - 1), 10**da - 1), rng.randint(10 ** (db - 1), 10**db - 1)
    return f"{a} {op} {b}", a * b if op == "*" else a + b


def question_text(expr: str) -> str:
    return f"What is {expr}?"


def make_transcript(rng: random.Random, tool_name: str, arg_name: str, tool_share: float) -> list[dict]:
    expr, value = make_question(rng)
    messages = [{"role": "user", "content": question_text(expr)}]
    if rng.random() < tool_share:
        call = {"name": tool_name, "arguments": {arg_name: expr}}
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]},
            {"role": "tool", "content": str(value)},
        ]
    messages.append({"role": "assistant", "content": f"The answer is {value}."})
    return messages


def transcript_texts(cfg: WarmStartConfig, tool_name: str, arg_name: str,
                     tool_share: float) -> list[list[dict]]:
    rng = random.Random(f"{cfg.seed}-{tool_share}")
    return [make_transcript(rng, tool_name, arg_name, tool_share) for _ in range(cfg.num_transcripts)]


def tokenize_transcript(fmt: ChatFormat, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Lay a transcript out exactly as the rollout would: prompt, generated turns (mask 1), observations.

    The prompt is everything before the first assistant message; an observation is the run of tool
    (or environment: user) messages between two assistant turns.
    """
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids = fmt.prompt_ids(messages[:first])
    mask = [0] * len(ids)
    rest = messages[first:]
    while rest:
        turn = fmt.assistant_ids(rest[0])
        ids += turn
        mask += [1] * len(turn)
        observed = []
        rest = rest[1:]
        while rest and rest[0]["role"] != "assistant":
            observed.append(rest.pop(0))
        if observed:
            obs = fmt.observation_ids(observed)
            ids += obs
            mask += [0] * len(obs)
    return ids, mask


class BuildProgress:
    """Progress of a model build over all its supervised passes, with an ETA.

    On a terminal a tqdm bar (steps of every phase, the current phase and loss); elsewhere a log line
    every `every` steps. A phase that stops early (`stop_below`) takes its unrun steps off the total,
    so the ETA is an upper bound that only shrinks.
    """

    def __init__(self, total: int, log=print, desc: str = "building model", every: int = 25):
        self.total, self.done, self.log, self.every = total, 0, log, every
        self.t0 = time.time()
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True, file=sys.stderr)

    def eta_s(self) -> float:
        return (time.time() - self.t0) / max(1, self.done) * (self.total - self.done)

    def step(self, name: str, step: int, steps: int, loss: float) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(f"{name} loss {loss:.3f}", refresh=False)
            self.bar.update(1)
        elif (step + 1) % self.every == 0 or step + 1 == steps:
            self.log(f"{name} step {step + 1}/{steps} loss {loss:.3f} ({time.time() - self.t0:.0f}s, "
                     f"at most {_duration(self.eta_s())} left)")

    def skip(self, name: str, step: int, steps: int, loss: float) -> None:
        """The phase `name` ended after `step + 1` of its `steps`: its other steps will not run."""
        self.total -= steps - step - 1
        if self.bar is not None:
            self.bar.total = self.total
            self.bar.refresh()
        self.log(f"{name}: loss {loss:.3f} after {step + 1} steps, below its target: done early")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _duration(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 90 else f"{seconds / 60:.1f} min"


def supervised_pass(model, examples: list[tuple[list[int], list[int]]], steps: int, lr: float,
                    cfg: WarmStartConfig, pad_id: int, log=print, name: str = "warm start",
                    stop_below: float | None = None, decay: bool = True,
                    progress: BuildProgress | None = None) -> float:
    """Masked next-token cross-entropy on the assistant tokens; returns the final (smoothed) loss.

    With `stop_below`, training ends as soon as the smoothed loss drops under it: learning to copy
    numbers arrives as a sudden drop whose timing varies from seed to seed, so a fixed step count
    either wastes minutes or stops before it. `steps` is then only the upper bound.
    """
    own = progress is None
    progress = progress or BuildProgress(steps, log, desc=name)
    gen = torch.Generator().manual_seed(cfg.seed + steps)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    warmup = max(1, min(20, steps // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * ((1.0 - s / steps) if decay else 1.0))
    model.train()
    ema = None
    for step in range(steps):
        idx = torch.randint(len(examples), (cfg.batch_size,), generator=gen).tolist()
        device = next(model.parameters()).device
        batch = {k: v.to(device) for k, v in _batch([examples[i] for i in idx], pad_id).items()}
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        ema = loss.item() if ema is None else 0.9 * ema + 0.1 * loss.item()
        progress.step(name, step, steps, ema)
        if stop_below is not None and step >= warmup and ema < stop_below:
            progress.skip(name, step, steps, ema)
            break
    if own:
        progress.close()
    model.eval()
    return float(ema)


def _batch(batch: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id)
    labels = torch.full((len(batch), width), -100)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (ids, mask) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attn[row, : len(ids)] = 1
        labels[row, : len(ids)] = torch.tensor([t if m else -100 for t, m in zip(ids, mask)])
    return {"input_ids": input_ids, "attention_mask": attn, "labels": labels}


def dumps_args(args: dict) -> str:
    return json.dumps(args, ensure_ascii=False)
