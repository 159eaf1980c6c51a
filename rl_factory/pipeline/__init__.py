"""The rollout pipeline: generation -> filters -> augmenters -> advantages (DESIGN §10).

Between the rollouts and the update, as in ArenaRL/qqr's rollout module and DAPO's dynamic sampling:

- filters (`filters.py`, `rollout.filters`) drop trajectories or whole groups that should not train:
  truncated, crashed by a tool, malformed, duplicated, or in a group whose rewards are all equal;
- dynamic sampling (`rollouts.py`, `rollout.dynamic_sampling`) draws more prompts until enough groups
  survive, so a step does not pay for a generation whose update would do nothing;
- augmenters (`augment.py`, `rollout.augment`) turn one kept trajectory into several token-faithful
  training samples (per turn, per tool-result prefix, or a user's views).

How a group stays consistent when a trajectory is dropped: a dropped trajectory is treated as never
sampled. The group passed to the estimator holds only its survivors, so every group statistic is
the survivors' own, and no estimator needs to know that a filter ran:
- `grpo`: mean and unbiased std over the k survivors; k = 1 gives 0 (no baseline).
- `dr_grpo`: the survivors' mean.
- `rloo`: r_i minus the mean of the k - 1 *other survivors*, = k / (k - 1) * (r_i - their mean): k, not n.
- `reinforce_pp`: centred on the survivors' mean, then whitened over the batch's kept trajectories only.
- `arena`: the tournament is played among the survivors only (fewer judge calls, ranks and quantiles
  over k), then z-scored within them; `zero_variance` then reads the tournament's scores.
- `gae`: no group statistic; a dropped trajectory leaves the batch, and whitening runs over the kept
  tokens. `zero_variance` is refused (equal rewards do not make gae's advantages 0).
Dropped trajectories still count in the step's `reward/*`, `accuracy`, `tool/*` and
`rollout/generated_tokens` (what the policy did, and what it cost) and are written to the rollouts
file with `dropped_by`; they get no advantage and no update.
"""
from rl_factory.pipeline.augment import AUGMENTERS, TurnSpan, View, augment, build_augmenters, register_augmenter
from rl_factory.pipeline.entries import PipelineError
from rl_factory.pipeline.filters import FILTERS, build_filters, register_filter
from rl_factory.pipeline.rollouts import Batch, DynamicSamplingConfig, PipelineConfig, RolloutPipeline, check_pipeline

__all__ = ["AUGMENTERS", "FILTERS", "Batch", "DynamicSamplingConfig", "PipelineConfig", "PipelineError",
           "RolloutPipeline", "TurnSpan", "View", "augment", "build_augmenters", "build_filters", "check_pipeline",
           "register_augmenter", "register_filter"]
