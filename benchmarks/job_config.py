"""What a verl job's composed config (the run's config.yaml, loaded as a dict) says: gpu_step.py and the scripts
built on it read the settings the job ran with from there, not from the command that launched it."""
from __future__ import annotations


def select(cfg: dict, key: str, default=None):
    """`cfg["a"]["b"]` for key "a.b" in a loaded YAML config, or `default` where the path stops."""
    node = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def sampling_logprobs(cfg: dict, agent_loop: str, steps: list[int]) -> bool:
    """Whether the rollouts of every step in `steps` asked vLLM for log-probs: verl's own loops always do
    (calculate_log_probs), ours on steps 1, 1+N, ... unless something trains on them
    (rl_factory/backends/verl/sampling_logprobs.py, which resolved N into the composed config)."""
    every = int(select(cfg, "sampling_logprobs_every", 1) or 1)
    return agent_loop != "rl_factory" or every == 1 or all((step - 1) % every == 0 for step in steps)


def old_log_probs_mode(cfg: dict) -> str:
    """What the composed verl config (config.yaml) does for old log-probs: update | rollout | recompute."""
    if not select(cfg, "algorithm.rollout_correction.bypass_mode", False):
        return "recompute"
    mode = select(cfg, "ray_kwargs.ray_init.runtime_env.env_vars.RL_FACTORY_OLD_LOG_PROBS")
    return "update" if mode == "update" else "rollout"
