"""The doctor's checks of the setup (config, run directory, reward, data, environment, tools), in the order
they run; rl_factory.doctor.model_checks holds those of the model's chat template and token stream, which
run after them. Each returns a one-line detail or raises CheckFailed.

A check reads what earlier ones left in `doctor.state` and adds what later ones need (`needs`
names the keys, `gives` the ones it adds; a check whose keys are missing is skipped, and its row names
the checks that give them). Nothing here writes into the run
directory or loads model weights: the tools' logs go to temporary files and the tokenizer is all of
the model that is read (the built-in model's is built without training it).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from rl_factory.doctor.registry import CheckFailed, check, one_line

PROMPT_ROWS = 256  # rows whose prompts are rendered to find the longest


@check("config", gives=("model", "data", "env_cfg", "reward_cfg", "rollout", "trainer", "eval", "cfg"))
async def config(doc) -> str:
    from rl_factory.algorithms.advantages import get_advantage
    from rl_factory.algorithms.losses import get_policy_loss
    from rl_factory.config import ConfigError, check_training, load_config, parse, split_overrides
    from rl_factory.context import CONTEXT_PROCESSORS, get_context_policy
    from envs.parsers import PARSERS

    ours, theirs = split_overrides(doc.overrides) if doc.mode == "train" else (doc.overrides, [])
    verl = ""
    try:
        cfg = load_config("grpo" if doc.mode == "train" else "eval", ours)
        backend = cfg.trainer.backend
        if theirs and backend != "verl":
            load_config("grpo", doc.overrides)  # names the unknown key
        s = doc.state
        if doc.mode == "eval":
            from rl_factory.evaluate_cli import model_path
            model_path(cfg)  # null: the last checkpoint of the run this config trains
        run = parse(cfg)  # once: the checks below get its slices
        s["model"], s["data"], s["env_cfg"], s["reward_cfg"] = run.model, run.data, run.env, run.reward
        s["rollout"] = run.rollout
        if doc.mode == "train":
            s["trainer"] = run.trainer
            get_advantage(run.algorithm.advantage), get_policy_loss(run.algorithm.policy_loss)
            check_training(run)  # as the run would: names, pipeline, the capability table for its backend
            if backend == "verl":  # verl's own checks of the config it composes (backends/verl/validate.py)
                verl = f"; {_verl_checks(run, theirs)}"
        else:
            s["eval"] = run.eval
        PARSERS.lookup(s["env_cfg"].parser), get_context_policy(s["rollout"].context)
        CONTEXT_PROCESSORS.lookup(s["rollout"].context_processor)
    except (ConfigError, KeyError, ValueError) as exc:
        raise CheckFailed(one_line(exc),
                          "fix the key it names (bash main_grpo.sh --cfg job prints the composed config)")
    s["cfg"] = run
    extra = f", {len(theirs)} key(s) passed to verl" if theirs else ""
    return f"composes ({len(doc.overrides)} override(s){extra}); backend {run.trainer.backend}{verl}"


def _verl_checks(run, raw_overrides: list[str]) -> str:
    """verl's config composed and checked as `--cfg job` and the launcher check it (a `builtin:` model is not
    built, Ray not started); this machine's GPUs only warned about: the doctor may run on a login node."""
    from rl_factory.backends.verl.launcher import check_gpus, checked_config
    from rl_factory.config import ConfigError

    cfg = checked_config(run, raw_overrides)
    try:
        check_gpus(cfg)
        gpus = ""
    except ConfigError as exc:
        gpus = f"; warning: a run started here would stop: {exc}"
    from rl_factory.backends.verl import bytecode

    slow = bytecode.finding(bytecode.survey())
    return ("verl validated its config (validate_config, its workers' dataclasses and assertions, unknown keys)"
            + gpus + (f"; warning: {slow}" if slow else ""))


@check("run directory", needs=("trainer",))
async def run_directory(doc) -> str:
    from rl_factory.config import ConfigError
    from rl_factory.run import RunDir

    t = doc.state["trainer"]
    if t.backend != "embedded":
        return f"{t.output_dir}: {t.backend} keeps its own checkpoints and resume state (not checked here)"
    run = RunDir(Path(t.output_dir))
    try:
        point = run.resume_point(doc.state["cfg"].composed, t.resume, t.total_steps)  # reads only
    except ConfigError as exc:
        raise CheckFailed(str(exc))
    if run.finished_step is not None:
        return (f"{run.path}: the run already finished step {run.finished_step}; nothing to train unless "
                f"trainer.total_steps > {run.finished_step}")
    if point is not None:
        return f"resumes run {run.run_id} in {run.path} from {point.name}"
    return f"a new run in {run.path}"


@check("reward loads", needs=("reward_cfg",), gives=("reward",))
async def reward_loads(doc) -> str:
    from rewards.scorer import build_scorer

    try:
        reward = build_scorer(doc.state["reward_cfg"])
    except Exception as exc:
        raise CheckFailed(one_line(exc), "check reward.function / reward.functions: file.py:fn or package.module:fn")
    doc.state["reward"] = reward
    verl = [f"{c.fn.name} has verl's signature (solution_str = the {c.fn.verl.solution_str})"
            for c in reward.components if c.fn.verl is not None]
    return (f"{reward.name}: arguments {sorted({a for c in reward.components for a in c.fn.arg_names})}"
            + "".join(f"; {v}" for v in verl))


@check("data", needs=("data", "reward"), gives=("rows", "all_rows", "first_rows"))
async def data(doc) -> str:
    from rl_factory.components import ANSWER_ARGS, MissingColumn, check_reward_columns, load_rows

    d = doc.state["data"]
    sets = ({"data.train_files": (d.train_files, None), "data.val_files": (d.val_files, d.val_limit)}
            if doc.mode == "train" else {"eval.files": (doc.state["eval"].files, doc.state["eval"].limit)})
    loaded = {}
    for key, (files, limit) in sets.items():
        try:
            loaded[key] = load_rows(files, d, limit=limit)
        except Exception as exc:
            raise CheckFailed(f"{key}: {one_line(exc)}", f"fix {key} or the row it names")
        if not loaded[key]:
            raise CheckFailed(f"{key}: no rows in {files}")
    try:
        check_reward_columns(doc.state["reward"], loaded, d.answer_key)
    except MissingColumn as exc:
        fix = (f"give every row a value in column {exc.column!r}, or drop the rows without one" if exc.have else
               "set data.answer_key to the answer column (a dotted path such as reward_model.ground_truth reads "
               "a nested one)" if exc.arg in ANSWER_ARGS else
               f"add {exc.column!r} to every row, or give the reward a default for it")
        raise CheckFailed(str(exc), fix)
    doc.state["rows"] = next(iter(loaded.values())) if doc.mode == "eval" else loaded["data.val_files"]
    doc.state["all_rows"] = [r for rows in loaded.values() for r in rows]
    doc.state["first_rows"] = next(iter(loaded))  # which file all_rows[0] is row 0 of
    return (", ".join(f"{key}: {len(rows)} rows" for key, rows in loaded.items()) + "; "
            + _answer_source(loaded, d.answer_key) + "; the reward's columns are present")


def _answer_source(loaded: dict[str, Any], answer_key: str) -> str:
    """Which column became the rewards' `answer`, in words: answer from 'reward_model.ground_truth' (verl's layout)."""
    from rl_factory.data import VERL_ANSWER_PATH

    paths = Counter()
    for rows in loaded.values():
        paths.update(getattr(rows, "answer_paths", {}))
    found = [p for p in paths if p is not None]
    if not found:
        return f"no row has an answer ({answer_key!r}): rewards see answer=None"
    words = [f"{p!r}" + (" (verl's layout)" if p == VERL_ANSWER_PATH else "") for p in found]
    missing = f", none in {paths[None]} row(s)" if paths[None] else ""
    return f"answer from {' and '.join(words)}{missing}"


@check("environment", needs=("env_cfg",), gives=("environment", "env_opening"))
async def environment(doc) -> str | None:
    """With `env.environment`: the class loads with its hooks `async def`, and one instance's `reset` of the
    first data row returns messages (rendered with the prompt by "tool schemas fit"). No row without one."""
    from envs.environment import EnvironmentLoadError, load_environment
    from envs.episode import EpisodeError
    from rl_factory.rollout import environment_reset

    cfg = doc.state["env_cfg"]
    if not cfg.environment:
        doc.state["environment"] = None
        return None
    fix = "env.environment names file.py:Class (or pkg.module:Class) with async reset(sample), step(trajectory), close()"
    try:
        factory = load_environment(cfg.environment, cfg.environment_kwargs)
    except EnvironmentLoadError as exc:
        raise CheckFailed(one_line(exc), fix)
    rows = doc.state.get("all_rows")
    if not rows:
        doc.state["environment"] = factory
        return f"{factory.spec}: hooks reset, step, close are async; reset not run (no data row loaded)"
    where = f"{doc.state['first_rows']} row 0"
    try:
        world = factory()
    except Exception as exc:
        raise CheckFailed(f"{factory.spec}(**env.environment_kwargs) raised {type(exc).__name__}: {one_line(exc)}",
                          "fix the constructor or env.environment_kwargs")
    try:
        opening = await environment_reset(world, rows[0])
    except EpisodeError as exc:
        raise CheckFailed(f"on {where}: {one_line(exc)}", "reset(sample) returns a list of {'role', 'content'} "
                                                          "messages ([] when the dataset prompt says it all)")
    finally:
        try:
            await world.close()
        except Exception:  # noqa: BLE001 - reported by the run itself; reset is what is checked here
            pass
    doc.state["environment"], doc.state["env_opening"] = factory, opening  # later checks play it
    state = getattr(world, "state", None)
    kept = (f"state keys {sorted(state)[:8]}" if isinstance(state, dict) else
            "no `state` dict (the reward's `state` is {})")
    roles = f" ({', '.join(m['role'] for m in opening[:4])})" if opening else ""
    return (f"{factory.spec}: hooks reset, step, close are async; reset({where}) returned {len(opening)} "
            f"message(s){roles} after the prompt; {kept}")


@check("tools", needs=("env_cfg",), gives=("env", "tools"))
async def tools(doc) -> str:
    from dataclasses import replace

    from rl_factory.components import open_env

    try:
        # no log_dir: nothing is written into a run directory; the first row (when the data loaded) lists the
        # tools of per-episode servers whose launch line names the sample. The environment was loaded (and
        # reported) by its own check.
        env = open_env(replace(doc.state["env_cfg"], environment=None),
                       probe_sample=(doc.state.get("all_rows") or [None])[0])
        env.environment = doc.state.get("environment")  # None also when it failed: the tools are checked anyway
        await env.__aenter__()
        doc.state["env"] = env
        schemas = await env.list_tools()
    except Exception as exc:
        # A server that did not start: its error's first line, then its stderr's last lines as they are
        first, *quoted = str(exc).split("\n")
        raise CheckFailed("\n".join([" ".join(first.split()), *quoted]),
                          "the server's last stderr lines and its log file are above; try the server alone with "
                          "`.venv/bin/python -m envs list MANIFEST`")
    doc.state["tools"] = schemas
    cfg = doc.state["env_cfg"]
    if not schemas:
        source = "env.tools=null" if not cfg.tools else "env.tools lists none"
        if cfg.environment:
            return (f"no tools ({source}): env.environment {cfg.environment} drives the turns (up to "
                    f"env.max_turns={cfg.max_turns})")
        return f"no tools ({source}): single-turn"
    per_server = Counter(env.server_of(t["function"]["name"]) for t in schemas)
    listed = ", ".join(f"{server}: {n}" for server, n in per_server.items())
    spoken = f"; env.environment {cfg.environment} may answer after every turn" if cfg.environment else ""
    warnings = "".join(f"; warning: {w}" for w in shared_file_warnings(env, (doc.state.get("all_rows") or [None])[0]))
    return f"{len(schemas)} tool(s) listed ({listed}){spoken}{warnings}"


def shared_file_warnings(env, row: dict | None) -> list[str]:
    """A `scope: episode` launch line that hands the server a sample's existing file, not a copy of it: every
    trajectory of that sample opens the same file, and a server that writes it changes the dataset."""
    import os

    from envs.templates import LAUNCH_FIELDS, refs

    found = []
    for server in getattr(env, "_episode_servers", []) if row else []:
        copied = {ref for _, ref in refs(server.spec.files)}
        for key in LAUNCH_FIELDS:
            for kind, ref in refs(getattr(server.spec, key)):
                value = _column(row, ref) if kind == "sample" and ref not in copied else None
                if isinstance(value, str) and os.path.isfile(value):
                    found.append(f"mcpServers.{server.name}.{key} names ${{sample.{ref}}}, an existing file ({value}): "
                                 "every trajectory of a sample gets that same file (a server that writes it changes "
                                 "the dataset's); give each episode a copy: files: {data: \"${sample." + ref + "}\"} "
                                 "and ${episode.dir}/data in the launch line")
    return found


def _column(row: dict, name: str):
    node = row
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


@check("reward scores a row", needs=("reward", "rows", "tools", "environment"))
async def reward_scores(doc) -> str:
    """The reference answer as the completion, scored in the row's own episode. With an environment, that
    answer is played as a one-turn episode (reset, the answer as the assistant's turn, step), so a reward
    that reads `state` sees what the environment made of it; the row says how the episode ended. A reward
    that reads the episode through `tools` sees it before any call: the row says that score is not the task's."""
    from envs.episode import EpisodeError
    from rl_factory.base.types import Trajectory, Turn
    from rewards.scorer import score_trajectories

    row = doc.state["rows"][0]
    completion = "" if row.get("answer") is None else str(row["answer"])
    traj = Trajectory(sample_index=0, prompt_ids=[], token_ids=[], loss_mask=[], logprobs=[],
                      messages=[*row["messages"]], turns=[Turn([], [], completion)], stop_reason="answer", sample=row)
    env, played = doc.state.get("env"), ""
    try:
        if env is not None:  # in the row's own episode, as in training (a reward's tools reach its servers)
            async with env.episode(row) as episode:
                if episode.environment is not None:
                    played = await _play_one_turn(episode, traj, completion)
                else:
                    traj.messages.append({"role": "assistant", "content": completion})
                await score_trajectories(doc.state["reward"], [traj], tools=episode)
        else:
            traj.messages.append({"role": "assistant", "content": completion})
            await score_trajectories(doc.state["reward"], [traj])
    except EpisodeError as exc:
        raise CheckFailed(f"playing row 0's reference answer as one turn: {one_line(exc)}",
                          "an environment's step must take any text the model writes: run it on this row by hand")
    except Exception as exc:
        raise CheckFailed(one_line(exc), "run the reward on this row by hand; reward.on_error=zero scores failures 0")
    scored = f"scored {traj.reward:.3f} on row 0"
    if played:
        return f"{scored}: {played}"
    given = (f"its reference answer {_short(completion)} as the completion" if row.get("answer") is not None
             else f"an empty completion: no row has {doc.state['data'].answer_key!r}")
    if any("tools" in c.fn.arg_names for c in doc.state["reward"].components) and doc.state["tools"]:
        return (f"{scored} in its own episode before any tool call ({given}): the reward reads the episode "
                "through `tools`, so what the agent's calls leave there is scored at rollout")
    return f"{scored} with {given}"


async def _play_one_turn(episode, traj, completion: str) -> str:
    """As a rollout with env.max_turns=1 would: reset, the completion as the one assistant turn, step;
    the trajectory gets the environment's state. Returns what was played, in words, for the row."""
    from rl_factory.rollout import environment_reset, environment_step

    world = episode.environment
    traj.messages += await environment_reset(world, traj.sample)
    traj.messages.append({"role": "assistant", "content": completion})
    spoken, done = await environment_step(world, traj)
    traj.stop_reason = "env_done" if done else "answer" if not spoken else "max_turns"
    traj.state = dict(episode.state)
    ended = ("the environment ended the episode (env_done)" if done else
             "the environment answered and went on: the reward read the state of an unfinished episode; whole "
             "episodes are scored at rollout" if spoken else "the environment neither answered nor ended it")
    return f"its reference answer {_short(completion)} played as the one turn of an episode (reset, step): {ended}"


def _short(text: str) -> str:
    return repr(text if len(text) <= 20 else text[:17] + "...")
