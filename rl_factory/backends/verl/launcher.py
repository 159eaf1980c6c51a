"""`bash main_grpo.sh trainer.backend=verl ...`: compose verl's config from ours, then run verl's trainer.

Steps, in the order a user sees their errors: our plugin must be in verl's registries (else the
estimator names would fail deep inside a Ray actor); the combination must be one verl can run (the
capability table, supported.py); the run directory must be this run's (`RunDir.claim`, the embedded
trainer's check and message: a directory written under another config is refused, `trainer.resume=never`
moves to a fresh sibling); the verl config is composed and checked as verl would check it, on the driver
and later in its workers (validate.py: `--cfg job` and `--doctor` run the same checks; `--cfg job` prints
the config after them, before any file is written or Ray starts); only then is anything written: our data in
verl's Parquet layout in `<output_dir>/verl_data/`, and after the GPU and install checks `config.yaml` and
`run.json`; then `verl.trainer.main_ppo.run_ppo` with verl's `TaskRunnerV1` (ours in front of it:
runner.py, with fetch.py and trained.py) starts Ray (or joins the cluster named by RAY_ADDRESS) and trains. Each of
these steps, and verl's own until the first step's metrics line, is marked in `<output_dir>/startup.json` (startup.py).

Our config is parsed once here (`rl_factory.config.parse`) and the steps get its slices. Paths in it are
made absolute: Ray workers do not share the driver's working directory, and on several nodes the output
directory, data and manifest must be on storage every node sees. verl's workers receive our config as
plain data under `rl_factory` in verl's config (and the reward's slices as `reward_kwargs`) and parse it
with the same function, once per process (agent_loop.WorkerState, reward._scorer_for, run_dir.RunDirLogger).
"""
from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig

from rl_factory.backends.verl import startup
from rl_factory.backends.verl.validate import check_verl_config
from rl_factory.config import ConfigError, RunConfig, check_training, parse, printable, redacted, worker_config
from rl_factory.guard.syncs import set_aside_earlier

log = logging.getLogger("rl_factory.verl")

PLUGIN_MODULE = "rl_factory.backends.verl.plugin"


def check_plugin(advantage: str, policy_loss: str) -> None:
    """Our names must be in verl's registries of this process, and reach verl's Ray workers.

    The workers get them only through the `verl.plugins` entry point, which exists only when the project
    is installed as a package: a checkout on PYTHONPATH imports here but registers nothing in the workers
    (seen on a GPU node: "rl_factory is not supported" from verl's logger in the TaskRunner, after 4 minutes).
    """
    from importlib.metadata import entry_points

    from verl.trainer.ppo import core_algos

    from rl_factory.backends.verl import plugin

    if not any(ep.value == PLUGIN_MODULE for ep in entry_points(group="verl.plugins")):
        raise ConfigError("rl_factory is importable but not installed as a package, so verl's Ray workers will not "
                          "load its verl.plugins entry point (estimators, losses, metrics logger): install it with "
                          "`bash setup.sh --verl` or `pip install -e .` in this environment")

    if plugin.REGISTRATION_ERROR:
        raise ConfigError(f"rl_factory's verl plugin failed to register:\n{plugin.REGISTRATION_ERROR}")
    from rl_factory.algorithms.advantages import ADVANTAGES, required_inputs

    if advantage in ADVANTAGES and advantage not in core_algos.ADV_ESTIMATOR_REGISTRY and not plugin.verl_fills(advantage):
        raise ConfigError(f"algorithm.advantage: {advantage!r} requires {list(required_inputs(advantage))}, which verl's "
                          f"estimator call cannot give (it gives rewards, group ids and {', '.join(plugin.VERL_INPUTS)})")
    if advantage not in core_algos.ADV_ESTIMATOR_REGISTRY:
        raise ConfigError(f"algorithm.advantage: {advantage!r} is not in verl's estimator registry "
                          f"(known: {sorted(core_algos.ADV_ESTIMATOR_REGISTRY)}); is rl_factory installed with "
                          "`bash setup.sh --verl` (or --verl-cpu) so that its verl.plugins entry point exists?")
    if policy_loss not in core_algos.POLICY_LOSS_REGISTRY:
        raise ConfigError(f"algorithm.policy_loss: {policy_loss!r} is not in verl's policy-loss registry "
                          f"(known: {sorted(core_algos.POLICY_LOSS_REGISTRY)})")


def absolute(run: RunConfig) -> RunConfig:
    """Our config with the paths the workers read made absolute."""
    reward = run.reward
    values: dict[str, Any] = {"trainer.output_dir": str(Path(run.trainer.output_dir).resolve()),
                              "reward.function": _absolute_spec(reward.function),
                              "reward.process.function": _absolute_spec(reward.process.function)}
    if isinstance(run.env.tools, str) and run.env.tools:
        values["env.tools"] = str(Path(run.env.tools).resolve())
    if reward.functions:
        values["reward.functions"] = [{**item, "function": _absolute_spec(item.get("function"))}
                                      for item in reward.functions]
    return run.with_values(values)


def _absolute_spec(spec: str | None) -> str | None:
    """"file.py:fn" with an absolute file path (a reward worker may run anywhere); modules stay."""
    if not spec or ":" not in spec or not spec.split(":")[0].endswith(".py"):
        return spec
    path, name = spec.rsplit(":", 1)
    return f"{Path(path).resolve()}:{name}"


def model_path(ours: RunConfig, build: bool) -> str:
    """The model directory or hub id; `builtin:` models are built (once, cached) only when `build`."""
    path = ours.model.path
    if not path.startswith("builtin:") or not build:
        return path
    from rl_factory.components import load_rows, open_env
    from rl_factory.policy import resolve_model_path

    async def tools() -> list[dict]:
        # the first training row lists the tools of per-episode servers whose launch line names the sample
        probe = load_rows(ours.data.train_files, ours.data, limit=1)[0]
        async with open_env(ours.env, probe_sample=probe) as env:
            return await env.list_tools()

    return resolve_model_path(path, asyncio.run(tools()), int(ours.seed), log=log.info)


def train(ours: RunConfig | DictConfig, raw_overrides: list[str] = (), print_only: str | None = None) -> dict[str, Any]:
    """Run (or with `print_only` = "job" / "resolve", check and print) the verl training job for our config (a
    composed one is parsed here, once)."""
    clock = startup.launcher_clock()
    _import_verl()
    clock.mark("verl_imported")
    ours = ours if isinstance(ours, RunConfig) else parse(ours)
    check_plugin(ours.algorithm.advantage, ours.algorithm.policy_loss)
    check_training(ours)  # the table with our keys, before a builtin model is built; with verl's after composing
    run_dir = None
    if print_only is None:  # the run directory is this run's, or the run stops here (reads only)
        run_dir = claim_run_dir(ours, list(raw_overrides))
        ours = _with_output_dir(ours, run_dir.path)
    cfg = compose(ours, raw_overrides, build_model=print_only is None)
    if print_only is not None:
        check_verl_config(cfg)  # what verl would refuse, on the driver or minutes later in a worker
        print(printable(cfg, resolve=print_only == "resolve"))
        return {}
    return run(cfg, run_dir, clock)


def checked_config(ours: RunConfig, raw_overrides: list[str] = ()) -> DictConfig:
    """verl's config for ours with every check `train` makes of it before the run directory: `--doctor`'s
    config check. Builds no model (a `builtin:` one stays a name) and starts no Ray."""
    _import_verl()
    check_plugin(ours.algorithm.advantage, ours.algorithm.policy_loss)
    cfg = compose(ours, raw_overrides, build_model=False)
    check_verl_config(cfg)
    return cfg


def compose(ours: RunConfig, raw_overrides: list[str], build_model: bool) -> DictConfig:
    """verl's config for ours (its paths made absolute), with the pipeline's keys checked (pipeline.py)."""
    from rl_factory.backends.verl.config import compose_verl
    from rl_factory.backends.verl.pipeline import check_verl_pipeline

    ours = absolute(ours)
    out_dir = Path(ours.trainer.output_dir)
    files = {split: str(out_dir / "verl_data" / f"{split}.parquet") for split in ("train", "val")}
    cfg = compose_verl(ours, list(raw_overrides), files, model_path(ours, build=build_model))
    check_verl_pipeline(ours, cfg)  # the pipeline's keys, and the capability table with verl's keys (supported.py)
    return cfg


def _import_verl() -> None:
    import importlib

    try:
        importlib.import_module("verl")  # importing verl runs our verl.plugins entry point
    except ImportError as exc:
        raise ConfigError(f"trainer.backend=verl needs verl: bash setup.sh --verl on GPU nodes (pip install -e "
                          f"'.[verl]'), --verl-cpu elsewhere ({exc})") from None


def claim_run_dir(ours: RunConfig | DictConfig, raw_overrides: list[str]) -> Any:
    """`trainer.output_dir` checked as the embedded trainer checks it (rl_factory/run.py `RunDir.claim`): the
    config's fingerprint is ours plus the raw verl keys given; verl resumes from its own checkpoints."""
    from rl_factory.run import RunDir

    ours = ours if isinstance(ours, RunConfig) else parse(ours)
    run_dir = RunDir(Path(ours.trainer.output_dir))
    view = redacted(ours.composed)
    if raw_overrides:
        view["verl_overrides"] = list(raw_overrides)
    run_dir.claim(view, ours.trainer.resume)
    return run_dir


def _with_output_dir(ours: RunConfig, path: Path) -> RunConfig:
    if Path(ours.trainer.output_dir) == path:
        return ours
    return ours.with_values({"trainer.output_dir": str(path)})


def write_data(ours: RunConfig | DictConfig, out_dir: Path) -> None:
    """Our data in verl's Parquet layout, `<output_dir>/verl_data/`, each row's reward columns checked."""
    from rl_factory.backends.verl.data import convert
    from rewards.scorer import build_scorer

    ours = ours if isinstance(ours, RunConfig) else parse(ours)
    scorer = build_scorer(ours.reward)  # what the reward workers will load
    try:
        convert(ours.data, out_dir / "verl_data", reward=scorer)
    finally:
        scorer.close()


def check_gpus(cfg: DictConfig) -> None:
    """verl has no CPU platform and would wait forever for GPUs it cannot get: say so up front.

    With RAY_ADDRESS set the job goes to a running Ray cluster, whose GPUs this machine cannot see.
    """
    if os.environ.get("RAY_ADDRESS"):
        return
    import torch

    wanted, found = cfg.trainer.n_gpus_per_node, torch.cuda.device_count()
    if cfg.trainer.nnodes > 1:
        raise ConfigError(f"trainer.nnodes={cfg.trainer.nnodes}: start Ray on every node and set RAY_ADDRESS "
                          "to the head node (README: Scaling out)")
    if found < wanted:
        raise ConfigError(f"trainer.n_gpus_per_node={wanted} but this machine has {found} CUDA device(s); the verl "
                          "backend trains on GPUs only (use trainer.backend=embedded on CPU)")


def check_rollout_engine(cfg: DictConfig) -> None:
    """verl imports its rollout engine only inside a Ray worker, minutes in: check it is installed here first."""
    import importlib.util

    name = cfg.actor_rollout_ref.rollout.name
    if importlib.util.find_spec(name) is None:
        raise ConfigError(f"actor_rollout_ref.rollout.name={name} but {name} is not installed: on GPU nodes install the "
                          "verl backend with `bash setup.sh --verl` (pip install -e '.[verl]': verl with vLLM)")


def warn_bytecode() -> None:
    """One line where verl's processes would compile their imports from source at every launch (bytecode.py)."""
    from rl_factory.backends.verl import bytecode

    line = bytecode.finding(bytecode.survey())
    if line:
        log.warning(line)


_WARMING: list = []  # the background inspection's process, held so that it is not collected while it runs


def warm_vllm(cfg: DictConfig, out_dir: Path) -> None:
    """vLLM's model-info cache filled in the background while Ray and the actor start (vllm_model_info.py)."""
    if cfg.actor_rollout_ref.rollout.name != "vllm":
        return
    from rl_factory.backends.verl import vllm_model_info

    process = vllm_model_info.start(cfg.actor_rollout_ref.model.path, out_dir)
    if process is not None:
        _WARMING.append(process)


def check_trl() -> None:
    """verl's FSDP workers import trl's AutoModelForCausalLMWithValueHead whenever trl is importable
    (verl/models/transformers/monkey_patch.py, from trl.experimental.ppo or trl); trl 1.16 has it in neither
    place, and the actor dies at start-up (H200, 2026-12-02, with `.[bench]` installed beside `.[verl]`)."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        return
    for module in ("trl.experimental.ppo", "trl"):
        try:
            if hasattr(importlib.import_module(module), "AutoModelForCausalLMWithValueHead"):
                return
        except ImportError:
            continue
    from importlib.metadata import version

    raise ConfigError(f"trl {version('trl')} is installed beside verl, whose FSDP workers import trl's "
                      "AutoModelForCausalLMWithValueHead, which this trl no longer has: the actor would fail at "
                      "start-up. Remove trl from this environment (pip uninstall trl); only benchmarks/vs_trl.py "
                      "needs it, from another environment")


def task_runner_class(cfg: DictConfig, verls: Any) -> Any:
    """Our TaskRunner in front of verl's (runner.py): it marks start-up; with `worker_fetch: needed` its trainer
    fetches only what the workers read (fetch.py), with the run guard's tokens check on it hands the guard the
    batch the actor trains (trained.py), and with `actor_cache_at_sync: keep` its actor keeps its CUDA cache
    across the weight sync (actor_cache.py)."""
    from rl_factory.backends.verl import actor_cache, fetch, runner, trained

    return runner.task_runner(verls, narrow_fetch=fetch.mode(cfg) == "needed", guard_batch=trained.wanted(cfg),
                              keep_cache=actor_cache.mode(cfg) == "keep")


def guard_stop(exc: BaseException):
    """The run guard's `GuardStop` inside an exception from verl's TaskRunner (Ray re-raises it as a
    `RayTaskError` subclass of it, or chains it), else None."""
    from rl_factory.guard import GuardStop

    chain: list[BaseException] = []
    while exc is not None and all(exc is not e for e in chain):
        chain.append(exc)
        exc = getattr(exc, "cause", None) or exc.__cause__
    stops = [e for e in chain if isinstance(e, GuardStop)]
    if not stops:
        return None
    text = str(stops[-1])  # the innermost: the guard's own line, not Ray's wrapper
    return GuardStop(text[text.find("guard:"):] if "guard:" in text else text)


def run(cfg: DictConfig, run_dir: Any = None, clock: startup.Clock | None = None) -> dict[str, Any]:
    """verl's checks (check_verl_config), then the first writes (data, config.yaml, `run_dir`'s run.json),
    then its trainer (mirrors verl.trainer.main_ppo.main)."""
    from verl.utils.device import auto_set_device

    clock = clock or startup.launcher_clock()
    auto_set_device(cfg)
    check_verl_config(cfg)  # validate_config and what verl's workers would refuse (validate.py)
    clock.mark("config_checked")
    out_dir = Path(cfg.rl_factory.trainer.output_dir)
    write_data(cfg.rl_factory, out_dir)
    clock.mark("data_written")
    check_gpus(cfg)
    check_rollout_engine(cfg)
    check_trl()
    warn_bytecode()
    warm_vllm(cfg, out_dir)
    (out_dir / "config.yaml").write_text(yaml.safe_dump(redacted(cfg), sort_keys=False))
    set_aside_earlier(out_dir)  # this launch's engines count their weight syncs from 1 (guard/syncs.py)
    if run_dir is not None:
        run_dir.record()  # run.json: whose directory this is, for the next run's claim
    log.info("verl backend: run directory %s", out_dir)
    try:
        start(cfg, clock)
    except Exception as exc:  # the run guard stopped the TaskRunner: its line, exit code 3 (not a traceback)
        stop = guard_stop(exc)
        if stop is None:
            raise
        raise stop from None
    from rl_factory.run import RunDir

    RunDir(out_dir).write_report(bool(cfg.rl_factory.trainer.report))  # the final one, from the finished files
    return {"output_dir": str(out_dir)}


def start(cfg: DictConfig, clock: startup.Clock) -> None:
    """verl's run_ppo with our TaskRunner, which gets the launcher's start-up marks (startup.StampedRunner)."""
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo

    clock.path = Path(cfg.rl_factory.trainer.output_dir) / startup.FILE
    runner = startup.StampedRunner(task_runner_class(cfg, TaskRunnerV1), clock)
    clock.mark("run_ppo_called")
    run_ppo(worker_config(cfg), task_runner_class=runner)  # its TaskRunner prints the config
