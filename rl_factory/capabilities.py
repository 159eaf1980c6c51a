"""What each backend can run: one table, every refusal raised from it, and the docs' table rendered from it.

The registries say which names exist (estimators, losses, filters, augmenters, context policies, ...);
`LIMITS` says which of them, alone or combined, a backend cannot train, and why. Each `Limit` names a
feature (a config key and its values), the backends that refuse it, the other settings under which it
is refused (none: always), the reason, and what to use instead. Every refusal in rl_factory is
`check(backend, facts)` against this table, so each reads the same way:

    rollout.context=step is not supported on the verl backend with algorithm.advantage=rloo: verl gives
    a session's per-turn samples the session's advantage only for grpo; use algorithm.advantage=grpo

`facts` maps config keys (and a few derived facts, such as "estimator inputs") to the values of this
run; a limit whose keys are missing from `facts` is not checked, so each call site passes what it knows
(the verl launcher adds the keys of verl's composed config). `rl_factory.capabilities_page.render_markdown()`
writes the same table for the docs (docs/reference/capabilities.md).

This module imports no backend: the verl side imports it.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rl_factory.base.errors import ConfigError

BACKENDS = ("embedded", "verl")
BOTH = BACKENDS
ANY = "*"  # a feature that is set at all: a non-empty list, a value that is not null
# Derived facts (not config keys); `facts()` computes them from the config.
INPUTS = "estimator inputs"  # the optional AdvantageInputs fields the estimator declares (its `requires`)
OPTIMIZER_STEPS = "optimizer steps per batch"  # epochs x mini-batches of one step's update
VIEW_WEIGHT = "view weight"  # of the augmenters' views: "1", or how they are not (a number, at run time)
INLINE_SAMPLE_REFS = "an inline manifest naming ${sample.*} or ${episode.*}"


class Unsupported(ConfigError):
    """A setting, or a combination of settings, that the chosen backend cannot train (`limit`, one of `LIMITS`)."""

    def __init__(self, message: str, limit: Limit | None = None):
        super().__init__(message)
        self.limit = limit


@dataclass(frozen=True)
class Ref:
    """Another fact's value, as one of a condition's values (min_groups other than data.train_batch_size)."""

    key: str

    def __str__(self) -> str:
        return self.key


@dataclass(frozen=True)
class When:
    """`key` has one of `values` (`negate`: none of them); a list-valued fact matches if any item does."""

    key: str
    values: tuple[Any, ...] = (ANY,)
    negate: bool = False

    def matching(self, facts: Mapping[str, Any]) -> Any:
        """The first value of the fact that matches, or `_NO` (also when the fact is unknown)."""
        if self.key not in facts:
            return _NO
        value = facts[self.key]
        values = tuple(facts.get(v.key, _NO) if isinstance(v, Ref) else v for v in self.values)
        if _NO in values:
            return _NO
        for item in value if isinstance(value, tuple) else (value,):
            if self.values == (ANY,):
                hit = item is not None
            else:
                hit = (item in values) != self.negate
            if hit:
                return item
        return _NO

    def text(self) -> str:
        if self.values == (ANY,):
            return f"{self.key} set"
        shown = " or ".join(_show(v) for v in self.values)
        return f"{self.key} other than {shown}" if self.negate else f"{self.key}={shown}"


_NO = object()


@dataclass(frozen=True)
class Limit:
    """`feature` is refused on `backends` when every condition of `when` holds (no conditions: always).

    `why` and `instead` may name facts in braces ("{data.train_batch_size}"): the refusal fills in the
    run's values, the docs show the key.
    """

    feature: When
    backends: tuple[str, ...]
    why: str
    instead: str
    when: tuple[When, ...] = ()

    def refusal(self, backend: str, facts: Mapping[str, Any]) -> str | None:
        """The one-line refusal for this run, or None when the limit does not apply."""
        if backend not in self.backends:
            return None
        value = self.feature.matching(facts)
        if value is _NO:
            return None
        hits = [(c.key, c.matching(facts)) for c in self.when]
        if any(v is _NO for _, v in hits):
            return None
        where = "any backend" if set(self.backends) == set(BACKENDS) else f"the {backend} backend"
        combined = "".join(f"{' with' if i == 0 else ' and'} {k}={_show(v)}" for i, (k, v) in enumerate(hits))
        return (f"{self.feature.key}={_show(value)} is not supported on {where}{combined}: "
                f"{_fill(self.why, facts)}; {_fill(self.instead, facts)}")


def _show(value: Any) -> str:
    """A value as the config spells it (true, false, null)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


_FACT = re.compile(r"(?<!\$)\{([\w.]+)\}")  # "{data.train_batch_size}", not "${sample.col}"


def _fill(text: str, facts: Mapping[str, Any] | None) -> str:
    """`text` with each {key} as key=value of this run (`facts`), or as the bare key (the docs: None)."""
    def one(match: re.Match) -> str:
        key = match.group(1)
        return f"{key}={_show(facts[key])}" if facts is not None and key in facts else key
    return _FACT.sub(one, text)


LIMITS: tuple[Limit, ...] = (
    # --- estimators and the critic -----------------------------------------------------------------------
    Limit(When("algorithm.advantage", ("gae",), negate=True), ("embedded",),
          "the embedded trainer computes per-token inputs (critic values, response mask, token rewards) for gae "
          "alone; other estimators get rewards and tournament scores",
          "register it with requires= among scores, or use algorithm.advantage=gae",
          when=(When(INPUTS, ("values", "response_mask", "token_rewards")),)),
    Limit(When("algorithm.advantage", ("gae",)), BOTH,
          "the critic values one token sequence per trajectory", "use rollout.context=append",
          when=(When("rollout.context", ("append",), negate=True),)),
    Limit(When("algorithm.critic.type", ("model",)), ("embedded",),
          "the embedded backend's critic is a linear value head on the policy's last hidden state, not a separate "
          "model", "use algorithm.critic.type=value_head (or auto)", when=(When("algorithm.advantage", ("gae",)),)),
    Limit(When("algorithm.critic.type", ("value_head",)), ("verl",),
          "verl trains a separate critic model (initialised from model.path), not a value head on the policy",
          "use algorithm.critic.type=model (or auto)", when=(When("algorithm.advantage", ("gae",)),)),
    Limit(When("algorithm.critic.vf_coef", (0.5,), negate=True), ("verl",),
          "verl's critic model trains with its own optimizer, so no value loss is added to the policy loss",
          "leave algorithm.critic.vf_coef at 0.5 and tune algorithm.critic.lr",
          when=(When("algorithm.advantage", ("gae",)),)),
    # --- context policies ----------------------------------------------------------------------------------
    Limit(When("rollout.context", ("step",)), ("verl",),
          "verl gives a session's per-turn samples the session's advantage only for grpo",
          "use algorithm.advantage=grpo", when=(When("algorithm.advantage", ("grpo",), negate=True),)),
    Limit(When("rollout.context", ("step",)), ("verl",),
          "only verl's V1 trainer takes several samples per trajectory", "set trainer.use_v1=true",
          when=(When("trainer.use_v1", (False,)),)),
    # --- ArenaRL -------------------------------------------------------------------------------------------
    Limit(When("algorithm.advantage", ("arena",)), ("verl",),
          "a prompt's n rollouts meet in one agent-loop worker only in verl's V1 trainer", "set trainer.use_v1=true",
          when=(When("trainer.use_v1", (False,)),)),
    Limit(When("algorithm.arena.anchor", ("greedy",)), ("verl",),
          "verl's agent loop samples the n rollouts of a prompt and no extra greedy one",
          "use algorithm.arena.anchor=first or reference", when=(When("algorithm.advantage", ("arena",)),)),
    # --- rewards and tools ---------------------------------------------------------------------------------
    Limit(When("reward.process.outcome_mode", ("sum",), negate=True), ("verl",),
          "verl's reward worker returns one score per trajectory, to which process rewards are added",
          "use reward.process.outcome_mode=sum", when=(When("reward.process", ("on",)),)),
    Limit(When("env.tools", (INLINE_SAMPLE_REFS,)), ("verl",),
          "verl resolves its whole config in each worker, where ${sample.col} would read as one of its keys",
          "put it in a file and set env.tools=path/to/tools.yaml"),
    # --- the rollout pipeline ------------------------------------------------------------------------------
    Limit(When("rollout.filters", ("zero_variance",)), BOTH,
          "it drops groups whose rewards are all equal, but gae's advantages are not zero there (the critic's "
          "values differ)", "remove it or use a group estimator", when=(When("algorithm.advantage", ("gae",)),)),
    Limit(When("rollout.augment"), BOTH,
          "views are cut from one token stream per trajectory", "use rollout.context=append",
          when=(When("rollout.context", ("append",), negate=True),)),
    Limit(When("rollout.augment"), BOTH,
          "a view weights its trajectory's one advantage, and gae's are per token", "use an outcome estimator",
          when=(When("algorithm.advantage", ("gae",)),)),
    Limit(When("rollout.filters"), ("verl",),
          "a prompt's n sessions meet in one agent-loop worker only in verl's V1 trainer", "set trainer.use_v1=true",
          when=(When("trainer.use_v1", (False,)),)),
    Limit(When("rollout.augment"), ("verl",),
          "a session's views are several samples, which only verl's V1 trainer takes", "set trainer.use_v1=true",
          when=(When("trainer.use_v1", (False,)),)),
    Limit(When("rollout.filters", ("zero_variance",), negate=True), ("verl",),
          "it can drop part of a group, which verl's grpo cannot leave out when a session has several outputs",
          "only zero_variance combines with them on verl", when=(When("rollout.augment"),)),
    Limit(When("rollout.filters", ("zero_variance",), negate=True), ("verl",),
          "it can drop part of a group, which verl's grpo cannot leave out when a session has several outputs",
          "only zero_variance combines with them on verl", when=(When("rollout.context", ("step",)),)),
    Limit(When("rollout.augment"), ("verl",),
          "verl gives a session's outputs the session's advantage only for grpo", "use algorithm.advantage=grpo",
          when=(When("algorithm.advantage", ("grpo",), negate=True),)),
    Limit(When(VIEW_WEIGHT, ("1",), negate=True), ("verl",),
          "verl has no per-sample weight (every view trains with its session's advantage)",
          "use tool_prefix with kwargs {normalize: false, decay: 1.0}, and user augmenters' views of weight 1",
          when=(When("rollout.augment"),)),
    Limit(When("rollout.dynamic_sampling.min_groups", (Ref("data.train_batch_size"),), negate=True), ("verl",),
          "verl's batch always holds {data.train_batch_size} groups", "set them equal"),
    Limit(When("rollout.dynamic_sampling.min_groups"), ("verl",),
          "verl's async trainers refill on their own", "set trainer.v1.trainer_mode=sync or use verl's "
          "algorithm.filter_groups", when=(When("trainer.v1.trainer_mode", ("sync",), negate=True),)),
    Limit(When("rollout.dynamic_sampling.min_groups"), ("verl",),
          "dynamic sampling on verl installs its own trainer.v1.sampler.custom_sampler",
          "leave trainer.v1.sampler.custom_sampler.path unset",
          when=(When("trainer.v1.sampler.custom_sampler.path", (None,), negate=True),)),
    # --- old log-probs -------------------------------------------------------------------------------------
    Limit(When("algorithm.old_log_probs", ("recompute",)), ("embedded",),
          "the embedded backend samples with the weights it trains, so its rollout log-probs already are the "
          "policy's", "use auto, rollout or update"),
    Limit(When("algorithm.old_log_probs", ("update", "rollout")), ("verl",),
          "verl's legacy trainer replaces our policy loss in bypass mode", "set trainer.use_v1=true or use "
          "recompute", when=(When("trainer.use_v1", (False,)),)),
    Limit(When("algorithm.old_log_probs", ("update", "rollout")), ("verl",),
          "it skips the log-prob pass verl's rollout correction needs", "use recompute",
          when=(When("algorithm.rollout_correction", (None,), negate=True),)),
    Limit(When("algorithm.old_log_probs", ("update",)), BOTH,
          "the update's own log-probs are the sampling policy's only for one optimizer step per batch "
          "(optim.ppo_epochs=1, optim.mini_batches=1)", "set those, or use algorithm.old_log_probs=auto",
          when=(When(OPTIMIZER_STEPS, (1,), negate=True),)),
    Limit(When("algorithm.old_log_probs", ("update", "rollout")), ("verl",),
          "verl's bypass mode off, given on the command line, is recompute", "set only one of them",
          when=(When("algorithm.rollout_correction.bypass_mode", (False,)),)),
    Limit(When("algorithm.old_log_probs", ("update", "recompute")), ("verl",),
          "verl's bypass mode on, given on the command line, is rollout", "set only one of them",
          when=(When("algorithm.rollout_correction.bypass_mode", (True,)),)),
    # --- asynchronous training and off-policy correction ---------------------------------------------------
    Limit(When("algorithm.correction.type", ("tis", "mis")), ("embedded",),
          "its weights pi_old / pi_behaviour need pi_old, which the embedded update has (its own log-probs "
          "before the step) only for one optimizer step per batch", "set optim.ppo_epochs=1 and optim.mini_batches=1",
          when=(When(OPTIMIZER_STEPS, (1,), negate=True),)),
    # (on verl the same combination is refused by the rollout-correction limit above: the correction is verl's)
    Limit(When("algorithm.correction.type", ("tis", "mis")), ("embedded",),
          "the correction weights pi_old / pi_behaviour need pi_old, and rollout takes the PPO ratio against the "
          "behaviour policy itself", "use algorithm.old_log_probs=auto", when=(When("algorithm.old_log_probs", ("rollout",)),)),
    Limit(When("algorithm.old_log_probs", ("update",)), BOTH,
          "samples from older policies would train as if the current one had sampled them (a ratio of 1, "
          "nothing corrected)", "use algorithm.old_log_probs=auto (the PPO ratio against the behaviour policy) "
          "or an algorithm.correction", when=(When("trainer.max_staleness", (0,), negate=True),
                                               When("algorithm.correction.type", ("none",)))),
    Limit(When("trainer.partial_rollouts", (False,)), ("verl",),
          "verl's async trainers abort running requests at each weight update and resume them under the new "
          "weights (partial rollouts always)", "use trainer.partial_rollouts=true",
          when=(When("trainer.max_staleness", (0,), negate=True),)),
    Limit(When("trainer.max_staleness", (0,), negate=True), ("verl",),
          "only verl's V1 trainer has asynchronous modes", "set trainer.use_v1=true",
          when=(When("trainer.use_v1", (False,)),)),
)


def check(backend: str, facts: Mapping[str, Any]) -> None:
    """Raise `Unsupported` (one line) for the first limit of `LIMITS` that this run's `facts` hit on `backend`."""
    if backend not in BACKENDS:
        raise ConfigError(f"trainer.backend: unknown backend {backend!r} (valid: {', '.join(BACKENDS)})")
    for limit in LIMITS:
        message = limit.refusal(backend, facts)
        if message is not None:
            raise Unsupported(message, limit)


def facts(alg: Any = None, roll: Any = None, *, optim: Any = None, reward: Any = None, env: Any = None,
          data: Any = None, trainer: Any = None) -> dict[str, Any]:
    """The facts `LIMITS` reads, from config sections (dataclasses or DictConfig slices; None: unknown)."""
    out: dict[str, Any] = {}
    if alg is not None:
        from rl_factory.algorithms.advantages import REQUIRED_INPUTS

        # a name only verl registers (one of its own estimators) declares nothing here
        out.update({"algorithm.advantage": alg.advantage, INPUTS: REQUIRED_INPUTS.get(alg.advantage, ()),
                    "algorithm.critic.type": alg.critic.type, "algorithm.critic.vf_coef": float(alg.critic.vf_coef),
                    "algorithm.arena.anchor": alg.arena.anchor, "algorithm.old_log_probs": alg.old_log_probs})
        correction = alg.get("correction") if isinstance(alg, Mapping) else getattr(alg, "correction", None)
        if correction is not None:  # a DictConfig slice of an older run may lack it
            out["algorithm.correction.type"] = correction.type
    if roll is not None:
        out.update(pipeline_facts(roll.context, roll.filters, roll.augment, roll.dynamic_sampling.min_groups))
    if optim is not None:
        out[OPTIMIZER_STEPS] = int(optim.ppo_epochs) * int(optim.mini_batches)
    if reward is not None:
        process = reward.process
        out["reward.process"] = "on" if process.function or process.tool_error_penalty else "off"
        out["reward.process.outcome_mode"] = process.outcome_mode
    if env is not None:
        out["env.tools"] = INLINE_SAMPLE_REFS if _names_sample(env.tools) else "a path or a plain manifest"
    if data is not None:
        out["data.train_batch_size"] = int(data.train_batch_size)
    if trainer is not None:
        out["trainer.max_staleness"] = int(trainer.max_staleness)
        out["trainer.partial_rollouts"] = bool(trainer.partial_rollouts)
    return out


def pipeline_facts(context: str, filters: Any, augment: Any, min_groups: int | None = None) -> dict[str, Any]:
    """The rollout pipeline's facts: filter and augmenter names (user functions as their entry's name)."""
    from rl_factory.pipeline.augment import build_augmenters
    from rl_factory.pipeline.filters import build_filters

    names = tuple(f.name if f.builtin is not None else f"{f.name} (user)" for f in build_filters(_plain(filters)))
    built = build_augmenters(_plain(augment))
    weighted = [a for a in built if a.name == "tool_prefix"
                and (a.kwargs.get("normalize", True) or a.kwargs.get("decay", 1.0) != 1.0)]
    out = {"rollout.context": context, "rollout.filters": names, "rollout.augment": tuple(a.name for a in built),
           VIEW_WEIGHT: "normalized or decayed (tool_prefix)" if weighted else "1"}
    if min_groups is not None:
        out["rollout.dynamic_sampling.min_groups"] = int(min_groups)
    return out


def _plain(value: Any, resolve: bool = True) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    return OmegaConf.to_container(value, resolve=resolve) if isinstance(value, (DictConfig, ListConfig)) else value


def _names_sample(tools: Any) -> bool:
    """An inline manifest (a mapping) that names ${sample.*} or ${episode.*} (left unresolved: verl would
    resolve them)."""
    tools = _plain(tools, resolve=False)
    return isinstance(tools, dict) and re.search(r"\$\{(sample|episode)\.", str(tools)) is not None
