"""The doctor's checks, in the order they run. Each returns a one-line detail or raises CheckFailed.

A check reads what earlier ones left in `doctor.state` and adds what later ones need (`needs`
names the keys; a check whose keys are missing is skipped). Nothing here writes into the run
directory or loads model weights: the tools' logs go to temporary files and the tokenizer is all of
the model that is read (the built-in model's is built without training it).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from rl_factory.doctor import template

CHECKS: list[tuple[str, Any, tuple[str, ...]]] = []
PROMPT_ROWS = 256  # rows whose prompts are rendered to find the longest


class CheckFailed(Exception):
    def __init__(self, detail: str, fix: str = ""):
        super().__init__(detail)
        self.detail, self.fix = detail, fix


def check(name: str, needs: tuple[str, ...] = ()):
    def register(fn):
        CHECKS.append((name, fn, needs))
        return fn
    return register


@check("config")
async def config(doc) -> str:
    from rl_factory.algorithms.advantages import get_advantage
    from rl_factory.algorithms.losses import get_policy_loss
    from rl_factory.components import DataConfig, EnvConfig, RewardConfig, SamplingConfig
    from rl_factory.config import ConfigError, load_config, section, split_overrides
    from rl_factory.context import CONTEXT_PROCESSORS, get_context_policy
    from rl_factory.policy import ModelConfig
    from rl_factory.update import AlgorithmConfig
    from envs.parsers import PARSERS

    ours, theirs = split_overrides(doc.overrides) if doc.mode == "train" else (doc.overrides, [])
    try:
        cfg = load_config("grpo" if doc.mode == "train" else "eval", ours)
        backend = cfg.trainer.backend
        if theirs and backend != "verl":
            load_config("grpo", doc.overrides)  # names the unknown key
        s = doc.state
        s["model"], s["data"] = section(cfg, "model", ModelConfig), section(cfg, "data", DataConfig)
        s["env_cfg"], s["reward_cfg"] = section(cfg, "env", EnvConfig), section(cfg, "reward", RewardConfig)
        s["rollout"] = section(cfg, "rollout", SamplingConfig)
        alg = section(cfg, "algorithm", AlgorithmConfig)
        if doc.mode == "train":
            from rl_factory.trainer import TrainerConfig
            s["trainer"] = section(cfg, "trainer", TrainerConfig)
            get_advantage(alg.advantage), get_policy_loss(alg.policy_loss)
        else:
            from rl_factory.evaluate_cli import EvalConfig
            s["eval"] = section(cfg, "eval", EvalConfig)
        PARSERS.lookup(s["env_cfg"].parser), get_context_policy(s["rollout"].context)
        CONTEXT_PROCESSORS.lookup(s["rollout"].context_processor)
    except (ConfigError, KeyError, ValueError) as exc:
        raise CheckFailed(one_line(exc),
                          "fix the key it names (bash main_grpo.sh --cfg job prints the composed config)")
    s["cfg"] = cfg
    extra = f", {len(theirs)} key(s) passed to verl" if theirs else ""
    return f"composes ({len(doc.overrides)} override(s){extra}); backend {cfg.trainer.backend}"


@check("run directory", needs=("trainer",))
async def run_directory(doc) -> str:
    from rl_factory.config import ConfigError
    from rl_factory.run import RunDir

    t = doc.state["trainer"]
    if t.backend != "embedded":
        return f"{t.output_dir}: {t.backend} keeps its own checkpoints and resume state (not checked here)"
    run = RunDir(Path(t.output_dir))
    try:
        point = run.resume_point(doc.state["cfg"], t.resume, t.total_steps)  # reads only
    except ConfigError as exc:
        raise CheckFailed(str(exc))
    if run.finished_step is not None:
        return (f"{run.path}: the run already finished step {run.finished_step}; nothing to train unless "
                f"trainer.total_steps > {run.finished_step}")
    if point is not None:
        return f"resumes run {run.run_id} in {run.path} from {point.name}"
    return f"a new run in {run.path}"


@check("reward loads", needs=("reward_cfg",))
async def reward_loads(doc) -> str:
    from rewards.scorer import build_scorer

    try:
        reward = build_scorer(doc.state["reward_cfg"])
    except Exception as exc:
        raise CheckFailed(one_line(exc), "check reward.function / reward.functions: file.py:fn or package.module:fn")
    doc.state["reward"] = reward
    return f"{reward.name}: arguments {sorted({a for c in reward.components for a in c.fn.arg_names})}"


@check("data", needs=("data", "reward"))
async def data(doc) -> str:
    from rewards.loader import REWARD_ARGS
    from rl_factory.components import load_rows

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
    for key, rows in loaded.items():
        for component in doc.state["reward"].components:
            fn = component.fn
            needed = [a for a in fn.required if a not in REWARD_ARGS or a == "answer"]
            for i, row in enumerate(rows):
                absent = [a for a in needed if row.get(a) is None]
                if absent:
                    column = d.answer_key if absent[0] == "answer" else absent[0]
                    raise CheckFailed(
                        f"{key} row {i} has no {column!r} column, which reward {fn.name} needs (as `{absent[0]}`); "
                        f"row columns: {sorted(k for k in row if k != 'messages')[:8]}",
                        f"set data.answer_key to the answer column" if absent[0] == "answer" else
                        f"add {column!r} to every row, or give the reward a default for it")
    doc.state["rows"] = next(iter(loaded.values())) if doc.mode == "eval" else loaded["data.val_files"]
    doc.state["all_rows"] = [r for rows in loaded.values() for r in rows]
    return ", ".join(f"{key}: {len(rows)} rows" for key, rows in loaded.items()) + "; the reward's columns are present"


@check("tools", needs=("env_cfg",))
async def tools(doc) -> str:
    from rl_factory.components import open_env

    try:
        # no log_dir: nothing is written into a run directory; the first row (when the data loaded) lists the
        # tools of per-episode servers whose launch line names the sample
        env = open_env(doc.state["env_cfg"], probe_sample=(doc.state.get("all_rows") or [None])[0])
        await env.__aenter__()
        doc.state["env"] = env
        schemas = await env.list_tools()
    except Exception as exc:
        raise CheckFailed(one_line(exc), "run `.venv/bin/python -m envs list MANIFEST` to see the server's own error; "
                                      "its stderr log is named in the message")
    doc.state["tools"] = schemas
    if not doc.state["env_cfg"].tools:
        return "no tools (env.tools=null): single-turn"
    per_server = Counter(env.server_of(t["function"]["name"]) for t in schemas)
    listed = ", ".join(f"{server}: {n}" for server, n in per_server.items())
    return f"{len(schemas)} tool(s) listed ({listed})"


@check("reward scores a row", needs=("reward", "rows", "tools"))
async def reward_scores(doc) -> str:
    from rl_factory.types import Trajectory, Turn
    from rewards.scorer import score_trajectories

    row = doc.state["rows"][0]
    completion = "" if row.get("answer") is None else str(row["answer"])
    traj = Trajectory(sample_index=0, prompt_ids=[], token_ids=[], loss_mask=[], logprobs=[],
                      messages=[*row["messages"], {"role": "assistant", "content": completion}],
                      turns=[Turn([], [], completion)], stop_reason="answer", sample=row)
    env = doc.state.get("env")
    try:
        if env is not None:  # in the row's own episode, as in training (a reward's tools reach its servers)
            async with env.episode(row) as episode:
                await score_trajectories(doc.state["reward"], [traj], tools=episode)
        else:
            await score_trajectories(doc.state["reward"], [traj])
    except Exception as exc:
        raise CheckFailed(one_line(exc), "run the reward on this row by hand; reward.on_error=zero scores failures 0")
    return f"scored {traj.reward:.3f} on row 0 with its reference answer as the completion"


@check("chat template", needs=("model", "tools"))
async def chat_template(doc) -> str:
    from rl_factory.chat import ChatFormat

    tokenizer, where = _tokenizer(doc)
    try:
        doc.state["fmt"] = ChatFormat(tokenizer, doc.state["tools"])
    except ValueError as exc:
        raise CheckFailed(str(exc), "use a model (or tokenizer) whose chat template ends turns with its eos token")
    return f"{where}: eos {tokenizer.eos_token!r}"


@check("tool schemas fit", needs=("fmt", "all_rows", "rollout"))
async def tool_schemas(doc) -> str:
    prompts = [row["messages"] for row in doc.state["all_rows"][:PROMPT_ROWS]]
    budget, key = _prompt_budget(doc)
    return _finding(template.check_tools_render(doc.state["fmt"], doc.state["tools"], prompts, budget, key))


def _prompt_budget(doc) -> tuple[int, str]:
    """verl caps prompts at its data.max_prompt_length; the embedded trainer leaves a turn's room in the total."""
    if doc.mode == "train" and doc.state["cfg"].trainer.backend == "verl":
        from omegaconf import OmegaConf

        from rl_factory.config import CONFIG_DIR

        given = [o.split("=", 1)[1] for o in doc.overrides if o.lstrip("+").startswith("data.max_prompt_length=")]
        default = OmegaConf.load(CONFIG_DIR / "verl.yaml").data.max_prompt_length
        return int(given[-1]) if given else int(default), "data.max_prompt_length"
    r = doc.state["rollout"]
    return r.max_total_tokens - r.max_response_tokens, "rollout.max_total_tokens - rollout.max_response_tokens"


@check("parser round-trip", needs=("fmt", "env_cfg"))
async def parser_round_trip(doc) -> str:
    if not doc.state["tools"]:
        return "no tools: nothing to parse"
    return _finding(template.check_parser_round_trip(doc.state["fmt"], doc.state["tools"], doc.state["env_cfg"].parser))


@check("token stream", needs=("fmt", "rows", "rollout"))
async def token_stream(doc) -> str:
    r = doc.state["rollout"]
    messages = template.conversation(doc.state["tools"], doc.state["rows"][0]["messages"])
    return _finding(template.check_token_stream(doc.state["fmt"], messages, r.context,
                                                processor=r.context_processor, keep_turns=r.context_keep_turns))


def _tokenizer(doc):
    model, seed = doc.state["model"], int(doc.state["cfg"].seed)
    if model.path.startswith("builtin:"):
        from rl_factory.policy import BUILTIN_MODELS, BUILTIN_TOKENIZERS

        name = model.path.split(":", 1)[1]
        BUILTIN_MODELS.lookup(name)
        return BUILTIN_TOKENIZERS.lookup(name)(doc.state["tools"], seed), model.path
    from transformers import AutoTokenizer

    from rl_factory.hub import check_hub_model

    try:
        check_hub_model(model.path)
        return AutoTokenizer.from_pretrained(model.path), model.path
    except (OSError, ValueError) as exc:
        raise CheckFailed(one_line(exc), "point model.path at a model directory or a reachable hub id")


def _finding(finding: template.Finding) -> str:
    if not finding.ok:
        raise CheckFailed(finding.detail, finding.fix)
    return finding.detail


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (a KeyError's without the quotes its str adds)."""
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return " ".join(str(text).split())[:400]
