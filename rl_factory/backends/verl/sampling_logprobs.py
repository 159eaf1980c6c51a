"""Which rollouts ask vLLM for each sampled token's log-prob: `sampling_logprobs_every` (configs/verl.yaml).

vLLM's sampling log-probs cost generation time on every step they are asked for: vLLM alone on the 0.6B shape's
128 requests ran 2.22-2.44 s with them and 1.53-1.77 s without (one H100, the ceilings of two `gpu_step.py`
launches at f909fb425cfc), the same gap on the H200 (1.92 s against 1.53). What reads them:

- the PPO ratio's denominator under `algorithm.old_log_probs=rollout` (and verl's async trainers, which resolve
  to it), verl's old-log-prob pass under `recompute` (its rollout-vs-actor metrics) and verl's rollout correction;
- a KL penalty in the reward (`algorithm.use_kl_in_reward`): under verl's bypass mode the old log-probs it
  reads are these;
- under `algorithm.old_log_probs=update`, nothing trains on them: only the health check
  `actor/rollout_probs_diff_mean` (vLLM against the trained policy, plugin.py) and the run guard's entropy
  estimate (rl_factory/guard/checks/numerics.py) read them.

So our agent loop asks for them on every rollout where something trains on them or verl's own pass compares
against them (`recompute`: its metrics would read the placeholder below), and otherwise on the training steps 1,
1 + N, 1 + 2N, ... (N = `sampling_logprobs_every`, 10 by default; 1 = every step, as verl does with
`rollout.calculate_log_probs=true`); validation rollouts then go without. The checks run on those steps.
verl's own agent loops (`tool_agent`) keep verl's `calculate_log_probs`.

A trajectory generated without them holds NaN log-probs (the guard's estimate skips them); verl receives
`ABSENT` in `rollout_log_probs` instead, since verl copies that field into `old_log_probs` and a NaN there would
reach any masked sum. No log-prob is positive, so our loss reads a positive one as not asked for.
"""
from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rl_factory.config import ConfigError

KEY = "sampling_logprobs_every"
ABSENT = 1.0


def every(cfg: Any) -> int:
    """`sampling_logprobs_every` of a verl config (1 where it is missing); anything but an integer >= 1 is refused."""
    value = cfg.get(KEY, 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{KEY}={value!r}: expected an integer >= 1 (1: every step; configs/verl.yaml)")
    return value


def readers(cfg: DictConfig, mode: str) -> list[str]:
    """What reads vLLM's sampling log-probs on every step in the composed config, with `mode` the resolved
    old-log-probs mode."""
    found = [] if mode == "update" else [f"algorithm.old_log_probs resolves to {mode}"]
    corr = cfg.algorithm.get("rollout_correction") or {}
    found += [f"algorithm.rollout_correction.{k}" for k in ("rollout_is", "rollout_rs") if corr.get(k) is not None]
    if cfg.algorithm.get("use_kl_in_reward"):
        found.append("algorithm.use_kl_in_reward")
    return found


def apply(cfg: DictConfig, mode: str) -> str:
    """Resolve `sampling_logprobs_every` in `cfg` (1 where something reads the log-probs every step); a line for the
    log."""
    n = every(cfg)
    needed = readers(cfg, mode)
    if needed and n != 1:
        OmegaConf.update(cfg, KEY, 1, merge=False, force_add=True)
        return f"sampling log-probs: every step ({', '.join(needed)})"
    if n == 1:
        return "sampling log-probs: every step"
    return f"sampling log-probs: training steps 1, {1 + n}, {1 + 2 * n}, ... (only the health checks read them)"


def wanted(cfg: Any, step: int, validate: bool) -> bool:
    """Whether the rollouts of training step `step` (or validation) ask vLLM for the log-probs."""
    n = every(cfg)
    if n == 1:
        return True
    return not validate and (max(step, 1) - 1) % n == 0


def for_verl(logprobs: list[float]) -> list[float]:
    """A trajectory's log-probs as verl's `rollout_log_probs`: `ABSENT` where none was asked for."""
    return [ABSENT if math.isnan(lp) else lp for lp in logprobs]
