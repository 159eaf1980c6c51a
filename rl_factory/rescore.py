"""Re-score stored rollouts with another reward, without generating anything.

    python -m rl_factory.rescore outputs/calculator_grpo reward.function=my_reward.py:reward
    python -m rl_factory.rescore outputs/calculator_grpo 'reward.functions=[...]' --split val
    python -m rl_factory.rescore <eval dir> reward.function=...          # main_eval.sh's rollouts.jsonl

The run's own `config.yaml` is the base (its data, tools, reward settings); `key=value` overrides
change it, as on the training command line. Each stored trajectory is rebuilt from its record (messages,
each turn's decoded text, tool calls and results, stop reason) with its full dataset row, reloaded
from the run's data files by its index (the record's `answer`/`id`/`data_source` where the file is
gone), scored by the new reward, and written next to its old reward in `rescore/rescore.csv`
(split, step, sample, id, old, new, difference, completion). A summary per split and step goes
to `rescore/summary.json` and the console. A reward that names `tools` gets the run's manifest (not a
manifest with `scope: episode` servers: the episodes' state is gone); `state` is the stored one.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import json
import logging
import statistics
import sys
from pathlib import Path
from typing import Any

from rl_factory import interrupt
from rl_factory.jsonl import WRITE_ERRORS
from rl_factory.base.types import ToolCall, ToolResult, Trajectory, Turn

log = logging.getLogger("rl_factory")
RESCORE_SLICES = ("reward", "data", "env", "eval")  # of the run's config.yaml


def load_config(run_dir: Path, overrides: list[str]):
    """The run's config.yaml with `overrides` applied; an unknown key is an error naming it."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from rl_factory.base import secrets
    from rl_factory.config import ConfigError

    path = run_dir / "config.yaml"
    if not path.exists():
        raise ConfigError(f"{run_dir}: no config.yaml (not a run directory, or not written yet)")
    cfg = OmegaConf.load(path)
    OmegaConf.set_struct(cfg, True)
    try:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([o.lstrip("+") for o in overrides if not o.startswith("+")]),
                              OmegaConf.from_dotlist([o[1:] for o in overrides if o.startswith("+")]))
    except OmegaConfBaseException as exc:
        raise ConfigError(" ".join(str(exc).split("\n")[0].split())) from None
    # As the training CLI does: secret `${oc.env:VAR}` values (the run's redacted config.yaml keeps such
    # references) are shown as the reference in any line printed from here on.
    secrets.note_config_secrets(OmegaConf.to_container(cfg, resolve=False))
    return cfg


def rebuild(record: dict[str, Any], sample: dict[str, Any]) -> Trajectory:
    """A scored-again-able Trajectory from a rollout record (no token ids: rewards read text)."""
    messages = record.get("messages") or []
    calls = list(record.get("tool_calls") or [])
    results = list(record.get("tool_results") or [])
    texts = list(record.get("turn_texts") or [])
    # The rollout's turns are the last `num_turns` assistant messages (earlier ones belong to the prompt).
    assistant = [k for k, m in enumerate(messages) if m.get("role") == "assistant"]
    own = assistant[len(assistant) - int(record.get("num_turns") or len(assistant)):]
    turns, ci, ri = [], 0, 0
    for k in own:
        m = messages[k]
        n_calls = len(m.get("tool_calls") or [])
        turn_calls = [ToolCall(c.get("name") or "", c.get("arguments"), error=c.get("error"))
                      for c in calls[ci: ci + n_calls]]
        ci += n_calls
        n_results = 0
        while k + 1 + n_results < len(messages) and messages[k + 1 + n_results].get("role") == "tool":
            n_results += 1
        turn_results = [ToolResult(ToolCall(r.get("name") or "", None), r.get("text") or "", r.get("error_kind"),
                                   latency_s=r.get("latency_s") or 0.0) for r in results[ri: ri + n_results]]
        ri += n_results
        text = texts[len(turns)] if len(turns) < len(texts) else (m.get("content") or "")
        turns.append(Turn([], [], text, tool_calls=turn_calls, tool_results=turn_results))
    return Trajectory(sample_index=record.get("sample_index") or 0, prompt_ids=[], token_ids=[], loss_mask=[],
                      logprobs=[], messages=messages, turns=turns, stop_reason=record.get("stop_reason") or "answer",
                      sample=sample, reward=record.get("reward"), state=dict(record.get("state") or {}))


def rescore(run_dir: str | Path, overrides: list[str], split: str = "all", out: str | Path | None = None) -> dict:
    """Re-score the run's stored rollouts; returns the summary (also written to `<out>/summary.json`)."""
    return interrupt.run(_rescore(Path(run_dir), overrides, split, Path(out) if out else Path(run_dir) / "rescore"))


async def _rescore(run_dir: Path, overrides: list[str], split: str, out: Path) -> dict:
    from rl_factory.components import open_env
    from rl_factory.config import parse
    from rl_factory.report.data import load_run, read_jsonl
    from rewards.scorer import build_scorer
    from rewards.scorer import score_trajectories

    stored = load_config(run_dir, overrides)
    # Only the slices rescoring reads: the rest of a stored config may be another version's.
    cfg = parse({key: stored[key] for key in RESCORE_SLICES if key in stored})
    reward = build_scorer(cfg.reward)  # a bad reward fails before any reading
    data_cfg, env_cfg = cfg.data, cfg.env
    files = [f for f in load_run(run_dir).rollout_files if split in ("all", f[0])]
    if not files:
        raise FileNotFoundError(f"{run_dir}: no stored rollouts for split {split!r}")
    datasets = _datasets(data_cfg, cfg.eval.files if "eval" in stored else None)
    items = [(s, step, rec) for s, step, path in files for rec in read_jsonl(path)]
    trajs = [rebuild(rec, _sample(datasets.get(s), rec)) for s, step, rec in items]
    old = [t.reward for t in trajs]
    wants_tools = any(c.fn.wants("tools") and not c.fn.takes_any for c in reward.components)
    tools = open_env(env_cfg) if wants_tools else contextlib.nullcontext()
    if wants_tools and tools._episode_servers:
        from rl_factory.config import ConfigError
        raise ConfigError(f"the reward calls tools, and {tools._episode_servers[0].label} has scope: episode: the "
                          "episodes these rollouts ran in are closed, so their servers' state cannot be read again; "
                          "rescore with a reward that reads the stored trajectory (and `state`) only")
    async with tools as env:
        await score_trajectories(reward, trajs, tools=env)
    return _write(out, items, trajs, old, reward.name)


def _datasets(data_cfg, eval_files: Any = None) -> dict[str, list[dict] | None]:
    """The rows each split was drawn from (None where the files cannot be read any more); `eval_files`:
    a main_eval.sh directory's eval.files."""
    from rl_factory.components import load_rows

    sources = {"train": data_cfg.train_files, "val": data_cfg.val_files}
    if eval_files is not None:
        sources["eval"] = eval_files
    rows: dict[str, list[dict] | None] = {}
    for name, files in sources.items():
        try:
            rows[name] = load_rows(files, data_cfg) if files else None
        except Exception as exc:  # moved or deleted data: fall back to the records' own fields
            log.warning("%s rows not reloaded (%s); rewards see only answer, id and data_source", name, exc)
            rows[name] = None
    return rows


def _sample(rows: list[dict] | None, record: dict) -> dict:
    index = record.get("sample_index")
    if rows is not None and isinstance(index, int) and 0 <= index < len(rows):
        return rows[index]
    return {k: record.get(k) for k in ("answer", "id", "data_source")}


def _write(out: Path, items: list, trajs: list[Trajectory], old: list, reward_name: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "rescore.csv").open("w", newline="", encoding="utf-8", errors=WRITE_ERRORS) as f:  # model text
        writer = csv.writer(f)
        writer.writerow(["split", "step", "sample", "id", "old_reward", "new_reward", "difference", "completion"])
        for (split, step, rec), traj, before in zip(items, trajs, old):
            diff = None if before is None else round(traj.reward - before, 6)
            writer.writerow([split, step, traj.sample_index, rec.get("id"), before, round(traj.reward, 6), diff,
                             traj.completion[:200].replace("\n", " ")])
    groups: dict[tuple[str, int], list[tuple[float | None, float]]] = {}
    for (split, step, _), traj, before in zip(items, trajs, old):
        groups.setdefault((split, step), []).append((before, traj.reward))
    per_step = [{"split": s, "step": st, "trajectories": len(v), "old_mean": _mean([a for a, _ in v]),
                 "new_mean": _mean([b for _, b in v])}
                for (s, st), v in sorted(groups.items(), key=lambda g: (g[0][1], g[0][0]))]
    pairs = [(a, t.reward) for a, t in zip(old, trajs) if a is not None]
    summary = {"reward": reward_name, "trajectories": len(trajs), "old_mean": _mean(old),
               "new_mean": _mean([t.reward for t in trajs]),
               "changed": sum(abs(a - b) > 1e-9 for a, b in pairs), "correlation": _corr(pairs),
               "per_step": per_step, "table": str(out / "rescore.csv")}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _corr(pairs: list[tuple[float, float]]) -> float | None:
    if len(pairs) < 2:
        return None
    try:
        return statistics.correlation([a for a, _ in pairs], [b for _, b in pairs])
    except statistics.StatisticsError:  # a constant side
        return None


def main(argv: list[str] | None = None) -> int:
    from rl_factory.cli import USER_ERRORS, print_user_error
    from rl_factory.run import setup_logging

    parser = argparse.ArgumentParser(prog="python -m rl_factory.rescore", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a run directory, or a main_eval.sh output directory")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. reward.function=my_reward.py:reward")
    parser.add_argument("--split", choices=["all", "train", "val", "eval"], default="all")
    parser.add_argument("--out", help="output directory (default: RUN_DIR/rescore)")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        summary = rescore(args.run_dir, args.overrides, args.split, args.out)
    except USER_ERRORS as exc:
        return print_user_error(exc)
    _print(summary)
    return 0


def _print(summary: dict) -> None:
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    print(f"re-scored {summary['trajectories']} trajectories with {summary['reward']}: mean reward "
          f"{fmt(summary['old_mean'])} (stored) -> {fmt(summary['new_mean'])} (new); {summary['changed']} changed; "
          f"correlation {fmt(summary['correlation'])}")
    print(f"{'split':<6} {'step':>6} {'n':>5} {'stored':>8} {'new':>8}")
    for row in summary["per_step"]:
        print(f"{row['split']:<6} {row['step']:>6} {row['trajectories']:>5} {fmt(row['old_mean']):>8} "
              f"{fmt(row['new_mean']):>8}")
    print(f"side-by-side table: {summary['table']}")


if __name__ == "__main__":
    sys.exit(main())
