"""The verl backend: our agent loop, estimators, losses and reward inside verl's trainer (Ray + FSDP + vLLM).

Nothing outside this package imports verl or ray. The pieces and how each reaches verl's processes:

- `plugin`      the `verl.plugins` entry point: registers our advantage estimators and policy losses in
                verl's registries in *every* process that imports verl (driver, TaskRunner, FSDP
                workers), because verl's registries are per-process dicts.
- `agent_loop`  `RLFactoryAgentLoop`, named in `agent_loop.yaml`, which verl loads by path in each
                AgentLoopWorker (`actor_rollout_ref.rollout.agent.agent_loop_config_path`); it drives
                our rollout code, MCP tool env and parsers against verl's vLLM/SGLang servers.
- `group`       ArenaRL on verl: all n rollouts of a prompt meet in their AgentLoopWorker and play the
                tournament there (see the module docstring for why there).
- `reward`      `compute_score`, verl's `reward.custom_reward_function`, which rebuilds our trajectory
                from the agent loop's extra fields and calls the user's reward.
- `config`      composes verl's `ppo_trainer` config with ours (`configs/verl.yaml`) and maps our keys.
- `data`        converts our JSONL/Parquet rows to the Parquet layout verl's RLHFDataset reads.
- `launcher`    `bash main_grpo.sh trainer.backend=verl ...`: compose, convert, run verl's trainer.
- `runner`      our TaskRunner in front of verl's: wraps the trainer class in its process (`startup`, `fetch`).
- `startup`     where a launch's time goes before its first step: `<output_dir>/startup.json`.
"""
